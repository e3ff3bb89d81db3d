"""Patch layout of a batch at patch size K: padding multiples, pooling, patch positions / masks / packed-sequence
(THD) boundaries, the first-patch mask, and the context-parallel (CP) layout. Tokens are [S, B, H] (sequence first),
S = K * P; patches are [P, B, H]."""
from typing import Optional

import numpy as np
import torch

from swift_plt.patch_level import IGNORE_INDEX


def patch_padding_to(upstream_padding_to: Optional[int], patch_size: int) -> Optional[int]:
    """Length multiple of a batch at patch size K: K * upstream's, so that the *patch* sequence P = S / K keeps
    upstream's multiple (TP under SP, 2*CP, fp8, fused attention). K == 1: upstream's unchanged."""
    if patch_size == 1:
        return upstream_padding_to
    return patch_size * (upstream_padding_to or 1)


def pad_to_multiple(length: int, patch_size: int) -> int:
    """Number of pad tokens that bring ``length`` to a multiple of ``patch_size``."""
    return -length % patch_size


def check_sequence_parallel_length(seq_len: int, patch_size: int, tp_size: int, sequence_parallel: bool) -> None:
    """Raise unless S is a multiple of K * TP under sequence parallel: each TP rank pools its own S/TP tokens, which
    must be whole patches (then rank r's pooled slice is patches [r*P/TP, (r+1)*P/TP))."""
    if sequence_parallel and tp_size > 1 and seq_len % (patch_size * tp_size):
        raise ValueError(f'PLT under sequence parallel: sequence length {seq_len} is not a multiple of patch_size * '
                         f'tensor_model_parallel_size = {patch_size} * {tp_size}; each TP rank must hold whole '
                         f'patches. Pad batches to a multiple of {patch_size * tp_size} (ms-swift\'s collator does, '
                         'via get_padding_to, when swift-plt is enabled).')


