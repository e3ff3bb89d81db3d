#!/usr/bin/env python3
"""Figures of benchmarks/throughput_1b.sh from its step probes (benchmarks/step_probe).

    python3 benchmarks/throughput_summary.py PROBE_DIR [--warm 8] [--gbs 16] [--json OUT.json]

PROBE_DIR holds NAME_rR.jsonl (one line per step: step, t_end, loss, grad_norm, max_mem_gib) for NAME in stock, plt1,
plt4 and rounds R, and NAME_rR.jsonl.prof.json for profiled steps. Per run: step time = median of t_end[i] - t_end[i-1]
over steps i > warm (and not profiled); tokens/s = gbs * S / step time (S = 2048 for stock and plt1, 8192 for plt4).
Per round: ratios plt4/stock and plt1/stock of tokens/s; printed: the median over rounds and the spread (min..max).
MFU = positions/s * F / 989e12 (H100 SXM bf16 dense peak), positions = tokens (K=1) or patches (K=4, = tokens/4),
F = 6 * N + 12 * L * d * T: N = 1,235,814,400 (all Llama-3.2-1B parameters: the tied embedding counts once, as the
LM-head matmul; its lookup is not a matmul), L = 16 layers, d = 2048, T = 2048 positions per sequence (PaLM's
convention: attention over the full length, causal and document masks ignored).
Profile: the K=4 step against the K=1 step (torch.profiler key_averages): top differences in self device time and
self CPU time.
"""
import argparse
import glob
import json
import os
import re
import statistics

SEQ = {'stock': 2048, 'plt1': 2048, 'plt4': 8192}
K = {'stock': 1, 'plt1': 1, 'plt4': 4}
N_PARAMS = 1_235_814_400
L, D, T = 16, 2048, 2048
FLOPS_PER_POSITION = 6 * N_PARAMS + 12 * L * D * T
PEAK = 989e12


def load(probe_dir):
    runs = {}
    for f in sorted(glob.glob(os.path.join(probe_dir, '*_r*.jsonl'))):
        m = re.match(r'(\w+?)_r(\d+)\.jsonl$', os.path.basename(f))
        if not m:
            continue
        rows = [json.loads(x) for x in open(f) if x.strip()]
        runs[(m.group(1), int(m.group(2)))] = rows
    return runs


def run_figures(rows, name, warm, gbs):
    dts = [b['t_end'] - a['t_end'] for a, b in zip(rows, rows[1:])
           if b['step'] > warm and not b.get('profiled') and not a.get('profiled')]
    if not dts:
        return None
    dt = statistics.median(dts)
    tps = gbs * SEQ[name] / dt
    return {
        'steps_timed': len(dts),
        'step_s_median': dt,
        'step_s_min': min(dts),
        'step_s_max': max(dts),
        'tokens_per_s': tps,
        'mfu': tps / K[name] * FLOPS_PER_POSITION / PEAK,
        'step1_loss': rows[0].get('loss') if rows and rows[0]['step'] == 1 else None,
        'losses': [r.get('loss') for r in rows],
        'max_mem_gib': max(r['max_mem_gib'] for r in rows),
    }


