"""Padding removal for ``MegatronCritic``: left-aligned ``[b, S]`` rows -> one packed THD row per micro-batch (one
sequence per row: no attention across rows) and the model's packed output back to ``[b, S]``.

Layout rules (the ones ms-swift's collator applies to padding-free batches): under context parallel every sequence
is padded to a multiple of 2*CP (Transformer Engine's zigzag THD split); the packed row's total to ms-swift's
``get_padding_to`` (TP under sequence parallel, times CP; fused attention, fp8). Padding follows a sequence's own
tokens (positions continuing), so the causal mask keeps it out of every real token; the total's padding extends the
last sequence.
"""
import math
from types import SimpleNamespace
from typing import Dict, List, Optional

import torch


def layout_multiples(config) -> tuple:
    """``(per-sequence multiple, total multiple)`` of tokens for the model ``config``'s layout."""
    from swift.megatron.utils import get_padding_to
    cp = getattr(config, 'context_parallel_size', 1) or 1
    backend = getattr(config, 'attention_backend', None)
    args = SimpleNamespace(
        tensor_model_parallel_size=getattr(config, 'tensor_model_parallel_size', 1) or 1,
        sequence_parallel=bool(getattr(config, 'sequence_parallel', False)),
        context_parallel_size=cp,
        fp8_recipe=getattr(config, 'fp8_recipe', None),
        fp8=getattr(config, 'fp8', None),
        fp4=getattr(config, 'fp4', None),
        attention_backend=getattr(backend, 'name', backend))
    seq = 2 * cp if cp > 1 else 1
    padding_to = get_padding_to(args) or 1
    return seq, seq * padding_to // math.gcd(seq, padding_to)


def partition_by_tokens(lengths: List[int], max_tokens: int, multiple_of: int = 1) -> List[List[int]]:
    """Row indices -> micro-batches of at most ``max_tokens`` tokens each (a longer row gets one of its own),
    balanced by token count (longest rows first, each to the lightest micro-batch), as few as that allows, their
    number rounded up to a multiple of ``multiple_of`` (megatron's interleaved schedule needs a multiple of PP) where
    there are rows enough. Rows keep their order inside a micro-batch; micro-batches are ordered by first row."""
    n = len(lengths)
    if max_tokens is None or max_tokens < 1:
        raise ValueError(f'max_tokens_per_micro_batch must be >= 1, got {max_tokens}')
    if n == 0:
        return []
    order = sorted(range(n), key=lambda i: (-lengths[i], i))
    k = max(1, math.ceil(sum(min(n, max_tokens) for n in lengths) / max_tokens))  # a long row fills one alone
    while True:
        k = min(n, math.ceil(k / multiple_of) * multiple_of)
        bins = [[] for _ in range(k)]
        loads = [0] * k
        for i in order:
            j = min(range(k), key=lambda j: (loads[j], j))
            bins[j].append(i)
            loads[j] += lengths[i]
        if k == n or all(load <= max_tokens or len(b) == 1 for load, b in zip(loads, bins)):
            return sorted((sorted(b) for b in bins), key=lambda b: b[0])
        k += 1


def pack_rows(input_ids: torch.Tensor, lengths: torch.Tensor, seq_multiple: int, total_multiple: int,
              total: Optional[int] = None) -> Dict[str, object]:
    """Left-aligned rows ``input_ids`` [b, S] with ``lengths`` [b] real tokens -> ``input_ids`` / ``position_ids``
    [1, T] of the packed row (row j: its tokens, then its padding to a multiple of ``seq_multiple``; positions
    0..L_j-1), ``cu_seqlens`` [b+1] (int32, on the device), ``lengths``; T a multiple of ``total_multiple``, or
    ``total`` when given (the last sequence takes the extra padding). An empty row still gets ``seq_multiple``
    padding tokens (no zero-length sequence)."""
    device = input_ids.device
    b, S = input_ids.shape
    n = lengths.to(device=device, dtype=torch.long)
    seq_len = (torch.clamp(n, min=1) + seq_multiple - 1) // seq_multiple * seq_multiple
    T = int(seq_len.sum())
    T_padded = (T + total_multiple - 1) // total_multiple * total_multiple
    if total is not None:
        if total < T_padded or total % total_multiple:
            raise ValueError(f'pack_rows: total {total} must be >= {T_padded} and a multiple of {total_multiple}')
        T_padded = total
    seq_len[-1] += T_padded - T
    cu = torch.zeros(b + 1, dtype=torch.long, device=device)
    cu[1:] = seq_len.cumsum(0)
    row = torch.repeat_interleave(torch.arange(b, device=device), seq_len)  # [T] the row of each packed position
    pos = torch.arange(T_padded, device=device) - cu[row]  # position inside its sequence
    real = pos < n[row]
    ids = input_ids[row, pos.clamp(max=S - 1)]
    ids = torch.where(real, ids, torch.zeros_like(ids))  # padding: token 0 (any id; never attended by a token)
    return {'input_ids': ids[None], 'position_ids': pos[None], 'cu_seqlens': cu.to(torch.int32), 'lengths': n}


def packed_seq_params(position_ids: torch.Tensor, cp_partition_mode: str = 'zigzag'):
    """Megatron ``PackedSeqParams`` (thd) of a packed row whose sequences restart at position 0, built by ms-swift's
    own ``get_packed_seq_params`` (as for its padding-free batches)."""
    from swift.megatron.utils import get_packed_seq_params
    return get_packed_seq_params(SimpleNamespace(cp_partition_mode=cp_partition_mode), position_ids)


def unpack_rows(packed: torch.Tensor, cu_seqlens: torch.Tensor, lengths: torch.Tensor, S: int) -> torch.Tensor:
    """Packed output [1, T, ...] -> [b, S, ...] in the rows' left-aligned layout (0 at padding; autograd flows)."""
    b = lengths.shape[0]
    t = torch.arange(S, device=packed.device)[None]
    start = cu_seqlens[:-1].to(device=packed.device, dtype=torch.long)[:, None]
    real = t < lengths.to(packed.device)[:, None]
    idx = torch.where(real, start + t, torch.zeros_like(start + t))  # [b, S]
    out = packed[0][idx.reshape(-1)].reshape(b, S, *packed.shape[2:])
    mask = real.reshape(b, S, *([1] * (packed.dim() - 2)))
    return torch.where(mask, out, torch.zeros_like(out))
