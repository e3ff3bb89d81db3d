"""Fused LM head + PLT loss: the per-(row, k) NLL of ``swift_plt.plt.patch_nll`` computed from the hidden states
and the output weight, chunked over rows, so the [N, V] logits (N = P * B rows) are never held whole.

Why: the unfused path (``logits = hidden @ W.T`` then ``patch_nll``) keeps the [N, V] logits (bf16: N * V * 2 bytes,
2 GiB for N = 8192, V = 128256) and their gradient. Here, like Liger-Kernel's fused linear cross entropy, rows are
processed ``chunk_rows`` at a time:

* forward, per chunk: logits_c = hidden_c @ W.T (input dtype, fp32 accumulation inside the matmul), then the row
  logsumexp and the K target logits (``_chunk_stats_torch`` / ``_chunk_stats_triton``, the latter reusing the
  forward kernel of ``swift_plt.plt_triton``). loss[row, k] = lse[row] - logit[row, target_k], 0 where ignored.
  Saved for backward: hidden, W, targets and lse [N] (fp32), nothing of size [N, V];
* backward (``backward_split='rows'``, the default, Liger's scheme), per row chunk: the chunk's logits are
  recomputed (the same matmul) and turned into grad_logits = softmax * sum_k g_k - sum_k g_k * onehot(target_k)
  (ignored targets contribute 0), in the input dtype (the Triton path writes it in place into the recomputed logits,
  with ``plt_triton``'s backward kernel); then grad_hidden_c = grad_logits @ W and grad_W += grad_logits.T @
  hidden_c, accumulated in fp32 (``accum_fp32``) and cast to W's dtype at the end. With one chunk grad_W is one
  matmul, no accumulator;
* backward (``backward_split='vocab'``), per vocabulary block of the same number of elements: logits [N, block] =
  hidden @ W[block].T for all rows (the softmax needs only the saved lse), grad_W[block] = grad_logits.T @ hidden
  complete in one GEMM, grad_hidden += grad_logits @ W[block] accumulated in fp32. The accumulator is [N, H]
  instead of [V, H].

Memory (bf16, Triton, N rows, no [N, V] tensor): one [chunk_rows, V] logits buffer in each pass (or [N, block]),
lse [N], the gradients, and the accumulator: 'rows' an fp32 [V, H] (plus, on torch builds without
``addmm(..., out_dtype=float32)``, a bf16 [V, H] product per chunk; plus the final cast), 'vocab' an fp32 [N, H].
The unfused path peaks at the bf16 [N, V] logits (their gradient is written in place) + grad_W: N*V*2 + V*H*2
bytes; 'rows' with fp32 accumulation at ~V*H*6 (accumulator + the bf16 product or the final cast) + one chunk.
So it saves memory only for N > ~2 H: for N = H = 2048 it needs MORE than unfused. ``accum_fp32=False``
(accumulation in W's dtype, in place: Liger's default) or ``backward_split='vocab'`` (fp32 accumulation of the
small [N, H]) avoid that. ``benchmarks/fused_linear_plt_bench.py`` measures all three.

Contract (the same as ``patch_nll``): per-(row, k) float32 NLL [..., K], 0 where the target is ignored; the caller
sums and normalises. Not wired into the Megatron model (no vocab split: the full W on one rank).
"""
import functools
from typing import Optional

import torch

from .plt import IGNORE_INDEX

CHUNK_BYTES = 256 * 2**20  # auto chunk: rows whose fp32 logits fit in this many bytes


