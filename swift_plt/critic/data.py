"""Critic training data: row format, validation (before step 1), and the token <-> value alignment.

Row format (jsonl; ms-swift's usual ``messages`` plus one of the target fields):

    {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}], "reward": 1.0}
    {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": {"token_ids": [19, 17, 2]}}],
     "add_eos": false, "returns": [0.9, 0.95, 1.0], "old_values": [0.7, 0.8, 0.6]}

* The **response** is what ms-swift trains on: the tokens whose label is not -100 after the template has encoded
  the row (the assistant turn(s), including end-of-turn/EOS tokens the template appends).
* ``"reward": r`` (a number): the return of every response token is r.
* ``"returns": [R_1, ..., R_n]``: one return per response token, in order; n must equal the number of response
  tokens. To control the tokens exactly (RL rollouts), give the assistant content as token ids,
  ``{"token_ids": [...]}``, and ``"add_eos": false`` (ms-swift then appends nothing after them), so n = the number
  of ids. (A bare list of ints works in ``template.encode`` but not through ms-swift's jsonl loader.)
* ``"old_values": [...]`` (only with ``--value_clip_range``, and then required): the critic's values of the
  response tokens when the rollout was made, same length as the response; used by the PPO clipped value loss.

Alignment (verl's): the critic outputs one value per position; the value at position t is the value of the state
after token t and is trained towards the return of token t+1. So the value of response token j (at position p_j)
is read at position p_j - 1; with a response of length R at the end of a sequence of S tokens these are
``values[:, -R - 1:-1]`` of the [B, S] output, i.e. ``values[:, -R:]`` of ``values(output)`` ([B, S-1]).
The first token of every document is never a response token (ms-swift labels it -100), so with packed documents
no value is trained across a document boundary.
"""
import math
from typing import Any, Callable, Dict, List, Optional

import torch

from swift_plt.patch_level import IGNORE_INDEX

TARGET_KEYS = ('returns', 'reward', 'old_values')  # row fields consumed here
TOKEN_KEYS = ('returns', 'old_values')  # token-aligned float lists carried next to input_ids/labels


class CriticDataError(ValueError):
    """A critic training row that cannot be trained on (raised when the dataset is encoded, before step 1)."""


def _describe(encoded: Dict[str, Any]) -> str:
    ids = list(encoded.get('input_ids') or [])
    head = ids[:12]
    return f'row with {len(ids)} tokens (input_ids {head}{" ..." if len(ids) > 12 else ""})'


def _floats(name: str, value, n: int, where: str) -> List[float]:
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
        raise CriticDataError(f'critic data: "{name}" must be a list of numbers (one per response token), got '
                              f'{type(value).__name__} in the {where}.')
    if len(value) != n:
        raise CriticDataError(
            f'critic data: "{name}" has {len(value)} values but the response has {n} tokens in the {where}. The '
            'response is what ms-swift trains on (labels != -100 after the template, including the end-of-turn/EOS '
            'tokens it appends). Give one value per response token: e.g. the assistant content as token ids, '
            '{"token_ids": [...]}, with "add_eos": false, so that the response is exactly those ids; or use "reward" '
            '(one number for every response token).')
    out = [float(x) for x in value]
    if not all(math.isfinite(x) for x in out):
        raise CriticDataError(f'critic data: "{name}" contains NaN/inf in the {where}.')
    return out


