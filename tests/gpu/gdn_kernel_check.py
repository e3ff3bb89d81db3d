#!/usr/bin/env python3
"""flash-linear-attention's Gated DeltaNet kernel (the one mcore-bridge's hybrids train with) against its own naive
recurrence, forward and every gradient, on this GPU and Triton; one process, a few seconds after compilation.

    python3 tests/gpu/gdn_kernel_check.py

fla 0.6 refuses the backward on Hopper GPUs with Triton 3.4.0 to 3.7.0 (wrong gradients there); this checks that the
installed combination computes it right. Varlen input (three documents of 37, 128 and 91 tokens, the packed layout
the plugin passes at patch level), fp32. fla's chunked kernels multiply in TF32, so the forward differs from the
recurrence by ~1e-3 (rel max); the bar for each gradient is 3x the forward's difference (a gradient as accurate as the
forward). Prints `GDN_KERNEL <name>: rel ...` and `GDN_KERNEL: OK|FAIL`; exit code 0 / 1.
"""
import sys

import torch


def main():
    import fla
    import triton
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
    print(f'GDN_KERNEL triton {triton.__version__}, fla {fla.__version__}, {torch.cuda.get_device_name()}', flush=True)
    torch.manual_seed(0)
    lens, heads, dk, dv = [37, 128, 91], 4, 64, 64
    t = sum(lens)

    def rand(*shape):
        return torch.randn(*shape, device='cuda', dtype=torch.float32)

    q = torch.nn.functional.normalize(rand(1, t, heads, dk), dim=-1)
    k = torch.nn.functional.normalize(rand(1, t, heads, dk), dim=-1)
    v = rand(1, t, heads, dv)
    g, beta = torch.nn.functional.logsigmoid(rand(1, t, heads)), torch.sigmoid(rand(1, t, heads))
    do = rand(1, t, heads, dv)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device='cuda')
    kernel = [x.clone().requires_grad_() for x in (q, k, v, g, beta)]
    o, _ = chunk_gated_delta_rule(*kernel, cu_seqlens=cu)
    (o * do).sum().backward()
    naive = [x.clone().requires_grad_() for x in (q, k, v, g, beta)]
    parts = []
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):  # one document at a time: no state crosses a boundary
        qs, ks, vs, gs, bs = (x[:, s:e] for x in naive)
        parts.append(naive_recurrent_gated_delta_rule(qs, ks, vs, bs, gs)[0])
    (torch.cat(parts, 1) * do).sum().backward()

    def rel(a, b):
        return ((a - b).abs().max() / b.abs().max()).item()

    fwd = rel(o, torch.cat(parts, 1))
    print(f'GDN_KERNEL output: rel {fwd:.2e}')
    ok = True
    for name, a, b in zip(('q', 'k', 'v', 'g', 'beta'), kernel, naive):
        r = rel(a.grad, b.grad)
        ok &= r <= 3 * max(fwd, 1e-6)
        print(f'GDN_KERNEL d{name}: rel {r:.2e} (bar {3 * max(fwd, 1e-6):.2e})')
    print(f'GDN_KERNEL: {"OK" if ok else "FAIL"}')
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
