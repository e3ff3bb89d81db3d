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
    """NLL of K targets per row under one softmax, vocab optionally split over a process group: one fp32 copy of the
    logits (as megatron's CE, which called K times would keep K), the K target logits gathered from it."""

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
    """Whether the Triton kernel runs: CUDA logits, Triton importable and SWIFT_PLT_FUSED_LOSS not 0."""
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
    """NLL [P, B, K] of targets [P, B, K] under one softmax per row of logits [P, B, V_local]. impl: 'torch',
    'triton' or None (``fused_loss_enabled``); inplace_grad (Triton): the gradient overwrites the unshared logits."""
    if impl is None:
        impl = 'triton' if fused_loss_enabled(logits) else 'torch'
    if impl == 'triton':
        from swift_plt.patch_level.loss_triton import patch_cross_entropy_triton
        return patch_cross_entropy_triton(logits, target, vocab_start, group, inplace_grad)
    if impl == 'torch':
        return _PatchCrossEntropy.apply(logits, target, vocab_start, group)
    raise ValueError(f"PLT: impl must be 'torch', 'triton' or None, not {impl!r}.")


def _check_labels(logits: torch.Tensor, labels: torch.Tensor, patch_size: int) -> None:
    P, B, _ = logits.shape
    if labels.shape != (B, P * patch_size):
        raise ValueError(f'PLT: labels {tuple(labels.shape)} do not match logits {tuple(logits.shape)} '
                         f'at patch_size {patch_size}.')


def plt_token_losses(logits: torch.Tensor,
                     labels: torch.Tensor,
                     patch_size: int,
                     vocab_start: int = 0,
                     group: Optional['dist.ProcessGroup'] = None,
                     impl: Optional[str] = None,
                     inplace_grad: bool = False) -> torch.Tensor:
    """Per-token PLT losses [B, S] float32 from logits [P, B, V_local] (vocab ids from ``vocab_start``) and labels
    [B, S = K*P]: entry t is -log p(labels[t] | patch t//K - 1), 0 where -100 and in the first patch (must be -100)."""
    P, B, _ = logits.shape
    _check_labels(logits, labels, patch_size)
    target = shift_patch_targets(labels, patch_size)
    nll = patch_nll(logits, target, vocab_start, group, impl, inplace_grad)  # [P, B, K], patch p -> tokens of p+1
    nll = nll.permute(1, 0, 2)[:, :-1]  # [B, P-1, K]
    return torch.cat([nll.new_zeros(B, 1, patch_size), nll], dim=1).reshape(B, P * patch_size)


def roll_patch_labels(labels: torch.Tensor, patch_size: int) -> torch.Tensor:
    """CP: labels [..., S] rolled by K before the split (slot t holds label t+K), so patch p's own slots hold its
    targets. The first patch of every document must already be -100, which then lands on each document's last patch."""
    return torch.roll(labels, -patch_size, dims=-1)


def plt_local_token_losses(logits: torch.Tensor,
                           rolled_labels: torch.Tensor,
                           patch_size: int,
                           vocab_start: int = 0,
                           group: Optional['dist.ProcessGroup'] = None,
                           impl: Optional[str] = None,
                           inplace_grad: bool = False) -> torch.Tensor:
    """``plt_token_losses`` for labels rolled by K (``roll_patch_labels``, CP): [B, S] float32, entry t is
    -log p(rolled_labels[t] | patch t // K), 0 where -100; summed over ranks, the same (patch, target) pairs."""
    P, B, _ = logits.shape
    _check_labels(logits, rolled_labels, patch_size)
    target = rolled_labels.reshape(B, P, patch_size).permute(1, 0, 2).contiguous()
    nll = patch_nll(logits, target, vocab_start, group, impl, inplace_grad)  # [P, B, K]
    return nll.permute(1, 0, 2).reshape(B, P * patch_size)
