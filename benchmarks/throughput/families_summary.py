#!/usr/bin/env python3
"""Figures of families.sh: per family, tokens/s of stock K=1 and PLT K=4 per round, their ratio per round, and the
noise floor (the spread of the same run across rounds), from the step probes and from ms-swift's own logs; per run
also the time from the built model to the end of step 1 (a cold Triton cache compiles there: compare round 1's stock
run with round 2's).

    python3 benchmarks/throughput/families_summary.py WORK [--warm 3] [--json OUT.json]

WORK is tput_launch.py's --work: WORK/probes/LABEL_{stock,plt4}_rR.jsonl (+ .meta.json) and WORK/runs/KEY/*/
logging.jsonl. Probe: step time = median interval of steps > warm (throughput_summary.run_figures), tokens/s = GBS *
max_length / step time. ms-swift: train_speed(s/it) is elapsed / steps, so the steps after `warm` took
speed_N * N - speed_warm * warm seconds (the figure ms-swift prints). Noise floor of a run: max/min - 1 of its
tokens/s over the rounds; a K=4/K=1 ratio moves by about the two runs' noise floors.
"""
import argparse
import glob
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput_summary import load, print_profile, profile_diff, run_figures  # noqa: E402

KINDS = ('stock', 'plt1', 'plt4')


def split_name(name):
    """'moe_plt4' -> ('moe', 'plt4'); None for names that are not LABEL_KIND."""
    label, _, kind = name.rpartition('_')
    return (label, kind) if label and kind in KINDS else None


def swift_tokens_per_s(run_dir, warm, tokens_per_step):
    """tokens/s from ms-swift's logging.jsonl of one run (None if fewer than warm + 1 logged steps)."""
    files = sorted(glob.glob(os.path.join(run_dir, '*', 'logging.jsonl'))) or sorted(
        glob.glob(os.path.join(run_dir, 'logging.jsonl')))
    by = {}
    for f in files[:1]:
        for line in open(f, encoding='utf-8'):
            try:
                row = json.loads(line)
            except ValueError:
                continue
            it, speed = row.get('iteration'), row.get('train_speed(s/it)')
            if it is None or speed is None:
                continue
            by[int(str(it).split('/')[0])] = float(speed)
    last = max(by) if by else 0
    if warm not in by or last <= warm:
        return None
    secs = by[last] * last - by[warm] * warm
    return tokens_per_step * (last - warm) / secs if secs > 0 else None


def spread(values):
    v = [x for x in values if x]
    return max(v) / min(v) - 1 if len(v) >= 2 else None


def summarize(work, warm):
    """{label: {'runs': {kind: {round: figures}}, 'ratio_per_round': [...], 'ratio_median', 'noise': {kind: spread},
    'swift_ratio_per_round': [...]}}."""
    out = {}
    for (name, rnd), (meta, rows) in sorted(load(os.path.join(work, 'probes')).items()):
        lk = split_name(meta.get('name') or name)
        if lk is None or rnd == 0:  # round 0: WARMUP's run, in no figure
            continue
        f = run_figures(rows, meta, warm, meta.get('gbs') or 0)
        if f is None:
            continue
        f.pop('mfu', None)  # throughput_summary's MFU is the Llama-1B formula
        f['swift_tokens_per_s'] = swift_tokens_per_s(os.path.join(work, 'runs', f'{name}_r{rnd}'), warm,
                                                     f['gbs'] * meta['max_length'])
        out.setdefault(lk[0], {'runs': {}})['runs'].setdefault(lk[1], {})[rnd] = f
    for label, d in out.items():
        runs = d['runs']
        for src, key in (('tokens_per_s', 'ratio_per_round'), ('swift_tokens_per_s', 'swift_ratio_per_round')):
            d[key] = [runs['plt4'][r][src] / runs['stock'][r][src] for r in sorted(runs.get('stock', {}))
                      if r in runs.get('plt4', {}) and runs['plt4'][r][src] and runs['stock'][r][src]]
        d['ratio_median'] = statistics.median(d['ratio_per_round']) if d['ratio_per_round'] else None
        d['noise'] = {k: spread([f['tokens_per_s'] for f in runs[k].values()]) for k in runs}
    return out


def first_step_s(f):
    """Seconds from the trainer's model built (weights loaded) to the end of step 1: the first step, the data
    iterator's start and what compiles at the first forward / backward (Triton kernels of a cold cache); None without
    the probe's turn record."""
    a, b = f.get('turn_to_step1_s'), f.get('turn_to_init_s')
    return None if a is None or b is None or b != b else a - b


def lines(summary):
    out = []
    for label, d in summary.items():
        for kind, by_round in d['runs'].items():
            for r, f in sorted(by_round.items()):
                sw = f['swift_tokens_per_s']
                first = first_step_s(f)
                out.append(f'TPUT {label} {kind:5s} round {r}: {f["tokens_per_s"]:>10,.0f} tokens/s (probe; step '
                           f'{f["step_s_median"] * 1e3:.1f} ms over {f["steps_timed"]} steps), ms-swift log '
                           f'{"n/a" if sw is None else format(sw, ",.0f")} tokens/s; max_length '
                           f'{f["tokens_per_s"] * f["step_s_median"] / f["gbs"]:.0f}, peak {f["max_mem_gib"]:.1f} GiB, '
                           f'step-1 loss {f["step1_loss"]!r}'
                           + ('' if first is None else f'; model built to step 1 done: {first:.1f} s'))
        noise = ', '.join(f'{k} {v * 100:.1f}%' for k, v in d['noise'].items() if v is not None) or 'n/a (one round)'
        rr = [round(x, 3) for x in d['ratio_per_round']]
        med = 'n/a' if d['ratio_median'] is None else f'{d["ratio_median"]:.3f}'
        out.append(f'TPUT ratio {label} plt4/stock tokens/s: median {med} per round {rr} (ms-swift logs: '
                   f'{[round(x, 3) for x in d["swift_ratio_per_round"]]}); noise floor (spread of a run over the '
                   f'rounds): {noise}')
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('work')
    ap.add_argument('--warm', type=int, default=3)
    ap.add_argument('--json', default=None)
    a = ap.parse_args(argv)
    s = summarize(a.work, a.warm)
    for line in lines(s):
        print(line)
    for label, d in s.items():  # PROFILE_STEP: the K=4 step against plt1's (if run) or stock's
        d['profile'] = profile_diff(os.path.join(a.work, 'probes'), k4=f'{label}_plt4',
                                    k1=f'{label}_plt1' if 'plt1' in d['runs'] else f'{label}_stock')
        print_profile(d['profile'], f' {label}')
    if not s:
        print(f'TPUT no timed family runs under {a.work}/probes')
    if a.json:
        with open(a.json, 'w') as f:
            json.dump(s, f, indent=1, default=str)
    return 0 if s and all(d['ratio_per_round'] for d in s.values()) else 1


if __name__ == '__main__':
    sys.exit(main())