def profile_diff(probe_dir, top=12):
    def rows_of(name):
        fs = glob.glob(os.path.join(probe_dir, f'{name}_r*.jsonl.prof.json'))
        if not fs:
            return None
        return {r['name']: r for r in json.load(open(fs[0]))['rows']}

    a, b = rows_of('plt4'), rows_of('plt1')
    if a is None or b is None:
        return None
    out = {}
    for field in ('self_device_us', 'self_cpu_us'):
        diffs = []
        for name in set(a) | set(b):
            va, vb = (a.get(name) or {}).get(field, 0), (b.get(name) or {}).get(field, 0)
            diffs.append((va - vb, name, va, vb, (a.get(name) or {}).get('count', 0), (b.get(name) or {}).get('count', 0)))
        diffs.sort(key=lambda x: -abs(x[0]))
        out[field] = {
            'total_k4_ms': sum(r.get(field, 0) for r in a.values()) / 1e3,
            'total_k1_ms': sum(r.get(field, 0) for r in b.values()) / 1e3,
            'top': [dict(name=n[:90], diff_ms=d / 1e3, k4_ms=va / 1e3, k1_ms=vb / 1e3, k4_count=ca, k1_count=cb)
                    for d, n, va, vb, ca, cb in diffs[:top]],
        }
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('probe_dir')
    ap.add_argument('--warm', type=int, default=8)
    ap.add_argument('--gbs', type=int, default=16)
    ap.add_argument('--json', default=None)
    a = ap.parse_args()
    runs = load(a.probe_dir)
    figs = {}
    for (name, r), rows in sorted(runs.items(), key=lambda x: (x[0][1], x[0][0])):
        f = run_figures(rows, name, a.warm, a.gbs)
        figs[f'{name}_r{r}'] = f
        if f is None:
            print(f'TPUT {name} round {r}: no timed steps ({len(rows)} probed)')
            continue
        print(f'TPUT {name:5s} round {r}: {f["tokens_per_s"]:>9,.0f} tokens/s  step {f["step_s_median"] * 1e3:7.1f} ms '
              f'(min {f["step_s_min"] * 1e3:.1f}, max {f["step_s_max"] * 1e3:.1f}, {f["steps_timed"]} steps)  '
              f'MFU {f["mfu"] * 100:5.1f}%  step-1 loss {f["step1_loss"]!r}  peak {f["max_mem_gib"]:.1f} GiB')
    rounds = sorted({r for _, r in runs})
    ratios = {'plt4/stock': [], 'plt1/stock': [], 'plt1/stock step time': []}
    for r in rounds:
        s, p1, p4 = (figs.get(f'{n}_r{r}') for n in ('stock', 'plt1', 'plt4'))
        if s and p4:
            ratios['plt4/stock'].append(p4['tokens_per_s'] / s['tokens_per_s'])
        if s and p1:
            ratios['plt1/stock'].append(p1['tokens_per_s'] / s['tokens_per_s'])
            ratios['plt1/stock step time'].append(p1['step_s_median'] / s['step_s_median'])
    summary = {}
    for k, v in ratios.items():
        if v:
            summary[k] = {'median': statistics.median(v), 'min': min(v), 'max': max(v), 'per_round': v}
            print(f'TPUT ratio {k}: median {statistics.median(v):.3f} over {len(v)} round(s), spread {min(v):.3f}..'
                  f'{max(v):.3f}  per round {[round(x, 3) for x in v]}')
    same_loss = []
    for r in rounds:
        s, p1 = figs.get(f'stock_r{r}'), figs.get(f'plt1_r{r}')
        if s and p1:
            same_loss.append(s['step1_loss'] == p1['step1_loss'])
            print(f'TPUT step-1 loss round {r}: stock {s["step1_loss"]!r} plt1 {p1["step1_loss"]!r} '
                  f'identical={s["step1_loss"] == p1["step1_loss"]}')
    print(f'TPUT MFU formula: positions/s * (6*N + 12*L*d*T) / 989e12, N={N_PARAMS:,}, L={L}, d={D}, T={T}: '
          f'{FLOPS_PER_POSITION / 1e9:.3f} GFLOP per position; K=4: positions = tokens/4')
    prof = profile_diff(a.probe_dir)
    if prof:
        for field, d in prof.items():
            print(f'TPUT profile {field}: K=4 step total {d["total_k4_ms"]:.1f} ms, K=1 step total '
                  f'{d["total_k1_ms"]:.1f} ms; top differences (K4 - K1):')
            for t in d['top']:
                print(f'  {t["diff_ms"]:+9.2f} ms  K4 {t["k4_ms"]:8.2f} ({t["k4_count"]}x)  K1 {t["k1_ms"]:8.2f} '
                      f'({t["k1_count"]}x)  {t["name"]}')
    if a.json:
        with open(a.json, 'w') as f:
            json.dump({'runs': figs, 'ratios': summary, 'step1_loss_identical': same_loss, 'profile': prof,
                       'flops_per_position': FLOPS_PER_POSITION, 'peak': PEAK}, f, indent=1)


if __name__ == '__main__':
    main()
