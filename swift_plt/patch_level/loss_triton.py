"""Fused PLT loss in Triton, the CUDA path of ``plt_token_losses``: the torch reference's result
(``_PatchCrossEntropy``) without its fp32 copy of the logits (docs/performance.md). Opt-out:
``SWIFT_PLT_FUSED_LOSS=0``. Tests run the kernels in Triton's interpreter (``TRITON_INTERPRET=1``).
"""
import functools
from typing import Optional

import torch
import torch.distributed as dist

from swift_plt.patch_level import IGNORE_INDEX

BLOCK_FWD = 4096  # vocab elements per step of the row loop (forward)
BLOCK_BWD = 4096  # vocab elements per program (backward)


@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # ImportError, or a broken install
        return False
    return True


@functools.lru_cache(maxsize=None)
def _kernels():
    # built on first use, so that TRITON_INTERPRET is read then
    import triton
    import triton.language as tl

    # forward, one program per row: one pass over the bf16 row gives the local max, the local sum of exp(x - max)
    # (online, lane-wise) and the row's K target logits in this rank's vocab slice
    @triton.jit
    def _plt_fwd_stats(X, stride_x, T, V, vocab_start, M_OUT, S_OUT, XT_OUT, K: tl.constexpr, KP: tl.constexpr,
                       BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = X + row * stride_x
        offs = tl.arange(0, BLOCK)
        m = tl.full([BLOCK], float('-inf'), tl.float32)
        s = tl.zeros([BLOCK], tl.float32)
        for start in range(0, V, BLOCK):
            idx = start + offs
            x = tl.load(base + idx, mask=idx < V, other=float('-inf')).to(tl.float32)
            m_new = tl.maximum(m, x)
            m_safe = tl.where(m_new == float('-inf'), 0.0, m_new)  # lanes that saw only padding stay at s = 0
            s = s * tl.exp(m - m_safe) + tl.exp(x - m_safe)
            m = m_new
        row_max = tl.max(m, axis=0)
        row_sum = tl.sum(s * tl.exp(m - row_max), axis=0)
        tl.store(M_OUT + row, row_max)
        tl.store(S_OUT + row, row_sum)
        ks = tl.arange(0, KP)
        t = tl.load(T + row * K + ks, mask=ks < K, other=-100)
        local = t - vocab_start
        ok = (ks < K) & (t != -100) & (local >= 0) & (local < V)
        xt = tl.load(base + local, mask=ok, other=0.0).to(tl.float32)
        tl.store(XT_OUT + row * K + ks, xt, mask=ks < K)

    # backward, one program per (row, vocab block): grad = softmax * sum_k g_k - sum_k g_k * onehot(target_k), from
    # the saved logits, max and log(sum_exp), in the logits' dtype
    @triton.jit
    def _plt_bwd(X, stride_x, G, stride_g, T, GK, GSUM, MAX, LOGSUM, V, vocab_start, K: tl.constexpr,
                 BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        idx = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = idx < V
        x = tl.load(X + row * stride_x + idx, mask=mask, other=float('-inf')).to(tl.float32)
        row_max = tl.load(MAX + row)
        log_sum = tl.load(LOGSUM + row)
        gsum = tl.load(GSUM + row)
        grad = tl.exp((x - row_max) - log_sum) * gsum  # softmax; (x - max) first: exact for large logits
        local = idx + vocab_start
        for k in tl.static_range(K):
            t = tl.load(T + row * K + k)  # -100 (ignored) never equals a vocab id
            gk = tl.load(GK + row * K + k)
            grad = tl.where(local == t, grad - gk, grad)
        tl.store(G + row * stride_g + idx, grad.to(G.dtype.element_ty), mask=mask)

    return triton, _plt_fwd_stats, _plt_bwd


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class _PatchCrossEntropyTriton(torch.autograd.Function):
    """Same contract as ``loss._PatchCrossEntropy``: logits [P, B, Vl] (this rank's vocab slice), target [P, B, K]
    global ids (-100 ignored) -> float32 NLL [P, B, K] (0 where ignored)."""

    @staticmethod
    def forward(ctx, logits, target, vocab_start, group, inplace_grad, block_fwd, block_bwd):
        triton, fwd, _ = _kernels()
        P, B, vl = logits.shape
        K = target.shape[-1]
        x = logits.reshape(P * B, vl)
        if x.stride(-1) != 1:
            x = x.contiguous()
        n = x.shape[0]
        t = target.reshape(n, K).to(torch.int64).contiguous()
        row_max = torch.empty(n, device=x.device, dtype=torch.float32)
        sum_exp = torch.empty(n, device=x.device, dtype=torch.float32)
        x_t = torch.empty(n, K, device=x.device, dtype=torch.float32)
        block = min(block_fwd or BLOCK_FWD, _next_pow2(vl))
        if n:
            fwd[(n,)](x, x.stride(0), t, vl, vocab_start, row_max, sum_exp, x_t, K=K, KP=_next_pow2(K), BLOCK=block,
                      num_warps=8 if block >= 2048 else 4)
        # the reference's three all-reduces, in its order: MAX of the max, then SUM of the target logits (minus the
        # max) and of the sums rescaled to the global max
        ignored = t == IGNORE_INDEX
        local = t - vocab_start
        in_shard = ~ignored & (local >= 0) & (local < vl)
        if group is not None:
            global_max = row_max.clone()
            dist.all_reduce(global_max, op=dist.ReduceOp.MAX, group=group)
            sum_exp.mul_(torch.exp(row_max - global_max))
        else:
            global_max = row_max
        predicted = (x_t - global_max.unsqueeze(-1)).masked_fill_(~in_shard, 0.0)
        if group is not None:
            dist.all_reduce(predicted, op=dist.ReduceOp.SUM, group=group)
            dist.all_reduce(sum_exp, op=dist.ReduceOp.SUM, group=group)
        log_sum = sum_exp.log()
        loss = (log_sum.unsqueeze(-1) - predicted).masked_fill_(ignored, 0.0)
        ctx.save_for_backward(x, t, global_max, log_sum)
        ctx.shape, ctx.vocab_start, ctx.inplace_grad = logits.shape, vocab_start, inplace_grad
        ctx.same_storage = x.data_ptr() == logits.data_ptr()
        ctx.block_bwd = block_bwd
        return loss.view(P, B, K)

    @staticmethod
    def backward(ctx, grad_loss):
        triton, _, bwd = _kernels()
        x, t, global_max, log_sum = ctx.saved_tensors
        n, vl = x.shape
        K = t.shape[-1]
        g = grad_loss.reshape(n, K).float().masked_fill(t == IGNORE_INDEX, 0.0).contiguous()
        gsum = g.sum(-1)
        # in place: into the saved logits (the caller's storage, or our contiguous copy of it)
        out = x if (ctx.inplace_grad or not ctx.same_storage) else torch.empty_like(x)
        block = min(ctx.block_bwd or BLOCK_BWD, _next_pow2(vl))
        if n:
            bwd[(n, triton.cdiv(vl, block))](x, x.stride(0), out, out.stride(0), t, g, gsum, global_max, log_sum, vl,
                                             ctx.vocab_start, K=K, BLOCK=block, num_warps=8 if block >= 2048 else 4)
        return out.view(ctx.shape), None, None, None, None, None, None


def patch_cross_entropy_triton(logits: torch.Tensor,
                               target: torch.Tensor,
                               vocab_start: int = 0,
                               group: Optional['dist.ProcessGroup'] = None,
                               inplace_grad: bool = False,
                               block_fwd: Optional[int] = None,
                               block_bwd: Optional[int] = None) -> torch.Tensor:
    """NLL [P, B, K] float32 of K targets per row under one (vocab-parallel) softmax. ``block_fwd`` / ``block_bwd``
    (powers of two) override the vocab block sizes (tests use small ones)."""
    return _PatchCrossEntropyTriton.apply(logits, target, vocab_start, group, inplace_grad, block_fwd, block_bwd)