def encode_targets(encoded: Dict[str, Any], row: Dict[str, Any], clipped: bool) -> Dict[str, Any]:
    """Add token-aligned ``returns`` (and ``old_values`` when ``clipped``) to an encoded row, in place.

    ``encoded`` is the template's output (``input_ids``, ``labels``); ``row`` holds the row's extra fields
    (``TARGET_KEYS``). Entry i of each list belongs to token i (0.0 where token i is not a response token).
    Raises ``CriticDataError`` (what is wrong, what to do) on a row that cannot be trained on.
    """
    labels = encoded.get('labels')
    where = _describe(encoded)
    if labels is None or len(labels) != len(encoded['input_ids']):
        raise CriticDataError(f'critic data: the template produced no labels for the {where}; the critic needs '
                              'them to find the response tokens.')
    positions = [i for i, y in enumerate(labels) if y != IGNORE_INDEX]
    n = len(positions)
    if n == 0:
        raise CriticDataError(f'critic data: no response tokens in the {where} (every label is -100): the row needs '
                              'an assistant turn.')
    if positions[0] == 0:  # ms-swift always ignores token 0; the alignment (value at t-1) relies on it
        raise CriticDataError(f'critic data: token 0 is a response token in the {where}; nothing predicts it.')
    returns, reward = row.get('returns'), row.get('reward')
    if returns is None and reward is None:
        raise CriticDataError(f'critic data: the {where} has neither "returns" (one number per response token) nor '
                              '"reward" (one number for all of them); the critic has no target. Add one of them.')
    if returns is not None and reward is not None:
        raise CriticDataError(f'critic data: the {where} has both "returns" and "reward"; give only one.')
    if returns is None:
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise CriticDataError(f'critic data: "reward" must be a finite number, got {reward!r} in the {where}.')
        returns = [float(reward)] * n
    else:
        returns = _floats('returns', returns, n, where)
    old_values = row.get('old_values')
    if clipped and old_values is None:
        raise CriticDataError(f'critic data: --value_clip_range needs "old_values" (one per response token) in every '
                              f'row; the {where} has none. Add them, or drop --value_clip_range for the plain MSE '
                              'value loss.')
    if not clipped and old_values is not None:
        raise CriticDataError(f'critic data: the {where} has "old_values", which only the PPO clipped value loss '
                              'uses; pass --value_clip_range (e.g. 0.2), or drop "old_values".')
    encoded['returns'] = _scatter(returns, positions, len(labels))
    if clipped:
        encoded['old_values'] = _scatter(_floats('old_values', old_values, n, where), positions, len(labels))
    return encoded


def _scatter(values: List[float], positions: List[int], length: int) -> List[float]:
    out = [0.0] * length
    for p, v in zip(positions, values):
        out[p] = v
    return out


def collate_token_lists(rows: List[Optional[List[float]]],
                        length: int,
                        padding_free: bool,
                        row_length: Optional[Callable[[int], int]] = None) -> torch.Tensor:
    """Token-aligned float lists of a micro-batch -> the tensor laid out like the collator's ``input_ids``:
    ``[B, length]`` right-padded with 0 (padded batches), or ``[1, length]`` of the rows concatenated in order then
    padded with 0 (padding-free / THD, ms-swift's ``packing_row`` order). ``row_length(n)``: the length the collator
    pads a row of n tokens to before packing (ms-swift's ``Template._get_megatron_cp_length``: a multiple of
    2 x context-parallel size under CP, n otherwise); each row is padded with 0 to it, so the rows stay aligned with
    their tokens in the packed sequence."""
    if padding_free:
        flat = [x for r in rows for x in list(r) + [0.0] * ((row_length(len(r)) if row_length else len(r)) - len(r))]
        if len(flat) > length:
            raise ValueError(f'critic collate: {len(flat)} tokens do not fit the packed length {length}')
        return torch.tensor([flat + [0.0] * (length - len(flat))], dtype=torch.float32)
    out = torch.zeros(len(rows), length, dtype=torch.float32)
    for i, r in enumerate(rows):
        if len(r) > length:
            raise ValueError(f'critic collate: row {i} has {len(r)} tokens, more than the batch length {length}')
        out[i, :len(r)] = torch.tensor(r, dtype=torch.float32)
    return out


def to_value_positions(x: torch.Tensor) -> torch.Tensor:
    """Token-aligned ``[..., S]`` -> value-aligned ``[..., S]``: out[..., t] = x[..., t + 1], 0 at the last position
    (a shift, not a roll: nothing wraps around)."""
    out = torch.zeros_like(x)
    out[..., :-1] = x[..., 1:]
    return out


def value_targets(labels: torch.Tensor,
                  returns: torch.Tensor,
                  old_values: Optional[torch.Tensor] = None) -> Dict[str, Optional[torch.Tensor]]:
    """Token-aligned (unshifted) ``labels``/``returns``/``old_values`` of a batch -> value-aligned ``value_mask``,
    ``returns``, ``old_values`` (all ``[B, S]``; the last position is masked)."""
    mask = to_value_positions((labels != IGNORE_INDEX).float()) > 0
    return {
        'value_mask': mask,
        'returns': to_value_positions(returns.float()),
        'old_values': None if old_values is None else to_value_positions(old_values.float()),
    }
