#!/usr/bin/env python3
"""Fused LM head + PLT loss (swift_plt.plt_fused_linear) against the unfused path: time and peak memory of
forward+backward, from the hidden states [N, H] and the output weight [V, H] to the gradients of both.

    python3 benchmarks/fused_linear_plt_bench.py          # N=2048, H=2048, V=128256, K=4, bf16, 1 GPU
    python3 benchmarks/fused_linear_plt_bench.py --device cpu --N 24 --H 16 --V 101 --iters 2   # CPU smoke test

Rows (same hidden, weight and targets; loss = sum of the per-(row, k) NLLs, backward from it):
  unfused        logits = hidden @ W.T ([N, V] in bf16), then swift_plt.plt.patch_nll with its automatic kernel
                 (Triton on CUDA) and inplace_grad=True, as PLTGPTModel calls it
  fused          fused_linear_patch_nll (chunk_rows rows at a time, grad_W accumulated in fp32)
  fused_bf16acc  the same with accum_fp32=False (grad_W accumulated in W's dtype, Liger's default)
  fused_vocab    backward_split='vocab': backward over vocabulary blocks, grad_W complete per block, grad_hidden
                 accumulated in fp32 ([N, H] instead of [V, H] accumulator)
  torch_ce_k1    for scale, no Megatron: logits = hidden @ W.T, torch.nn.functional.cross_entropy at K=1 (the first
                 target column, reduction='sum')
  fused_k1       fused_linear_patch_nll at K=1 (the same targets as torch_ce_k1)
Time: CUDA events around forward+backward, --warmup iterations first, median of --iters.
Peak extra memory: torch.cuda.max_memory_allocated() during one forward+backward minus memory_allocated() before it
(hidden, weight and targets are allocated before; logits, gradients of hidden and weight, and temporaries count).
Prints `ratio time fused/unfused = X`, `ratio peak extra memory fused/unfused = Y`, a table, and a line
`JSON {...}`; writes the JSON to --json, or to $OUT/fused_linear_plt_bench.json when $OUT is set.
"""
import argparse
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # swift_plt from this checkout, installed or not


def _prefer_repo_package():
    """An installed swift_plt (its startup hook, swift_plt_startup.pth) may already be imported, from another
    checkout, before sys.path is changed: then put this checkout's package folder first in its __path__, so the
    submodules imported below (plt, plt_triton, plt_fused_linear; the hook imports none of them) are this repo's."""
    pkg = sys.modules.get('swift_plt')
    here = os.path.join(REPO, 'swift_plt')
    if pkg is not None and here not in list(pkg.__path__):
        pkg.__path__.insert(0, here)


_prefer_repo_package()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from swift_plt.plt import IGNORE_INDEX, patch_nll  # noqa: E402
from swift_plt.plt_fused_linear import auto_chunk_rows, fused_linear_patch_nll, resolve_impl  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_rows import fmt, json_path, ratio, run_rows  # noqa: E402


def sync(device):
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def time_ms(fn, device):
    """Wall time of fn() in ms: CUDA events on a GPU, perf_counter on a CPU."""
    if device.type != 'cuda':
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end)


