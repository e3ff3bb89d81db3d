"""Patch layout of a batch at patch size K: padding multiples, pooling, patch positions / masks / packed-sequence
(THD) boundaries, the first-patch mask, and the context-parallel (CP) layout. Tokens are [S, B, H] (sequence first),
S = K * P; patches are [P, B, H]."""
from typing import Optional

import numpy as np
import torch

from swift_plt.patch_level import IGNORE_INDEX


def patch_padding_to(upstream_padding_to: Optional[int], patch_size: int) -> Optional[int]:
    """Length multiple for a batch at patch size K.

    Upstream's multiple (TP under sequence parallel, 2*CP, fp8 blocks, fused attention) must hold for the *patch*
    sequence P = S / K, so S must be a multiple of K * upstream. K == 1 returns upstream unchanged.
    """
    if patch_size == 1:
        return upstream_padding_to
    return patch_size * (upstream_padding_to or 1)


def pad_to_multiple(length: int, patch_size: int) -> int:
    """Number of pad tokens that bring ``length`` to a multiple of ``patch_size``."""
    return -length % patch_size


def check_sequence_parallel_length(seq_len: int, patch_size: int, tp_size: int, sequence_parallel: bool) -> None:
    """Under sequence parallel each TP rank pools its own S/TP consecutive tokens, so S/TP must hold whole patches:
    S a multiple of K * TP (ms-swift's collator pads to ``get_padding_to``, which ``patch_padding_to`` makes K * TP).
    Then rank r's pooled slice is exactly patches [r*P/TP, (r+1)*P/TP) of the full sequence."""
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
    """A CPU tensor as a numpy array (shared memory), else the tensor itself.

    Why numpy for the host-side batch checks: they run in the training loop's main process on the CPU batch, every
    micro-batch. A torch CPU op on more than 32768 elements (a K=4 micro-batch of 8 x 8192 positions has 65536)
    runs in torch's OpenMP pool, and when that pool is larger than the cores left free (dataloader workers,
    pin-memory thread, other ranks) every op waits at the pool's barrier: 4-5 ms per op in the H200 profile of
    2026-11-23, ~140 ms per step. numpy's elementwise ops never use a thread pool.
    """
    return t.detach().numpy() if t.device.type == 'cpu' else t


def patches_aligned(pos, patch_size: int) -> bool:
    """True iff every patch of ``pos`` ([N, P, K] position ids, numpy array or torch tensor) lies inside one
    document: its positions are x, x+1, ..., x+K-1 with x a multiple of K (a document, padded to a multiple of K),
    or all 0 (one-token pad "documents" at the end of a packed batch).

    Computed as: x % K == 0 for every patch, and pos == x + arange(K) * (last != 0) elementwise (last: the patch's
    last position). Same accept set: a patch of the first kind has last = x+K-1 != 0 (x = 1-K is not a multiple of
    K for K >= 2; for K = 1 arange(K) is 0), so it is expected as x + arange(K); a pad patch has last = 0 and is
    expected all x = 0. Conversely, a patch that matches with last != 0 is x + arange(K) with x % K == 0, and one
    that matches with last == 0 is all x = last = 0. One [N, P, K] compare instead of two compares, an and and
    three reductions (tests/patch_level/test_plt_math.py checks it against the rule written patch by patch)."""
    k = patch_size
    ar = torch.arange(k, device=pos.device) if isinstance(pos, torch.Tensor) else np.arange(k)
    first, last = pos[..., 0], pos[..., k - 1]
    starts_ok = (first % k == 0).all()
    return bool(starts_ok & (pos == first[..., None] + ar * (last != 0)[..., None]).all())  # one host sync on a device


def check_patch_aligned(position_ids: torch.Tensor, patch_size: int) -> None:
    """Raise unless every patch lies inside one document: each patch's positions are p*K, p*K+1, ..., p*K+K-1
    (a document, padded to a multiple of K) or all 0 (one-token pad "documents" at the end of a packed batch).
    A CPU batch is checked with numpy (``_host_array``), a device batch with torch (one host sync)."""
    S = position_ids.shape[-1]
    if S % patch_size:
        raise ValueError(f'PLT: sequence length {S} is not a multiple of patch_size {patch_size}; '
                         f'pad it to a multiple of {patch_size}.')
    if not patches_aligned(_host_array(position_ids).reshape(-1, S // patch_size, patch_size), patch_size):
        raise ValueError(f'PLT: a patch of {patch_size} tokens straddles two documents (position_ids are not '
                         f'aligned to patch_size). Every document must start at a multiple of {patch_size} and be '
                         f'padded to a multiple of {patch_size}; swift-plt does this when it encodes the data.')


def patch_attention_mask(attention_mask: torch.Tensor, patch_size: int) -> torch.Tensor:
    """Token mask [B, 1, S, S] (True = masked; causal + right padding) -> patch mask [B, 1, P, P].

    Patch j is visible to patch i iff token j*K is visible to token i*K: j <= i (causal) and patch j holds at least
    one real token (its first token). So sub-sampling every K-th row and column is exact.
    """
    return attention_mask[..., ::patch_size, ::patch_size]


def patch_padding_mask(attention_mask: torch.Tensor, patch_size: int) -> torch.Tensor:
    """HF padding mask [B, S] (1 = real token, right padding) -> [B, P]: a patch is real iff its first token is
    (documents are padded to a multiple of K, so a patch never starts in padding and ends in real tokens)."""
    return attention_mask[..., ::patch_size]


def patch_cu_seqlens(patch_pos: torch.Tensor) -> torch.Tensor:
    """Cumulative document lengths (in patches) of a packed [1, P] patch-position row: a document starts where the
    patch position is 0. Returns int32 [num_docs + 1], like ``PackedSeqParams.cu_seqlens_q``."""
    pos = patch_pos.reshape(-1)
    starts = torch.nonzero(pos == 0, as_tuple=False).reshape(-1)
    total = torch.tensor([pos.numel()], device=pos.device, dtype=starts.dtype)
    return torch.cat([starts, total]).to(torch.int32)


def mask_first_patch(labels: torch.Tensor, position_ids: torch.Tensor, patch_size: int) -> torch.Tensor:
    """Set to -100 the labels of the first patch of every document (positions < K): nothing predicts them.
    Returns a new tensor; CPU tensors are masked with numpy (see ``_host_array``)."""
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
    """Token-level cumulative lengths of the whole (global) packed sequence -> patch level (CP: the model sees its
    local slice but the attention takes the global boundaries). Every boundary must be a multiple of K.

    Not re-checked here, on purpose: a check on the device tensor costs a device-to-host sync per call (q, kv and
    the padded variants, every micro-batch and model chunk, inside forward). It is redundant: ms-swift builds these
    cu_seqlens (``get_packed_seq_params``) from the batch's position_ids, as the indices where the position is 0
    plus the total length, after ``get_batch_on_this_pp_rank``, which (patched, K > 1 under CP) has already run
    ``check_cp_patch_layout`` on those position_ids on the CPU: position 0 at index 0 and every run from one 0 to
    the next (and the last to the end) a multiple of 2*CP*K tokens, so every boundary is a multiple of 2*CP*K, hence
    of K. A misaligned batch fails there, before the forward, with what to do."""
    return torch.div(cu_seqlens, patch_size, rounding_mode='floor').to(torch.int32)
