#!/usr/bin/env python3
"""The fused Triton PLT loss (swift_plt.patch_level.loss_triton) against the torch reference (swift_plt.patch_level.loss._PatchCrossEntropy)
on a GPU, real shapes: values and gradients (any upstream gradient), ignored labels, K = 1, 2, 4, 8, V = 128256 and
odd V (not a multiple of the 4096 block), P*B odd, fully ignored rows, the in-place backward, the auto dispatch and
the SWIFT_PLT_FUSED_LOSS=0 opt-out. The CPU version (Triton interpreter, small shapes, TP=2 over gloo):
tests/patch_level/test_plt_triton.py.

    python3 tests/gpu/plt_triton_check.py         # prints one line per case and PLT_TRITON: OK / FAILED
Tolerances: losses rtol 1e-5 / atol 1e-5 (both fp32 from the same bf16 logits; only the summation order differs);
gradients (bf16, each rounded once from an fp32 value) rtol 1e-2 / atol 1e-6.
"""
import os
import sys

import torch

from swift_plt.patch_level import layout as patch_layout, loss as patch_loss, loss_triton

IGN = -100


def case(P, B, V, K, seed, p_ignore=0.2):
    g = torch.Generator(device='cuda').manual_seed(seed)
    logits = (torch.randn(P, B, V, device='cuda', generator=g) * 3).to(torch.bfloat16)
    labels = torch.randint(0, V, (B, P * K), device='cuda', generator=g)
    labels[torch.rand(B, P * K, device='cuda', generator=g) < p_ignore] = IGN
    labels[:, :K] = IGN
    return logits, labels


def run(impl, logits, labels, K, w, inplace=False):
    leaf = logits.clone().requires_grad_(True)
    x = leaf * 1 if inplace else leaf  # an activation, like the output layer's output
    losses = patch_loss.plt_token_losses(x, labels, K, impl=impl, inplace_grad=inplace)
    (losses * w).sum().backward()
    return losses.detach(), leaf.grad


def main():
    ok = True
    cases = [(2048, 1, 128256, 4), (1024, 2, 128256, 1), (1024, 2, 128256, 2), (512, 2, 128256, 8),
             (1023, 3, 50257, 4), (77, 1, 32003, 8), (5, 3, 4095, 3), (2048, 4, 128256, 4)]
    for i, (P, B, V, K) in enumerate(cases):
        logits, labels = case(P, B, V, K, i)
        if i == 6:
            labels[1] = IGN  # a fully ignored batch row
        w = torch.rand(labels.shape, device='cuda')
        ref_l, ref_g = run('torch', logits, labels, K, w)
        for inplace in (False, True):
            got_l, got_g = run('triton', logits, labels, K, w, inplace)
            try:
                torch.testing.assert_close(got_l, ref_l, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(got_g.float(), ref_g.float(), rtol=1e-2, atol=1e-6)
                assert bool((got_l[labels == IGN] == 0).all())
                res = 'ok'
            except AssertionError as e:
                ok = False
                res = 'FAILED ' + str(e).replace('\n', ' ')[:300]
            dl = (got_l - ref_l).abs().max().item()
            dg = (got_g.float() - ref_g.float()).abs().max().item()
            print(f'case P={P} B={B} V={V} K={K} inplace={inplace}: max|dloss|={dl:.2e} max|dgrad|={dg:.2e} '
                  f'(max|grad|={ref_g.float().abs().max().item():.2e}) {res}', flush=True)
        del logits, ref_g
        torch.cuda.empty_cache()
    # auto dispatch on CUDA, and the opt-out
    calls = []
    real = loss_triton.patch_cross_entropy_triton
    loss_triton.patch_cross_entropy_triton = lambda *a: calls.append(1) or real(*a)
    logits, labels = case(8, 1, 1000, 4, 99)
    patch_loss.plt_token_losses(logits, labels, 4)
    os.environ['SWIFT_PLT_FUSED_LOSS'] = '0'
    patch_loss.plt_token_losses(logits, labels, 4)
    del os.environ['SWIFT_PLT_FUSED_LOSS']
    loss_triton.patch_cross_entropy_triton = real
    disp = calls == [1]
    ok &= disp
    print(f'dispatch: CUDA default -> triton, SWIFT_PLT_FUSED_LOSS=0 -> torch: {"ok" if disp else "FAILED"} {calls}')
    print('PLT_TRITON:', 'OK' if ok else 'FAILED')
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