def peak_extra_mib(fn, device):
    """Peak allocated memory during fn() above what was allocated before it, MiB (None off CUDA)."""
    if device.type != 'cuda':
        return None
    sync(device)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    sync(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def measure(loss_fn, hidden, weight, device, warmup, iters):
    """loss_fn() -> loss tensor built from hidden and weight; median/min fwd+bwd ms and peak extra MiB."""

    def fwd_bwd():
        hidden.grad = weight.grad = None
        loss_fn().sum().backward()

    for _ in range(warmup):
        fwd_bwd()
    sync(device)
    times = [time_ms(fwd_bwd, device) for _ in range(iters)]
    hidden.grad = weight.grad = None
    peak = peak_extra_mib(fwd_bwd, device)
    hidden.grad = weight.grad = None
    return {'fwd_bwd_ms_median': statistics.median(times), 'fwd_bwd_ms_min': min(times), 'peak_extra_mib': peak}


def make_inputs(N, H, V, K, dtype, device, seed=0):
    """hidden [N, H] and weight [V, H] (leaves that need grad; logits of O(1)), targets [N, K] (last row ignored:
    the last patch has no next patch)."""
    g = torch.Generator(device='cpu').manual_seed(seed)
    hidden = torch.randn(N, H, generator=g).to(device, dtype).requires_grad_(True)
    weight = (torch.randn(V, H, generator=g) / H**0.5).to(device, dtype).requires_grad_(True)
    targets = torch.randint(0, V, (N, K), generator=g).to(device)
    targets[-1] = IGNORE_INDEX
    return hidden, weight, targets


def build_rows(hidden, weight, targets, chunk_rows, impl):
    """name -> (description, loss_fn)."""
    N, K = targets.shape

    def unfused():
        logits = hidden @ weight.t()
        return patch_nll(logits.view(N, 1, -1), targets.view(N, 1, K), inplace_grad=True).view(N, K)

    t1 = targets[:, :1].clone()
    t1[-1] = 0  # cross_entropy ignores -100 too, but keep one target per row for the K=1 rows
    return {
        'unfused': (f'hidden @ W.T, then patch_nll (auto kernel, in-place grad), K={K}', unfused),
        'fused': (f'fused_linear_patch_nll {impl}, fp32 grad_W accumulation, K={K}',
                  lambda: fused_linear_patch_nll(hidden, weight, targets, chunk_rows=chunk_rows, impl=impl)),
        'fused_bf16acc': (f'fused_linear_patch_nll {impl}, grad_W accumulated in W dtype, K={K}',
                          lambda: fused_linear_patch_nll(hidden, weight, targets, chunk_rows=chunk_rows, impl=impl,
                                                         accum_fp32=False)),
        'fused_vocab': (f'fused_linear_patch_nll {impl}, vocab-split backward, fp32 grad_hidden acc., K={K}',
                        lambda: fused_linear_patch_nll(hidden, weight, targets, chunk_rows=chunk_rows, impl=impl,
                                                       backward_split='vocab')),
        'torch_ce_k1': ('hidden @ W.T, then torch cross_entropy, K=1',
                        lambda: F.cross_entropy(hidden @ weight.t(), t1[:, 0], reduction='sum')),
        'fused_k1': (f'fused_linear_patch_nll {impl}, K=1',
                     lambda: fused_linear_patch_nll(hidden, weight, t1, chunk_rows=chunk_rows, impl=impl)),
    }


def compare_grads(rows, hidden, weight):
    """Max |grad| differences of the fused rows from the unfused one (hidden and weight), relative to the largest
    unfused gradient entry: a check that the timed code computes the same thing."""

    def grads(fn):
        hidden.grad = weight.grad = None
        fn().sum().backward()
        out = hidden.grad.float(), weight.grad.float()
        hidden.grad = weight.grad = None
        return out

    ref_h, ref_w = grads(rows['unfused'][1])
    out = {}
    for key in ('fused', 'fused_bf16acc', 'fused_vocab'):
        gh, gw = grads(rows[key][1])
        out[key] = {'hidden': ((gh - ref_h).abs().max() / ref_h.abs().max()).item(),
                    'weight': ((gw - ref_w).abs().max() / ref_w.abs().max()).item()}
        del gh, gw
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--N', type=int, default=2048, help='rows (patches x batch)')
    ap.add_argument('--H', type=int, default=2048, help='hidden size')
    ap.add_argument('--V', type=int, default=128256, help='vocabulary size')
    ap.add_argument('--K', type=int, default=4, help='patch size: targets per row')
    ap.add_argument('--chunk_rows', type=int, default=None, help='rows per chunk of the fused loss (default: auto)')
    ap.add_argument('--impl', default=None, help="fused loss kernels: 'torch', 'triton' (default: auto)")
    ap.add_argument('--dtype', default='bfloat16', choices=['bfloat16', 'float16', 'float32'])
    ap.add_argument('--warmup', type=int, default=3)
    ap.add_argument('--iters', type=int, default=20)
    ap.add_argument('--device', default='cuda', help="'cuda' (the benchmark) or 'cpu' (smoke test only)")
    ap.add_argument('--skip', default='', help='comma-separated rows to skip: ' + 'unfused,fused,fused_bf16acc,'
                    'fused_vocab,torch_ce_k1,fused_k1')
    ap.add_argument('--json', default=None, help='default: $OUT/fused_linear_plt_bench.json when $OUT is set')
    a = ap.parse_args(argv)

    device = torch.device(a.device)
    if device.type == 'cuda':
        torch.cuda.set_device(device.index or 0)
    dtype = getattr(torch, a.dtype)
    impl = resolve_impl(a.impl, device)
    chunk_rows = a.chunk_rows or auto_chunk_rows(a.V)
    hidden, weight, targets = make_inputs(a.N, a.H, a.V, a.K, dtype, device)
    rows = build_rows(hidden, weight, targets, chunk_rows, impl)

    with torch.no_grad():  # the two PLT rows compute the same losses (bf16 logits either way)
        diff = (rows['fused'][1]() - rows['unfused'][1]()).abs().max().item()
    grad_diff = compare_grads(rows, hidden, weight)

    skip = {s.strip() for s in a.skip.split(',') if s.strip()}
    results = run_rows(rows, lambda fn: measure(fn, hidden, weight, device, a.warmup, a.iters), skip,
                       after_each=torch.cuda.empty_cache if device.type == 'cuda' else None)

    ratios = {
        'time_fused_over_unfused': ratio(results, 'fused', 'unfused', 'fwd_bwd_ms_median'),
        'peak_fused_over_unfused': ratio(results, 'fused', 'unfused', 'peak_extra_mib'),
        'time_fused_bf16acc_over_unfused': ratio(results, 'fused_bf16acc', 'unfused', 'fwd_bwd_ms_median'),
        'peak_fused_bf16acc_over_unfused': ratio(results, 'fused_bf16acc', 'unfused', 'peak_extra_mib'),
        'time_fused_vocab_over_unfused': ratio(results, 'fused_vocab', 'unfused', 'fwd_bwd_ms_median'),
        'peak_fused_vocab_over_unfused': ratio(results, 'fused_vocab', 'unfused', 'peak_extra_mib'),
        'time_unfused_over_torch_ce_k1': ratio(results, 'unfused', 'torch_ce_k1', 'fwd_bwd_ms_median'),
        'time_fused_k1_over_torch_ce_k1': ratio(results, 'fused_k1', 'torch_ce_k1', 'fwd_bwd_ms_median'),
        'peak_fused_k1_over_torch_ce_k1': ratio(results, 'fused_k1', 'torch_ce_k1', 'peak_extra_mib'),
    }
    dev_name = torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'
    print(f'\nFused linear + PLT loss on {dev_name}: hidden [N={a.N}, H={a.H}], W [V={a.V}, H], K={a.K}, {a.dtype}, '
          f'fused impl={impl}, chunk_rows={chunk_rows}; median of {a.iters} after {a.warmup} warm-up')
    print(f'{"row":<14} {"fwd+bwd ms":>11} {"min ms":>9} {"peak extra MiB":>15}  description')
    for key, r in results.items():
        if 'error' in r:
            print(f'{key:<14} ERROR {r["error"]}')
            continue
        print(f'{key:<14} {r["fwd_bwd_ms_median"]:>11.3f} {r["fwd_bwd_ms_min"]:>9.3f} '
              f'{fmt(r["peak_extra_mib"], ".1f"):>15}  {r["name"]}')
    print(f'max |loss fused - loss unfused| = {diff:.3g}')
    for key, d in grad_diff.items():
        print(f'max |grad {key} - grad unfused| / max |grad unfused|: hidden {d["hidden"]:.3g}, '
              f'weight {d["weight"]:.3g}')
    print(f'ratio time fused/unfused = {fmt(ratios["time_fused_over_unfused"])}')
    print(f'ratio peak extra memory fused/unfused = {fmt(ratios["peak_fused_over_unfused"])}')
    print(f'ratio time fused_bf16acc/unfused = {fmt(ratios["time_fused_bf16acc_over_unfused"])}   '
          f'peak extra memory: {fmt(ratios["peak_fused_bf16acc_over_unfused"])}')
    print(f'ratio time fused_vocab/unfused = {fmt(ratios["time_fused_vocab_over_unfused"])}   '
          f'peak extra memory: {fmt(ratios["peak_fused_vocab_over_unfused"])}')
    record = {
        'device': dev_name,
        'torch': torch.__version__,
        'module': sys.modules[fused_linear_patch_nll.__module__].__file__,
        'config': {'N': a.N, 'H': a.H, 'V': a.V, 'K': a.K, 'dtype': a.dtype, 'chunk_rows': chunk_rows, 'impl': impl,
                   'warmup': a.warmup, 'iters': a.iters},
        'rows': results,
        'ratios': ratios,
        'max_abs_loss_diff_fused_vs_unfused': diff,
        'max_rel_grad_diff_vs_unfused': grad_diff,
    }
    print('JSON ' + json.dumps(record))
    path = json_path(a.json, 'fused_linear_plt_bench.json')
    if path:
        with open(path, 'w') as f:
            json.dump(record, f, indent=2)
        print(f'[bench] wrote {path}')
    return 0 if all('error' not in results.get(k, {}) for k in ('unfused', 'fused')) else 1


if __name__ == '__main__':
    sys.exit(main())
