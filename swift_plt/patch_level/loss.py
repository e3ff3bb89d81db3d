"""The PLT loss: patch p's output predicts the K tokens of patch p+1 under one softmax; mean NLL over the valid
(patch, k) pairs. Labels are token-aligned and not rolled (-100 ignored); vocab-parallel under TP. The torch kernel
(``_PatchCrossEntropy``) is the reference and the CPU path; ``loss_triton`` is the fused CUDA kernel."""
import os
from typing import Optional

import torch
import torch.distributed as dist

from swift_plt.patch_level import IGNORE_INDEX


def shift_patch_targets(labels: torch.Tensor, patch_size: int) -> torch.Tensor:
    """Token-aligned labels [B, S] -> targets [P, B, K] of each patch's output: the tokens of the next patch
    (-100 for the last patch)."""
    B, S = labels.shape
    P = S // patch_size
    nxt = labels.view(B, P, patch_size)[:, 1:]
    nxt = torch.cat([nxt, nxt.new_full((B, 1, patch_size), IGNORE_INDEX)], dim=1)
    return nxt.permute(1, 0, 2).contiguous()


class _PatchCrossEntropy(torch.autograd.Function):
    """NLL of K targets per row under one softmax, with the vocab optionally split across a process group.

    megatron's ``vocab_parallel_cross_entropy`` takes one target per row; calling it K times (or on K-fold repeated
    logits) would keep K fp32 [P, B, V/tp] copies. Here one fp32 copy holds the shifted logits, then exp, then the
    softmax saved for backward (same memory as megatron's CE); the K target logits are gathered from it.
    """

    @staticmethod
    def forward(ctx, logits, target, vocab_start, group):
        # logits [P, B, Vl] (this rank's vocab slice), target [P, B, K] global ids (-100 = ignored)
        x = logits.to(torch.float32, copy=True)
        vl = x.shape[-1]
        logits_max = x.max(dim=-1).values
        if group is not None:
            dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=group)
        x.sub_(logits_max.unsqueeze(-1))
        local = target - vocab_start
        in_shard = (target != IGNORE_INDEX) & (local >= 0) & (local < vl)
        idx = local.clamp(0, vl - 1)
        predicted = x.gather(-1, idx).masked_fill_(~in_shard, 0.0)
        x.exp_()
        sum_exp = x.sum(dim=-1)
        if group is not None:
            dist.all_reduce(predicted, op=dist.ReduceOp.SUM, group=group)
            dist.all_reduce(sum_exp, op=dist.ReduceOp.SUM, group=group)
        loss = (sum_exp.log().unsqueeze(-1) - predicted).masked_fill_(target == IGNORE_INDEX, 0.0)
        x.div_(sum_exp.unsqueeze(-1))  # softmax
        ctx.save_for_backward(x, idx, in_shard, target == IGNORE_INDEX)
        ctx.logits_dtype = logits.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, idx, in_shard, ignored = ctx.saved_tensors
        g = grad_loss.float().masked_fill(ignored, 0.0)  # [P, B, K]
        grad = softmax.mul_(g.sum(-1, keepdim=True))  # sum_k g_k * softmax
        grad.scatter_add_(-1, idx, -(g * in_shard))  # - sum_k g_k * onehot(target_k) (this shard's targets)
        return grad.to(ctx.logits_dtype), None, None, None


def fused_loss_enabled(logits: torch.Tensor) -> bool:
    """The Triton kernel (swift_plt.patch_level.loss_triton) is used for CUDA logits unless SWIFT_PLT_FUSED_LOSS=0, or Triton is
    not importable (then the torch reference below runs)."""
    if not logits.is_cuda or os.environ.get('SWIFT_PLT_FUSED_LOSS', '1') == '0':
        return False
    from swift_plt.patch_level.loss_triton import triton_available
    return triton_available()


