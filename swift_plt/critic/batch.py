"""The caller's batch for ``MegatronCritic`` (swift_plt.critic.engine): value alignment, left alignment, checks.

Kept apart from the engine so the batch layout (pure torch, no megatron) is testable and readable on its own.
"""
from typing import Dict, Optional

import torch


def response_to_values(x: torch.Tensor, seq_len: int) -> torch.Tensor:
    """[B, R] tensor of the last R tokens (the response) -> [B, seq_len - 1] value-aligned, 0 elsewhere."""
    out = x.new_zeros(x.shape[0], seq_len - 1)
    out[:, seq_len - 1 - x.shape[1]:] = x
    return out


def default_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """``cumsum(attention_mask) - 1`` (verl's positions): 0..n-1 over each row's tokens."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


TOKEN_KEYS = ('input_ids', 'attention_mask', 'position_ids')  # [B, S]
VALUE_KEYS = ('returns', 'value_mask', 'old_values')  # value-aligned [B, S-1]


def _shift_rows(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """out[b, t] = x[b, (t + shift[b]) % S] (a per-row rotation)."""
    S = x.shape[1]
    idx = (torch.arange(S, device=x.device)[None] + shift.to(x.device)[:, None]) % S
    return torch.gather(x, 1, idx)


def _pad_one(x):  # value-aligned [B, S-1] -> [B, S] (a 0 at the end), to rotate like the tokens
    return torch.cat([x, x.new_zeros(x.shape[0], 1)], 1)


def left_align(batch: Dict[str, torch.Tensor]):
    """Rotate every row so that its tokens (``attention_mask`` 1: one contiguous span per row, e.g. a left-padded
    prompt + a right-padded response) start at position 0 and all padding is at the right; returns
    ``(aligned batch, start)`` (``start[b]``: where row b's tokens began).

    Why: with right padding only, the causal mask alone is exact for every real token, so the model runs with
    megatron's causal mask and no padding mask. That is the same on every attention backend: Transformer Engine's
    fused / flash attention applies the causal mask and would ignore an explicit [B, 1, S, S] padding mask
    (mcore-bridge consumes a bool mask only under ``attn_mask_type=arbitrary``), so left padding would otherwise let
    real tokens attend to padding on GPU. Value-aligned tensors move with their tokens; a ``value_mask`` set where
    the token or the next token is padding is an error (no value of a real state predicts it)."""
    ids = batch['input_ids']
    B, S = ids.shape
    am = batch.get('attention_mask')
    am = torch.ones_like(ids) if am is None else am
    real = am.bool()
    count = real.sum(1)
    start = torch.where(count > 0, real.float().argmax(1), torch.zeros_like(count))
    pos = torch.arange(S, device=ids.device)[None]
    span = (pos >= start[:, None]) & (pos < (start + count)[:, None])
    if not torch.equal(span, real):
        bad = int((span != real).any(1).nonzero()[0])
        raise ValueError(f'batch["attention_mask"] row {bad} has padding between tokens; each row must be one '
                         'contiguous span of tokens (left and/or right padding only), as verl lays out prompt + '
                         'response.')
    out = dict(batch, attention_mask=am)
    if out.get('position_ids') is None:
        out['position_ids'] = default_position_ids(am)
    for k in TOKEN_KEYS:
        out[k] = _shift_rows(out[k], start)
    vmask = batch.get('value_mask')
    if vmask is not None:
        valid = (pos[:, :-1] >= start[:, None]) & (pos[:, :-1] < (start + count - 1)[:, None])
        if (vmask.bool() & ~valid.to(vmask.device)).any():
            bad = int((vmask.bool() & ~valid.to(vmask.device)).any(1).nonzero()[0])
            raise ValueError(f'batch["value_mask"] row {bad} marks a value position whose token or next token is '
                             'padding: value position t is the state after token t and predicts the return of token '
                             't+1 (both must be tokens). For a response of R tokens at the end: response_to_values.')
    for k in VALUE_KEYS:
        if batch.get(k) is not None:
            out[k] = _shift_rows(_pad_one(batch[k]), start)[:, :-1]
    return out, start


def unalign_values(values: torch.Tensor, start: torch.Tensor, attention_mask: Optional[torch.Tensor]):
    """Inverse of ``left_align`` for value-aligned [B, S-1] outputs; 0 where the token or the next token is
    padding."""
    out = _shift_rows(_pad_one(values), -start)[:, :-1]
    if attention_mask is not None:
        real = attention_mask.bool().to(out.device)
        out = torch.where(real[:, :-1] & real[:, 1:], out, torch.zeros_like(out))
    return out


def check_batch(batch: Dict[str, torch.Tensor], forward_only: bool) -> None:
    """Shapes of ``batch``: [B, S] token tensors; for an update, value-aligned [B, S-1] ``returns`` / ``value_mask``
    (required) and ``old_values``."""
    ids = batch['input_ids']
    if ids.dim() != 2:
        raise ValueError(f'batch["input_ids"] must be [B, S], got {tuple(ids.shape)}')
    B, S = ids.shape
    for k in ('attention_mask', 'position_ids'):
        if batch.get(k) is not None and tuple(batch[k].shape) != (B, S):
            raise ValueError(f'batch["{k}"] must be [B, S] = {(B, S)}, got {tuple(batch[k].shape)}')
    if forward_only:
        return
    for k in ('returns', 'value_mask', 'old_values'):
        if k in ('returns', 'value_mask') and batch.get(k) is None:
            raise ValueError(f'update_critic: batch["{k}"] is missing (value-aligned [B, S-1], see '
                             'response_to_values).')
        if batch.get(k) is not None and tuple(batch[k].shape) != (B, S - 1):
            raise ValueError(f'batch["{k}"] must be value-aligned [B, S-1] = {(B, S - 1)} like compute_values\' '
                             f'output, got {tuple(batch[k].shape)} (a [B, R] response tensor: '
                             'response_to_values(x, S)).')


def check_positions(batch: Dict[str, torch.Tensor]) -> None:
    """Packed rows restart RoPE positions at 0 per row (as Transformer Engine's THD kernels do): the caller's
    ``position_ids`` must be 0..n-1 on each row's tokens (the default, and verl's)."""
    pos, real = batch['position_ids'], batch['attention_mask'].bool()
    expected = torch.arange(pos.shape[1], device=pos.device)[None].expand_as(pos)
    if not torch.equal(pos[real], expected[real]):
        bad = int(((pos != expected) & real).any(1).nonzero()[0])
        raise ValueError(f'batch["position_ids"] row {bad} is not 0, 1, ..., n-1 over its tokens: the packed '
                         '(remove_padding=True) path gives every row positions 0..n-1. Pass the default '
                         'positions (cumsum(attention_mask) - 1), or MegatronCritic(remove_padding=False).')