def auto_chunk_rows(vocab_size: int, budget_bytes: int = CHUNK_BYTES) -> int:
    """Rows per chunk: as many as have fp32 logits within ``budget_bytes``, rounded down to a multiple of 64 (matmul
    friendly) when that leaves at least 64; at least 1. V = 128256 -> 512 rows (256 MiB fp32, 128 MiB bf16)."""
    rows = max(1, budget_bytes // (4 * vocab_size))
    return rows - rows % 64 if rows >= 64 else rows


def row_chunks(n: int, chunk_rows: int):
    """[(start, end)] covering range(n) in pieces of at most chunk_rows rows."""
    return [(s, min(s + chunk_rows, n)) for s in range(0, n, chunk_rows)]


def check_target_range(targets: torch.Tensor, vocab_size: int, ignore_index: int) -> None:
    """Raise ValueError unless every target is ignore_index or in [0, vocab_size). One host sync on a device."""
    bad = (targets != ignore_index) & ((targets < 0) | (targets >= vocab_size))
    if bool(bad.any()):
        first = int(targets[bad][0])
        raise ValueError(f'PLT fused linear loss: target id {first} is outside the vocabulary [0, {vocab_size}) '
                         f'and is not ignore_index ({ignore_index}); {int(bad.sum())} such target(s).')


def resolve_impl(impl: Optional[str], device: torch.device) -> str:
    """'triton' on CUDA when Triton imports, else 'torch'; an explicit 'torch' / 'triton' is kept."""
    if impl is None:
        from .plt_triton import triton_available
        return 'triton' if device.type == 'cuda' and triton_available() else 'torch'
    if impl not in ('torch', 'triton'):
        raise ValueError(f"PLT fused linear loss: impl must be 'torch', 'triton' or None, not {impl!r}.")
    return impl


def _valid_targets(t: torch.Tensor, vocab_size: int, vocab_start: int = 0) -> torch.Tensor:
    """Targets that select a logit of the columns [vocab_start, vocab_start + vocab_size): not ignored and in range
    (out-of-range ones, possible with check_targets=False, are treated as the Triton kernels treat them: target
    logit 0, no one-hot term)."""
    local = t - vocab_start
    return (t != IGNORE_INDEX) & (local >= 0) & (local < vocab_size)


def _chunk_stats_torch(logits: torch.Tensor, t: torch.Tensor):
    """Chunk logits [c, V] (any float dtype), targets [c, K] -> (lse [c], target logits [c, K]) in fp32."""
    v = logits.shape[-1]
    x = logits.float()
    xt = x.gather(-1, t.clamp(0, v - 1)).masked_fill_(~_valid_targets(t, v), 0.0)
    return torch.logsumexp(x, dim=-1), xt


def _chunk_grad_torch(logits: torch.Tensor,
                      lse: torch.Tensor,
                      t: torch.Tensor,
                      g: torch.Tensor,
                      vocab_start: int = 0) -> torch.Tensor:
    """grad of sum_k g_k * (lse - x[t_k]) w.r.t. the chunk logits, in their dtype: softmax * sum_k g_k - sum_k g_k *
    onehot(t_k). g [c, K] fp32 is already 0 where ignored. The chunk holds the vocabulary columns [vocab_start,
    vocab_start + its width) (all of them for a row chunk, one block for the vocab-split backward)."""
    v = logits.shape[-1]
    grad = (logits.float() - lse.unsqueeze(-1)).exp_().mul_(g.sum(-1, keepdim=True))
    grad.scatter_add_(-1, (t - vocab_start).clamp(0, v - 1), -(g * _valid_targets(t, v, vocab_start)))
    return grad.to(logits.dtype)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _num_warps(block: int) -> int:
    return 8 if block >= 2048 else 4


def _chunk_stats_triton(logits: torch.Tensor, t: torch.Tensor):
    """As ``_chunk_stats_torch``, with ``plt_triton``'s forward kernel (one pass over each bf16 row)."""
    from . import plt_triton
    _, fwd, _ = plt_triton._kernels()
    c, v = logits.shape
    k = t.shape[-1]
    row_max = torch.empty(c, device=logits.device, dtype=torch.float32)
    sum_exp = torch.empty_like(row_max)
    xt = torch.empty(c, k, device=logits.device, dtype=torch.float32)
    block = min(plt_triton.BLOCK_FWD, _next_pow2(v))
    fwd[(c, )](logits, logits.stride(0), t, v, 0, row_max, sum_exp, xt, K=k, KP=_next_pow2(k), BLOCK=block,
               num_warps=_num_warps(block))
    return row_max + sum_exp.log(), xt


def _chunk_grad_triton(logits: torch.Tensor,
                       lse: torch.Tensor,
                       t: torch.Tensor,
                       g: torch.Tensor,
                       vocab_start: int = 0) -> torch.Tensor:
    """As ``_chunk_grad_torch``, with ``plt_triton``'s backward kernel (its vocab-parallel form: columns from
    vocab_start), written in place into ``logits`` (the recomputed chunk, which nothing else uses). The kernel
    takes (max, log sum) per row: (lse, 0) is the same."""
    from . import plt_triton
    triton, _, bwd = plt_triton._kernels()
    c, v = logits.shape
    block = min(plt_triton.BLOCK_BWD, _next_pow2(v))
    bwd[(c, triton.cdiv(v, block))](logits, logits.stride(0), logits, logits.stride(0), t, g, g.sum(-1), lse,
                                    torch.zeros_like(lse), v, vocab_start, K=t.shape[-1], BLOCK=block,
                                    num_warps=_num_warps(block))
    return logits


_CHUNK_FNS = {'torch': (_chunk_stats_torch, _chunk_grad_torch), 'triton': (_chunk_stats_triton, _chunk_grad_triton)}


@functools.lru_cache(maxsize=None)
def _addmm_fp32_out_works(device: str, dtype: torch.dtype) -> bool:
    """Whether ``torch.addmm(acc_fp32, a, b, out_dtype=float32, out=acc)`` with a, b in ``dtype`` (bf16/fp16) runs
    and accumulates correctly here (CUDA, recent torch: a low-precision GEMM with fp32 output, no [V, H] temporary).
    Tried once per device and dtype."""
    try:
        a = torch.arange(6, device=device, dtype=torch.float32).view(2, 3)
        b = torch.ones(3, 2, device=device, dtype=torch.float32)
        acc = torch.ones(2, 2, device=device, dtype=torch.float32)
        torch.addmm(acc, a.to(dtype), b.to(dtype), out_dtype=torch.float32, out=acc)
        return bool(torch.equal(acc, a @ b + 1))
    except Exception:  # older torch (no out_dtype, or self must be bf16), CPU (no kernel)
        return False


def add_matmul_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """acc += a @ b, acc possibly fp32 while a, b are bf16/fp16: an fp32-output GEMM where torch has one, else the
    low-precision product (fp32 accumulation inside the GEMM, one rounding) added into acc."""
    if acc.dtype == a.dtype:
        return acc.addmm_(a, b)
    if acc.is_cuda and acc.dtype == torch.float32 and _addmm_fp32_out_works(str(acc.device), a.dtype):
        return torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
    return acc.add_(torch.mm(a, b))


def _backward_rows(hidden, weight, targets, lse, g, need_h, need_w, chunk_rows, grad_fn, accum_fp32):
    """Backward over row chunks (Liger's scheme): grad_hidden rows are complete per chunk, grad_W is summed over the
    chunks in an fp32 [V, H] accumulator (``accum_fp32``; else in W's dtype, in place), cast at the end."""
    n, v = hidden.shape[0], weight.shape[0]
    chunks = row_chunks(n, chunk_rows)
    grad_h = torch.empty(hidden.shape, device=hidden.device, dtype=hidden.dtype) if need_h else None
    grad_w = None
    if need_w and len(chunks) > 1:
        acc_dtype = torch.float32 if accum_fp32 else weight.dtype
        grad_w = torch.zeros(weight.shape, device=weight.device, dtype=acc_dtype)
    buf = hidden.new_empty(min(chunk_rows, n), v)
    for s, e in chunks:
        logits = torch.mm(hidden[s:e], weight.t(), out=buf[:e - s])
        gl = grad_fn(logits, lse[s:e], targets[s:e], g[s:e])
        if need_h:
            torch.mm(gl, weight, out=grad_h[s:e])
        if need_w and len(chunks) == 1:
            grad_w = torch.mm(gl.t(), hidden[s:e])
        elif need_w:
            add_matmul_(grad_w, gl.t(), hidden[s:e])
        del gl
    return grad_h, (grad_w.to(weight.dtype) if grad_w is not None else None)


def vocab_block_cols(n: int, v: int, chunk_rows: int) -> int:
    """Columns per vocabulary block of the vocab-split backward: [n, cols] holds as many elements as a row chunk
    [chunk_rows, v] (the same memory budget), at least 1 and at most v."""
    return max(1, min(v, (chunk_rows * v) // max(n, 1)))


def _backward_vocab(hidden, weight, targets, lse, g, need_h, need_w, chunk_rows, grad_fn, accum_fp32):
    """Backward over vocabulary blocks: logits [N, block] = hidden @ W[block].T are recomputed for all rows (the
    softmax needs only the saved lse), grad_W[block] = grad_logits.T @ hidden is complete in one GEMM (no [V, H]
    accumulator; one rounding, as unfused), and grad_hidden is summed over the blocks in an fp32 [N, H] accumulator
    (``accum_fp32``), small next to grad_W when N < V."""
    n, v = hidden.shape[0], weight.shape[0]
    blocks = row_chunks(v, vocab_block_cols(n, v, chunk_rows))
    grad_w = torch.empty(weight.shape, device=weight.device, dtype=weight.dtype) if need_w else None
    grad_h = None
    if need_h and len(blocks) > 1:
        acc_dtype = torch.float32 if accum_fp32 else hidden.dtype
        grad_h = torch.zeros(hidden.shape, device=hidden.device, dtype=acc_dtype)
    flat = hidden.new_empty(n * (blocks[0][1] - blocks[0][0]) if blocks else 0)
    for s, e in blocks:
        logits = torch.mm(hidden, weight[s:e].t(), out=flat[:n * (e - s)].view(n, e - s))  # contiguous block
        gl = grad_fn(logits, lse, targets, g, s)
        if need_w:
            torch.mm(gl.t(), hidden, out=grad_w[s:e])
        if need_h and len(blocks) == 1:
            grad_h = torch.mm(gl, weight[s:e])
        elif need_h:
            add_matmul_(grad_h, gl, weight[s:e])
        del gl
    return (grad_h.to(hidden.dtype) if grad_h is not None else None), grad_w


_BACKWARDS = {'rows': _backward_rows, 'vocab': _backward_vocab}


class _FusedLinearPatchNLL(torch.autograd.Function):
    """hidden [N, H], weight [V, H], targets [N, K] (int64, -100 ignored, in range) -> fp32 NLL [N, K]."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_rows, impl, accum_fp32, backward_split):
        stats, _ = _CHUNK_FNS[impl]
        n, v = hidden.shape[0], weight.shape[0]
        lse = torch.empty(n, device=hidden.device, dtype=torch.float32)
        xt = torch.empty(targets.shape, device=hidden.device, dtype=torch.float32)
        buf = hidden.new_empty(min(chunk_rows, n), v)  # the only [rows, V] tensor (plus the stats' fp32 copy)
        for s, e in row_chunks(n, chunk_rows):
            logits = torch.mm(hidden[s:e], weight.t(), out=buf[:e - s])
            lse[s:e], xt[s:e] = stats(logits, targets[s:e])
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.chunk_rows, ctx.impl, ctx.accum_fp32, ctx.backward_split = chunk_rows, impl, accum_fp32, backward_split
        return (lse.unsqueeze(-1) - xt).masked_fill_(targets == IGNORE_INDEX, 0.0)

    @staticmethod
    def backward(ctx, grad_loss):
        hidden, weight, targets, lse = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[:2]
        g = grad_loss.float().masked_fill(targets == IGNORE_INDEX, 0.0).contiguous()
        grad_h, grad_w = _BACKWARDS[ctx.backward_split](hidden, weight, targets, lse, g, need_h, need_w,
                                                        ctx.chunk_rows, _CHUNK_FNS[ctx.impl][1], ctx.accum_fp32)
        return grad_h, grad_w, None, None, None, None, None


def fused_linear_patch_nll(hidden: torch.Tensor,
                           weight: torch.Tensor,
                           targets: torch.Tensor,
                           ignore_index: int = IGNORE_INDEX,
                           chunk_rows: Optional[int] = None,
                           impl: Optional[str] = None,
                           check_targets: bool = True,
                           accum_fp32: bool = True,
                           backward_split: str = 'rows') -> torch.Tensor:
    """Per-(row, k) NLL of ``hidden @ weight.T`` without the [N, V] logits: the contract of ``plt.patch_nll``.

    hidden: [..., H] (e.g. [N, H], or [P, B, H] Megatron layout); weight: [V, H] (the LM head / output layer, same
    dtype); targets: [...,  K] ids (the leading dims of hidden), ``ignore_index`` ignored.
    Returns float32 [..., K]: -log softmax(hidden @ weight.T)[row, target_k], 0 where ignored. Sum it over the valid
    targets and divide by their count for PLT's loss (what ``plt_token_losses``' callers do).
    chunk_rows: rows per chunk (None: ``auto_chunk_rows(V)``); impl: 'torch', 'triton' (plt_triton's kernels) or
    None (``resolve_impl``); check_targets: raise ValueError on a target outside [0, V) that is not ignore_index
    (one host sync; with False such a target gives lse - 0, garbage but no fault); backward_split: 'rows' (the
    backward over the forward's row chunks, grad_W accumulated over them) or 'vocab' (over vocabulary blocks of the
    same size, grad_hidden accumulated: an [N, H] instead of a [V, H] accumulator); accum_fp32: accumulate in fp32
    (else in the accumulated gradient's dtype)."""
    if weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f'PLT fused linear loss: hidden {tuple(hidden.shape)} and weight {tuple(weight.shape)} do '
                         'not match (weight must be [V, H], hidden [..., H]).')
    if targets.shape[:-1] != hidden.shape[:-1] or targets.dim() != hidden.dim():
        raise ValueError(f'PLT fused linear loss: targets {tuple(targets.shape)} must be hidden\'s leading dims '
                         f'{tuple(hidden.shape[:-1])} + [K].')
    if hidden.dtype != weight.dtype or not hidden.is_floating_point():
        raise ValueError(f'PLT fused linear loss: hidden ({hidden.dtype}) and weight ({weight.dtype}) must have one '
                         'floating dtype.')
    if targets.dtype.is_floating_point or targets.dtype == torch.bool:
        raise ValueError(f'PLT fused linear loss: targets must be integer ids, not {targets.dtype}.')
    if backward_split not in _BACKWARDS:
        raise ValueError(f"PLT fused linear loss: backward_split must be 'rows' or 'vocab', not {backward_split!r}.")
    if chunk_rows is not None and chunk_rows < 1:
        raise ValueError(f'PLT fused linear loss: chunk_rows must be >= 1, not {chunk_rows}.')
    v, lead, k = weight.shape[0], hidden.shape[:-1], targets.shape[-1]
    if check_targets:
        check_target_range(targets, v, ignore_index)
    t = targets.reshape(-1, k).to(torch.int64)
    if ignore_index != IGNORE_INDEX:  # the kernels know -100 only
        t = t.masked_fill(t == ignore_index, IGNORE_INDEX)
    impl = resolve_impl(impl, hidden.device)
    loss = _FusedLinearPatchNLL.apply(hidden.reshape(-1, hidden.shape[-1]), weight, t.contiguous(),
                                      chunk_rows or auto_chunk_rows(v), impl, accum_fp32, backward_split)
    return loss.view(*lead, k)