def pool_patches(x: torch.Tensor, patch_size: int) -> torch.Tensor:
    """Mean of each K consecutive tokens: [S, B, H] -> [S/K, B, H]."""
    S, B, H = x.shape
    if S % patch_size:
        raise ValueError(f'PLT: sequence length {S} is not a multiple of patch_size {patch_size}.')
    return x.view(S // patch_size, patch_size, B, H).mean(1)


def patch_position_ids(position_ids: torch.Tensor, patch_size: int) -> torch.Tensor:
    """Token position ids [..., S] (restarting at 0 per document) -> patch position ids [..., S/K]."""
    return torch.div(position_ids[..., ::patch_size], patch_size, rounding_mode='floor')


def _host_array(t: torch.Tensor):
    """A CPU tensor as a numpy array (numpy's elementwise ops use no thread pool, torch's contend with the data
    loader: docs/performance.md), else the tensor itself."""
    return t.detach().numpy() if t.device.type == 'cpu' else t


def patches_aligned(pos, patch_size: int) -> bool:
    """True iff every patch of ``pos`` ([N, P, K] position ids, numpy or torch) is x, x+1, ..., x+K-1 with x % K == 0
    (inside one padded document) or all 0 (a one-token pad "document" of a packed batch)."""
    k = patch_size
    ar = torch.arange(k, device=pos.device) if isinstance(pos, torch.Tensor) else np.arange(k)
    first, last = pos[..., 0], pos[..., k - 1]
    starts_ok = (first % k == 0).all()
    # one compare, same accept set as the rule (docs/plugin.md#patch-alignment); one host sync on a device
    return bool(starts_ok & (pos == first[..., None] + ar * (last != 0)[..., None]).all())


def check_patch_aligned(position_ids: torch.Tensor, patch_size: int) -> None:
    """Raise unless S is a multiple of K and every patch lies inside one document (``patches_aligned``); a CPU batch
    is checked with numpy, a device batch with torch (one host sync)."""
    S = position_ids.shape[-1]
    if S % patch_size:
        raise ValueError(f'PLT: sequence length {S} is not a multiple of patch_size {patch_size}; '
                         f'pad it to a multiple of {patch_size}.')
    if not patches_aligned(_host_array(position_ids).reshape(-1, S // patch_size, patch_size), patch_size):
        raise ValueError(f'PLT: a patch of {patch_size} tokens straddles two documents (position_ids are not '
                         f'aligned to patch_size). Every document must start at a multiple of {patch_size} and be '
                         f'padded to a multiple of {patch_size}; swift-plt does this when it encodes the data.')


def patch_attention_mask(attention_mask: torch.Tensor, patch_size: int) -> torch.Tensor:
    """Token mask [B, 1, S, S] (True = masked; causal + right padding) -> patch mask [B, 1, P, P]: every K-th row and
    column, exact since patch j is visible to patch i iff token j*K is visible to token i*K."""
    return attention_mask[..., ::patch_size, ::patch_size]


def patch_padding_mask(attention_mask: torch.Tensor, patch_size: int) -> torch.Tensor:
    """HF padding mask [B, S] (1 = real token, right padding) -> [B, P]: a patch is real iff its first token is
    (documents are padded to a multiple of K, so a patch never starts in padding and ends in real tokens)."""
    return attention_mask[..., ::patch_size]


def patch_cu_seqlens(patch_pos: torch.Tensor) -> torch.Tensor:
    """Cumulative document lengths int32 [num_docs + 1] (like ``PackedSeqParams.cu_seqlens_q``) of a packed [1, P]
    patch-position row, a document starting where the position is 0."""
    pos = patch_pos.reshape(-1)
    starts = torch.nonzero(pos == 0, as_tuple=False).reshape(-1)
    total = torch.tensor([pos.numel()], device=pos.device, dtype=starts.dtype)
    return torch.cat([starts, total]).to(torch.int32)


def mask_first_patch(labels: torch.Tensor, position_ids: torch.Tensor, patch_size: int) -> torch.Tensor:
    """A new label tensor with the first patch of every document (positions < K) set to -100: nothing predicts it."""
    if labels.device.type == 'cpu' and position_ids.device.type == 'cpu':
        return torch.from_numpy(np.where(_host_array(position_ids) < patch_size, IGNORE_INDEX, _host_array(labels)))
    return labels.masked_fill(position_ids < patch_size, IGNORE_INDEX)


def mask_first_patch_of_document(labels, patch_size: int) -> list:
    """``mask_first_patch`` for one document's label list (positions 0..n-1), as the template encodes it."""
    return [IGNORE_INDEX] * min(patch_size, len(labels)) + list(labels[patch_size:])


def cp_multiple(patch_size: int, cp_size: int) -> int:
    """Token multiple of every document (padding-free/packed) or padded row at patch size K under CP."""
    return 2 * cp_size * patch_size


def check_cp_patch_layout(position_ids: torch.Tensor, patch_size: int, cp_size: int, padding_free: bool) -> None:
    """Raise unless the CP split of this (global, not yet split) batch cuts at patch boundaries: every padded row,
    or every packed document (a run starting where the position is 0), is a multiple of 2*CP*K tokens."""
    m = cp_multiple(patch_size, cp_size)
    S = position_ids.shape[-1]
    if not padding_free:
        if S % m:
            raise ValueError(f'PLT with context parallel: the padded batch length {S} is not a multiple of '
                             f'2 x context_parallel_size x patch_size = {m}; swift-plt pads every row to it when it '
                             'collates the batch (is the plugin enabled for the data path?).')
        return
    pos = position_ids.reshape(-1)
    starts = torch.nonzero(pos == 0, as_tuple=False).reshape(-1)
    lengths = torch.diff(torch.cat([starts, starts.new_tensor([pos.numel()])]))
    bad = lengths % m != 0
    if starts.numel() == 0 or int(starts[0]) != 0 or bool(bad.any()):
        n = int(lengths[bad][0]) if bool(bad.any()) else -1
        raise ValueError(f'PLT with context parallel: a packed document of {n} tokens is not a multiple of 2 x '
                         f'context_parallel_size x patch_size = {m}, so the CP split would cut a patch or the '
                         'patch-level CP attention would see a document that does not split into 2 x CP chunks. '
                         'swift-plt pads every document to it when it collates the batch (is the plugin enabled '
                         'for the data path?).')


def cp_patch_cu_seqlens(cu_seqlens: torch.Tensor, patch_size: int) -> torch.Tensor:
    """CP: token-level cumulative lengths of the whole (global) packed sequence -> patch level; every boundary must
    be a multiple of K (not re-checked here: docs/parallel-layouts.md#context-parallel)."""
    return torch.div(cu_seqlens, patch_size, rounding_mode='floor').to(torch.int32)