def patch_nll(logits: torch.Tensor,
              target: torch.Tensor,
              vocab_start: int = 0,
              group: Optional['dist.ProcessGroup'] = None,
              impl: Optional[str] = None,
              inplace_grad: bool = False) -> torch.Tensor:
    """NLL [P, B, K] of the targets [P, B, K] of each row of logits [P, B, V_local] under one softmax.

    impl: 'torch' (``_PatchCrossEntropy``, the reference), 'triton' (``swift_plt.patch_level.loss_triton``, the fused kernel) or
    None: 'triton' on CUDA (``fused_loss_enabled``), else 'torch'. inplace_grad (Triton only): backward writes the
    gradient into the logits' storage (only when no other autograd node keeps the logits)."""
    if impl is None:
        impl = 'triton' if fused_loss_enabled(logits) else 'torch'
    if impl == 'triton':
        from swift_plt.patch_level.loss_triton import patch_cross_entropy_triton
        return patch_cross_entropy_triton(logits, target, vocab_start, group, inplace_grad)
    if impl == 'torch':
        return _PatchCrossEntropy.apply(logits, target, vocab_start, group)
    raise ValueError(f"PLT: impl must be 'torch', 'triton' or None, not {impl!r}.")


def plt_token_losses(logits: torch.Tensor,
                     labels: torch.Tensor,
                     patch_size: int,
                     vocab_start: int = 0,
                     group: Optional['dist.ProcessGroup'] = None,
                     impl: Optional[str] = None,
                     inplace_grad: bool = False) -> torch.Tensor:
    """Per-token PLT losses, token-aligned like ``labels``.

    logits: [P, B, V_local] patch outputs (V_local = V / tp; this rank holds ids [vocab_start, vocab_start+V_local)).
    labels: [B, S] token-aligned (not rolled), S = K * P, -100 ignored.
    impl, inplace_grad: which kernel (see ``patch_nll``).
    Returns [B, S] float32: entry t is -log p(labels[t] | patch t//K - 1); 0 where labels[t] == -100 and in the
    first patch (which must be -100, see ``mask_first_patch``). Sum it over labels != -100 and divide by their count
    for the loss.
    """
    P, B, _ = logits.shape
    if labels.shape != (B, P * patch_size):
        raise ValueError(f'PLT: labels {tuple(labels.shape)} do not match logits {tuple(logits.shape)} '
                         f'at patch_size {patch_size}.')
    target = shift_patch_targets(labels, patch_size)
    nll = patch_nll(logits, target, vocab_start, group, impl, inplace_grad)  # [P, B, K], patch p -> tokens of p+1
    nll = nll.permute(1, 0, 2)[:, :-1]  # [B, P-1, K]
    return torch.cat([nll.new_zeros(B, 1, patch_size), nll], dim=1).reshape(B, P * patch_size)


def roll_patch_labels(labels: torch.Tensor, patch_size: int) -> torch.Tensor:
    """CP: token-aligned labels [..., S] -> labels rolled by K (slot t holds label t+K), before the CP split.

    Patch p's own K slots then hold the tokens of patch p+1, its targets, so every rank's targets are local after
    the split (upstream rolls by 1 for token-level training, the same idea). The first patch of every document must
    already be -100 (``mask_first_patch``): then the last patch of a document receives -100 (nothing predicted
    across a document boundary), and so does the last patch of the row (the wrap-around)."""
    return torch.roll(labels, -patch_size, dims=-1)


def plt_local_token_losses(logits: torch.Tensor,
                           rolled_labels: torch.Tensor,
                           patch_size: int,
                           vocab_start: int = 0,
                           group: Optional['dist.ProcessGroup'] = None,
                           impl: Optional[str] = None,
                           inplace_grad: bool = False) -> torch.Tensor:
    """Per-token PLT losses for labels already rolled by K (``roll_patch_labels``, CP): [B, S] float32 aligned with
    ``rolled_labels``; entry t is -log p(rolled_labels[t] | patch t // K) (no shift: patch p's targets are its own
    K slots), 0 where the label is -100. Summed over the ranks' slots it equals ``plt_token_losses`` summed over
    the unrolled labels (the same (patch, target) pairs)."""
    P, B, _ = logits.shape
    if rolled_labels.shape != (B, P * patch_size):
        raise ValueError(f'PLT: labels {tuple(rolled_labels.shape)} do not match logits {tuple(logits.shape)} '
                         f'at patch_size {patch_size}.')
    target = rolled_labels.reshape(B, P, patch_size).permute(1, 0, 2).contiguous()
    nll = patch_nll(logits, target, vocab_start, group, impl, inplace_grad)  # [P, B, K]
    return nll.permute(1, 0, 2).reshape(B, P * patch_size)
