#!/usr/bin/env python3
"""PLT loss vs Megatron's cross entropy: time and peak memory of forward+backward on the same [P, B, V] logits.

    python3 benchmarks/loss/plt_loss_bench.py                     # P=2048, B=1, V=128256, K=4, bf16, 1 GPU
    python3 benchmarks/loss/plt_loss_bench.py --device cpu --P 64 --V 1000 --iters 3   # CPU smoke test of the code

Rows (all on the same bf16 logits [P, B, V], TP=1):
  plt      swift_plt.patch_level.loss.plt_token_losses: K targets per row (the tokens of the next patch), one softmax; on CUDA
           the fused Triton kernel (swift_plt.patch_level.loss_triton), gradient in a new tensor
  plt_torch  the same with impl='torch' (the reference _PatchCrossEntropy, an fp32 softmax copy)
  plt_inplace (CUDA) the Triton kernel with inplace_grad=True, as PLTGPTModel calls it: the gradient is written into
           the logits' storage (run last: it overwrites the logits)
  ce       megatron.core.tensor_parallel.vocab_parallel_cross_entropy: 1 target per row (token-level baseline)
  ce_fused megatron.core.fusions.fused_cross_entropy.fused_vocab_parallel_cross_entropy: 1 target per row
           (what a stock ms-swift run uses: cross_entropy_loss_fusion=True, impl 'native'); torch.compile'd; CUDA only
  ce_xK    vocab_parallel_cross_entropy called K times, one per target column (the naive way to do PLT)
Time: CUDA events around forward+backward (and forward alone), after warm-up; median of --iters.
Peak memory: torch.cuda.max_memory_allocated() during forward+backward minus memory_allocated() before it
(the logits themselves are allocated before and not counted; their gradient is counted).
Writes $OUT/plt_loss_bench.json when $OUT is set (or --json PATH).
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist


def run_rows(rows, measure_one, skip=()):
    """rows: key -> (description, fn); measure_one(fn) -> dict of figures. Returns key -> dict(name=description,
    **figures), or dict(name=..., error=repr) for a row that raised (e.g. out of memory at a large shape)."""
    results = {}
    for key, (name, fn) in rows.items():
        if key in skip:
            continue
        try:
            results[key] = dict(name=name, **measure_one(fn))
        except Exception as e:  # noqa: BLE001 -- reported, the other rows still run
            results[key] = dict(name=name, error=repr(e))
            print(f'[bench] {key} failed: {e!r}')
    return results


def ratio(results, a, b, field):
    """results[a][field] / results[b][field], None where either is missing, failed or zero."""
    try:
        return results[a][field] / results[b][field]
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def fmt(v, spec='.3f'):
    return 'n/a' if v is None else format(v, spec)


def json_path(arg, name):
    """--json if given, else $OUT/name when $OUT is set, else None."""
    return arg or (os.path.join(os.environ['OUT'], name) if os.environ.get('OUT') else None)


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def init_megatron_tp1(device):
    if not dist.is_initialized():
        backend = 'nccl' if device.type == 'cuda' else 'gloo'
        dist.init_process_group(backend, init_method=f'tcp://127.0.0.1:{free_port()}', rank=0, world_size=1)
    from megatron.core import parallel_state as mpu
    if not mpu.model_parallel_is_initialized():
        mpu.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    return mpu


class Timer:

    def __init__(self, device):
        self.cuda = device.type == 'cuda'

    def __enter__(self):
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.end.record()
            torch.cuda.synchronize()
            self.ms = self.start.elapsed_time(self.end)
        else:
            self.ms = (time.perf_counter() - self.t0) * 1e3


def measure(fn, logits, grad_out, device, warmup, iters):
    """fn(logits) -> loss tensor; returns dict of median fwd / fwd+bwd ms and peak memory of fwd+bwd."""

    def fwd_bwd():
        logits.grad = None
        loss = fn(logits)
        loss.backward(grad_out(loss))

    for _ in range(warmup):
        fwd_bwd()
    if device.type == 'cuda':
        torch.cuda.synchronize()
    fb, fw = [], []
    for _ in range(iters):
        logits.grad = None
        with Timer(device) as t:
            loss = fn(logits)
            loss.backward(grad_out(loss))
        fb.append(t.ms)
    with torch.no_grad():
        for _ in range(iters):
            with Timer(device) as t:
                fn(logits)
            fw.append(t.ms)
    peak_mib = None
    if device.type == 'cuda':
        logits.grad = None
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fwd_bwd()
        torch.cuda.synchronize()
        peak_mib = (torch.cuda.max_memory_allocated() - base) / 2**20
        logits.grad = None
    return {
        'fwd_bwd_ms_median': statistics.median(fb),
        'fwd_bwd_ms_min': min(fb),
        'fwd_ms_median': statistics.median(fw),
        'peak_mib': peak_mib,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--P', type=int, default=2048, help='patches (rows of logits) per sequence')
    ap.add_argument('--B', type=int, default=1)
    ap.add_argument('--V', type=int, default=128256)
    ap.add_argument('--K', type=int, default=4, help='patch size: targets per row for PLT')
    ap.add_argument('--warmup', type=int, default=3)
    ap.add_argument('--iters', type=int, default=20)
    ap.add_argument('--device', default='cuda')
    ap.add_argument('--skip', default='', help='comma-separated rows to skip: plt,plt_torch,ce,ce_fused,ce_xK,plt_inplace')
    ap.add_argument('--json', default=None, help='default: $OUT/plt_loss_bench.json when $OUT is set')
    a = ap.parse_args()

    device = torch.device(a.device)
    if device.type == 'cuda':
        torch.cuda.set_device(device.index or 0)
    mpu = init_megatron_tp1(device)
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy
    from swift_plt.patch_level import IGNORE_INDEX
    from swift_plt.patch_level.loss import plt_token_losses

    P, B, V, K = a.P, a.B, a.V, a.K
    g = torch.Generator(device='cpu').manual_seed(0)
    logits = (torch.randn(P, B, V, generator=g) * 2).to(device=device, dtype=torch.bfloat16).requires_grad_(True)
    labels = torch.randint(0, V, (B, P * K), generator=g).to(device)  # token-aligned, like the plugin's batches
    labels[:, :K] = IGNORE_INDEX  # first patch: nothing predicts it (mask_first_patch)
    target = torch.randint(0, V, (P, B), generator=g).to(device)  # one target per row (token-level CE)
    target_k = labels.view(B, P, K).permute(1, 0, 2).roll(-1, dims=0).contiguous()  # [P, B, K], for ce_xK
    target_k[-1] = 0

    def ones_like(loss):
        return torch.ones_like(loss)

    impl = 'triton' if device.type == 'cuda' else 'torch'
    rows = {
        'plt': (f'plt_token_losses {impl} (K={K} targets/row)', lambda x: plt_token_losses(x, labels, K, impl=impl)),
        'plt_torch': (f'plt_token_losses torch reference (K={K})', lambda x: plt_token_losses(x, labels, K, impl='torch')),
        'ce': ('vocab_parallel_cross_entropy (1 target/row)', lambda x: vocab_parallel_cross_entropy(x, target)),
    }
    if device.type == 'cuda':  # torch.compile'd: on CPU inductor builds C++ for the CPU's vector ISA, not measured here
        try:
            from megatron.core.fusions.fused_cross_entropy import fused_vocab_parallel_cross_entropy
            tp_group = mpu.get_tensor_model_parallel_group()
            rows['ce_fused'] = ('fused_vocab_parallel_cross_entropy (1 target/row)',
                                lambda x: fused_vocab_parallel_cross_entropy(x, target, tp_group))
        except Exception as e:  # pragma: no cover
            print(f'[bench] fused CE unavailable: {e!r}')
    rows['ce_xK'] = (f'vocab_parallel_cross_entropy x{K} (naive PLT)',
                     lambda x: sum(vocab_parallel_cross_entropy(x, target_k[..., k]) for k in range(K)))
    if impl == 'triton':
        # as in the model (PLTGPTModel): the gradient written into the logits' storage. Last: it overwrites the
        # logits with gradients (the timing does not depend on the values).
        rows['plt_inplace'] = (f'plt_token_losses triton, in-place grad (K={K})',
                               lambda x: plt_token_losses(x, labels, K, impl=impl, inplace_grad=True))
    skip = {s.strip() for s in a.skip.split(',') if s.strip()}

    results = run_rows(rows, lambda fn: measure(fn, logits, ones_like, device, a.warmup, a.iters), skip)

    dev_name = torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'
    print(f'\nPLT loss benchmark on {dev_name}: logits [P={P}, B={B}, V={V}] bf16, K={K}, TP=1, '
          f'median of {a.iters} after {a.warmup} warm-up')
    print(f'{"row":<52} {"fwd ms":>9} {"fwd+bwd ms":>11} {"peak MiB":>10}')
    for key, r in results.items():
        if 'error' in r:
            print(f'{r["name"]:<52} ERROR {r["error"]}')
            continue
        peak = f'{r["peak_mib"]:.1f}' if r['peak_mib'] is not None else 'n/a'
        print(f'{r["name"]:<52} {r["fwd_ms_median"]:>9.3f} {r["fwd_bwd_ms_median"]:>11.3f} {peak:>10}')
    ratios = {
        'plt_over_ce_time': ratio(results, 'plt', 'ce', 'fwd_bwd_ms_median'),
        'plt_over_ce_peak_mem': ratio(results, 'plt', 'ce', 'peak_mib'),
        'plt_over_ce_fused_time': ratio(results, 'plt', 'ce_fused', 'fwd_bwd_ms_median'),
        'plt_over_ce_fused_peak_mem': ratio(results, 'plt', 'ce_fused', 'peak_mib'),
        'ce_xK_over_plt_time': ratio(results, 'ce_xK', 'plt', 'fwd_bwd_ms_median'),
        'ce_xK_over_plt_peak_mem': ratio(results, 'ce_xK', 'plt', 'peak_mib'),
        'plt_torch_over_ce_fused_time': ratio(results, 'plt_torch', 'ce_fused', 'fwd_bwd_ms_median'),
        'plt_torch_over_ce_fused_peak_mem': ratio(results, 'plt_torch', 'ce_fused', 'peak_mib'),
        'plt_inplace_over_ce_fused_time': ratio(results, 'plt_inplace', 'ce_fused', 'fwd_bwd_ms_median'),
        'plt_inplace_over_ce_fused_peak_mem': ratio(results, 'plt_inplace', 'ce_fused', 'peak_mib'),
    }

    print(f'BENCH PLT/CE time (fwd+bwd): {fmt(ratios["plt_over_ce_time"])}   '
          f'PLT/CE peak memory: {fmt(ratios["plt_over_ce_peak_mem"])}')
    print(f'BENCH PLT/CE_fused time: {fmt(ratios["plt_over_ce_fused_time"])}   '
          f'PLT/CE_fused peak memory: {fmt(ratios["plt_over_ce_fused_peak_mem"])}')
    print(f'BENCH PLT torch reference/CE_fused time: {fmt(ratios["plt_torch_over_ce_fused_time"])}   '
          f'peak memory: {fmt(ratios["plt_torch_over_ce_fused_peak_mem"])}')
    print(f'BENCH PLT triton in-place grad (model path)/CE_fused time: '
          f'{fmt(ratios["plt_inplace_over_ce_fused_time"])}   peak memory: '
          f'{fmt(ratios["plt_inplace_over_ce_fused_peak_mem"])}')
    print(f'BENCH naive K x CE / PLT time: {fmt(ratios["ce_xK_over_plt_time"])}   '
          f'naive K x CE / PLT peak memory: {fmt(ratios["ce_xK_over_plt_peak_mem"])}')

    path = json_path(a.json, 'plt_loss_bench.json')
    if path:
        with open(path, 'w') as f:
            json.dump({
                'device': dev_name,
                'torch': torch.__version__,
                'shape': {'P': P, 'B': B, 'V': V, 'K': K, 'dtype': 'bfloat16'},
                'warmup': a.warmup,
                'iters': a.iters,
                'results': results,
                'ratios': ratios,
            }, f, indent=2)
        print(f'[bench] wrote {path}')
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0 if all('error' not in results.get(k, {}) for k in ('plt', 'ce')) else 1


if __name__ == '__main__':
    sys.exit(main())
