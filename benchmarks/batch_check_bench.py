#!/usr/bin/env python3
"""Host-side cost of the K>1 batch checks of the training loop's main process, before and after (numpy).

    python benchmarks/batch_check_bench.py [--rows 8] [--seq 8192] [--k 4] [--reps 30]

``swift_plt.plt.check_patch_aligned`` + ``mask_first_patch`` run on every micro-batch's CPU position_ids / labels in
``get_batch_on_this_pp_rank`` (patches/swift_megatron_trainers_utils.py). On the H200 (2026-11-23, MBS 8, K=4,
8 x 8192 positions) they cost ~140 ms of CPU per step, 4-5 ms per torch op: torch CPU ops on more than 32768
elements run in its OpenMP pool, and that pool was larger than the free cores. Here each setting runs in its own
process: torch intra-op threads 1 and 2 (all cores), then 8 threads pinned to one core (oversubscribed), idle and
with a busy-loop process on the same core. ``before`` is the torch code of main 3491c3e (copied below), ``after``
the current swift_plt.plt (numpy on CPU tensors). Prints the median (and min) ms per call over ``--reps`` calls,
on realistic packed rows: documents of exponential length (mean 600 tokens) padded to multiples of K, then pad
positions (0) to the end of the row.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

IGNORE_INDEX = -100


def before_check(position_ids, k):  # swift_plt.plt.check_patch_aligned at main 3491c3e (raise -> bool)
    S = position_ids.shape[-1]
    pos = position_ids.reshape(-1, S // k, k)
    expected = pos[..., :1] + torch.arange(k, device=pos.device)
    ok = ((pos == expected) & (pos[..., :1] % k == 0)).all(-1) | (pos == 0).all(-1)
    return bool(ok.all())


def before_mask(labels, position_ids, k):  # swift_plt.plt.mask_first_patch at main 3491c3e
    return labels.masked_fill(position_ids < k, IGNORE_INDEX)


def packed_positions(rows, seq, k, seed=0, mean_doc=600):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(rows):
        r = []
        while True:
            n = int(torch.empty(1).exponential_(1 / mean_doc, generator=g)) + 1
            n = -(-n // k) * k
            if len(r) + n > seq - 64:
                break
            r.extend(range(n))
        out.append(r + [0] * (seq - len(r)))
    return torch.tensor(out, dtype=torch.int64)


def timed(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return round(ts[len(ts) // 2] * 1e3, 3), round(ts[0] * 1e3, 3)


def measure(a):
    """One setting (in this process): {'before': {...}, 'after': {...}}."""
    from swift_plt.plt import check_patch_aligned, mask_first_patch
    busy = None
    if a.pin is not None:
        os.sched_setaffinity(0, {a.pin})
    torch.set_num_threads(a.threads)
    if a.busy:
        loop = f'import os\nos.sched_setaffinity(0, {{{a.pin}}})\nwhile 1: pass'
        busy = subprocess.Popen([sys.executable, '-c', loop])
        time.sleep(0.3)
    try:
        pos = packed_positions(a.rows, a.seq, a.k)
        labels = torch.randint(0, 128256, pos.shape)
        assert before_check(pos, a.k)
        check_patch_aligned(pos, a.k)
        assert torch.equal(mask_first_patch(labels, pos, a.k), before_mask(labels, pos, a.k))
        res = {
            'before': {'check': timed(lambda: before_check(pos, a.k), a.reps),
                       'mask': timed(lambda: before_mask(labels, pos, a.k), a.reps)},
            'after': {'check': timed(lambda: check_patch_aligned(pos, a.k), a.reps),
                      'mask': timed(lambda: mask_first_patch(labels, pos, a.k), a.reps)},
            'threads': torch.get_num_threads(), 'cpus': sorted(os.sched_getaffinity(0))}
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    print(json.dumps(res))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--rows', type=int, default=8)
    ap.add_argument('--seq', type=int, default=8192)
    ap.add_argument('--k', type=int, default=4)
    ap.add_argument('--reps', type=int, default=30)
    ap.add_argument('--threads', type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument('--pin', type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument('--busy', action='store_true', help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.threads is not None:
        return measure(a)
    core = min(os.sched_getaffinity(0))
    settings = [('1 thread', ['--threads', '1']), ('2 threads', ['--threads', '2']),
                (f'8 threads on core {core}', ['--threads', '8', '--pin', str(core)]),
                (f'8 threads on core {core} + busy loop', ['--threads', '8', '--pin', str(core), '--busy'])]
    print(f'BATCHCHECK [{a.rows}, {a.seq}] int64 position_ids, K={a.k}, median (min) ms per call over {a.reps} calls; '
          f'{os.cpu_count()} cpus, loadavg {os.getloadavg()[0]:.1f}')
    base = [sys.executable, os.path.abspath(__file__), '--rows', str(a.rows), '--seq', str(a.seq), '--k', str(a.k),
            '--reps', str(a.reps)]
    for name, extra in settings:
        env = dict(os.environ, OMP_NUM_THREADS=extra[1])
        out = subprocess.run(base + extra, env=env, stdout=subprocess.PIPE, text=True, check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        b, f = r['before'], r['after']
        tot_b, tot_f = b['check'][0] + b['mask'][0], f['check'][0] + f['mask'][0]
        print(f'BATCHCHECK {name:30s} before: check {b["check"][0]:7.3f} ({b["check"][1]:.3f}) mask '
              f'{b["mask"][0]:6.3f} ({b["mask"][1]:.3f}) | after: check {f["check"][0]:6.3f} ({f["check"][1]:.3f}) '
              f'mask {f["mask"][0]:6.3f} ({f["mask"][1]:.3f}) | sum {tot_b:.3f} -> {tot_f:.3f} ms ({tot_b / tot_f:.1f}x)')


if __name__ == '__main__':
    main()
