#!/usr/bin/env python3
"""Figures of throughput_1b.sh from its step probes (step_probe/).

    python3 benchmarks/throughput/throughput_summary.py PROBE_DIR [--warm 3] [--gbs 16] [--json OUT.json]

PROBE_DIR holds NAME_rR.jsonl (one line per step: step, t_end, wall, loss, grad_norm, max_mem_gib) for NAME in stock,
plt1, plt4 (MBS 4) and stock_m8, plt1_m8, plt4_m8 (MBS 8) and rounds R, with NAME_rR.meta.json (base name, MBS, GBS,
max_length, K: written by tput_launch.py; older dirs without it: S and K from the name, GBS from --gbs),
NAME_rR.jsonl.turn.json (the probe's turn record: start-up, wait, turn-to-first-step times), launch.json (the
launcher's run states) and NAME_rR.jsonl.prof.json for profiled steps. Per run: step time = median of
t_end[i] - t_end[i-1] over steps i > warm (profiled steps left out); tokens/s = GBS * max_length / step time (2048 at
K=1, 8192 at K=4). Per MBS and round: ratios plt4/stock and plt1/stock of tokens/s, and plt1/stock of step time;
printed: the median over rounds and the spread (min..max).
MFU = positions/s * F / 989e12 (H100 and H200 SXM bf16 dense peak), positions = tokens (K=1) or patches (K=4, = tokens/4),
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

from run_order import fmt_cpus  # this directory (the scripts run as benchmarks/throughput/NAME.py)

SEQ = {'stock': 2048, 'plt1': 2048, 'plt4': 8192}
K = {'stock': 1, 'plt1': 1, 'plt4': 4}
N_PARAMS = 1_235_814_400
L, D, T = 16, 2048, 2048
FLOPS_PER_POSITION = 6 * N_PARAMS + 12 * L * D * T
PEAK = 989e12


def load(probe_dir):
    """{(name, round): (meta, rows)}: name as in the file name (``stock``, ``plt4_m8``, ...); meta from
    NAME_rR.meta.json (tput_launch.py: base name, mbs, gbs, max_length, k), else from the name (older probe dirs)."""
    runs = {}
    for f in sorted(glob.glob(os.path.join(probe_dir, '*_r*.jsonl'))):
        m = re.match(r'(\w+?)_r(\d+)\.jsonl$', os.path.basename(f))
        if not m:
            continue
        name, rnd = m.group(1), int(m.group(2))
        meta_f = f[:-len('.jsonl')] + '.meta.json'
        if os.path.exists(meta_f):
            meta = json.load(open(meta_f))
        else:
            base = name.split('_m')[0]
            meta = {'name': base, 'mbs': int(name.split('_m')[1]) if '_m' in name else 4, 'gbs': None,
                    'max_length': SEQ[base], 'k': K[base]}
        turn_f = f + '.turn.json'
        meta['turn'] = json.load(open(turn_f)) if os.path.exists(turn_f) else None
        rows = [json.loads(x) for x in open(f) if x.strip()]
        runs[(name, rnd)] = (meta, rows)
    return runs


def run_figures(rows, meta, warm, gbs):
    """Step time = median interval over steps > warm (profiled steps and the step after one left out);
    tokens/s = GBS * max_length / step time; MFU from positions/s = tokens/s / K."""
    dts = [b['t_end'] - a['t_end'] for a, b in zip(rows, rows[1:])
           if b['step'] > warm and not b.get('profiled') and not a.get('profiled')]
    if not dts:
        return None
    gbs = meta.get('gbs') or gbs
    dt = statistics.median(dts)
    tps = gbs * meta['max_length'] / dt
    out = {
        'name': meta['name'],
        'mbs': meta['mbs'],
        'gbs': gbs,
        'k': meta['k'],
        'steps_timed': len(dts),
        'step_s_median': dt,
        'step_s_min': min(dts),
        'step_s_max': max(dts),
        'tokens_per_s': tps,
        'mfu': tps / meta['k'] * FLOPS_PER_POSITION / PEAK,
        'step1_loss': rows[0].get('loss') if rows and rows[0]['step'] == 1 else None,
        'losses': [r.get('loss') for r in rows],
        'max_mem_gib': max(r['max_mem_gib'] for r in rows),
    }
    t = meta.get('turn')
    if t:
        out['startup_s'] = t['wait_start'] - t['launch']
        out['wait_s'] = t['turn'] - t['wait_start']
        out['turn_to_init_s'] = t.get('init_done', float('nan')) - t['turn']
        if rows and rows[0]['step'] == 1 and 'wall' in rows[0]:
            out['turn_to_step1_s'] = rows[0]['wall'] - t['turn']
            out['turn_to_last_step_s'] = rows[-1]['wall'] - t['turn']
        out['cpus_after_turn'] = t.get('cpus_after')
    return out


def ratios_by_mbs(figs):
    """{mbs: {'plt4/stock': [per round], 'plt1/stock': [...], 'plt1/stock step time': [...], 'stock2/stock step
    time': [...]}}: each ratio of two runs of the same MBS and the same round; stock2 (the same stock run again) gives
    the noise floor the plt1/stock step-time ratio is read against."""
    out = {}
    keys = {(f['mbs'], r) for (n, r), f in figs.items() if f}
    for mbs, r in sorted(keys):
        by = {f['name']: f for (n, rr), f in figs.items() if f and rr == r and f['mbs'] == mbs}
        d = out.setdefault(mbs, {'plt4/stock': [], 'plt1/stock': [], 'plt1/stock step time': [],
                                 'stock2/stock step time': []})
        s, p1, p4, s2 = by.get('stock'), by.get('plt1'), by.get('plt4'), by.get('stock2')
        if s and s2:
            d['stock2/stock step time'].append(s2['step_s_median'] / s['step_s_median'])
        if s and p4:
            d['plt4/stock'].append(p4['tokens_per_s'] / s['tokens_per_s'])
        if s and p1:
            d['plt1/stock'].append(p1['tokens_per_s'] / s['tokens_per_s'])
            d['plt1/stock step time'].append(p1['step_s_median'] / s['step_s_median'])
    return out


def print_profile(prof, label=''):
    for field, d in (prof or {}).items():
        print(f'TPUT profile{label} {field}: K=4 step total {d["total_k4_ms"]:.1f} ms, K=1 step total '
              f'{d["total_k1_ms"]:.1f} ms; top differences (K4 - K1):')
        for t in d['top']:
            print(f'  {t["diff_ms"]:+9.2f} ms  K4 {t["k4_ms"]:8.2f} ({t["k4_count"]}x)  K1 {t["k1_ms"]:8.2f} '
                  f'({t["k1_count"]}x)  {t["name"]}')


def best_setting_ratios(figs):
    """Per round, each base name's fastest run over the micro-batch sizes it ran at (``plt4@16`` and ``plt4@8`` ...):
    {'plt4/stock': [...], 'stock2/stock': [...]} of tokens/s, with the MBS each ratio used. None when every name
    ran at a single MBS (ratios_by_mbs says it all)."""
    if len({f['mbs'] for f in figs.values() if f}) < 2:
        return None
    out = {'plt4/stock': [], 'stock2/stock': []}
    for r in sorted({rr for (n, rr), f in figs.items() if f and rr > 0}):
        best = {}
        for (n, rr), f in figs.items():
            if f and rr == r and (f['name'] not in best or f['tokens_per_s'] > best[f['name']]['tokens_per_s']):
                best[f['name']] = f
        for key in out:
            a, b = (best.get(x) for x in key.split('/'))
            if a and b:
                out[key].append((a['tokens_per_s'] / b['tokens_per_s'], a['mbs'], b['mbs']))
    return out


def _step_total(rows, field):
    """A profiled step's total of ``field`` in ms; device time over the kernel rows (no CPU time of their own)
    where there are any: an op's self device time repeats that of the kernels it launched."""
    if field == 'self_device_us':
        kernels = [r[field] for r in rows.values() if not r.get('self_cpu_us') and r.get(field)]
        if kernels:
            return sum(kernels) / 1e3
    return sum(r.get(field, 0) for r in rows.values()) / 1e3


def profile_diff(probe_dir, top=12, k4='plt4', k1='plt1'):
    """The profiled step of run ``k4`` against run ``k1`` (torch.profiler key_averages): totals and the top
    differences of self device and CPU time; None unless both were profiled."""
    def rows_of(name):
        fs = sorted(glob.glob(os.path.join(probe_dir, f'{name}_r*.jsonl.prof.json')) +
                    glob.glob(os.path.join(probe_dir, f'{name}_mb*_r*.jsonl.prof.json')))  # name@MBS runs
        if not fs:
            return None
        return {r['name']: r for r in json.load(open(fs[0]))['rows']}

    a, b = rows_of(k4), rows_of(k1)
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
            'total_k4_ms': _step_total(a, field),
            'total_k1_ms': _step_total(b, field),
            'top': [dict(name=n[:90], diff_ms=d / 1e3, k4_ms=va / 1e3, k1_ms=vb / 1e3, k4_count=ca, k1_count=cb)
                    for d, n, va, vb, ca, cb in diffs[:top]],
        }
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument('probe_dir')
    ap.add_argument('--warm', type=int, default=3)
    ap.add_argument('--gbs', type=int, default=16, help='for probe dirs without .meta.json')
    ap.add_argument('--json', default=None)
    a = ap.parse_args(argv)
    runs = load(a.probe_dir)
    figs = {}
    launch_f = os.path.join(a.probe_dir, 'launch.json')
    launch = json.load(open(launch_f)) if os.path.exists(launch_f) else None
    order = {r['key']: r['idx'] for r in launch['runs']} if launch else {}
    for (name, r), (meta, rows) in sorted(runs.items(), key=lambda x: (order.get(f'{x[0][0]}_r{x[0][1]}', 0),
                                                                       x[0][1], x[0][0])):
        f = run_figures(rows, meta, a.warm, a.gbs)
        figs[(name, r)] = f
        if f is None:
            print(f'TPUT {name} round {r}: no timed steps ({len(rows)} probed)')
            continue
        print(f'TPUT {name:8s} round {r} mbs {f["mbs"]}: {f["tokens_per_s"]:>9,.0f} tokens/s  step '
              f'{f["step_s_median"] * 1e3:7.1f} ms (min {f["step_s_min"] * 1e3:.1f}, max {f["step_s_max"] * 1e3:.1f}, '
              f'{f["steps_timed"]} steps)  MFU {f["mfu"] * 100:5.1f}%  step-1 loss {f["step1_loss"]!r}  '
              f'peak {f["max_mem_gib"]:.1f} GiB')
        if 'startup_s' in f:
            print(f'TPUT {name:8s} round {r} times: start-up {f["startup_s"]:.1f} s, waited for the turn '
                  f'{f["wait_s"]:.1f} s, turn to end of __init__ {f["turn_to_init_s"]:.1f} s, turn to step 1 '
                  f'{f.get("turn_to_step1_s", float("nan")):.1f} s, to the last step '
                  f'{f.get("turn_to_last_step_s", float("nan")):.1f} s; '
                  f'cpus {fmt_cpus(f["cpus_after_turn"] or []) or "-"}')
    summary = {}
    for mbs, ratios in ratios_by_mbs(figs).items():
        for k, v in ratios.items():
            if v:
                summary[f'mbs{mbs} {k}'] = {'median': statistics.median(v), 'min': min(v), 'max': max(v),
                                            'per_round': v}
                print(f'TPUT ratio mbs {mbs} {k}: median {statistics.median(v):.3f} over {len(v)} round(s), spread '
                      f'{min(v):.3f}..{max(v):.3f}  per round {[round(x, 3) for x in v]}')
    for k, v in (best_setting_ratios(figs) or {}).items():
        if v:
            vals = [x for x, _, _ in v]
            summary[f'best {k}'] = {'median': statistics.median(vals), 'min': min(vals), 'max': max(vals),
                                    'per_round': vals, 'mbs': [[a, b] for _, a, b in v]}
            print(f'TPUT ratio best setting {k}: median {statistics.median(vals):.3f} over {len(v)} round(s), '
                  f'spread {min(vals):.3f}..{max(vals):.3f}  per round '
                  f'{[f"{x:.3f} (mbs {a} vs {b})" for x, a, b in v]}')
    same_loss = []
    for (name, r), f in sorted(figs.items(), key=lambda x: (x[0][1], x[0][0])):
        if f and f['name'] == 'plt1':
            s = next((g for (n, rr), g in figs.items() if g and rr == r and g['name'] == 'stock'
                      and g['mbs'] == f['mbs']), None)
            if s:
                same_loss.append(s['step1_loss'] == f['step1_loss'])
                print(f'TPUT step-1 loss round {r} mbs {f["mbs"]}: stock {s["step1_loss"]!r} plt1 '
                      f'{f["step1_loss"]!r} identical={s["step1_loss"] == f["step1_loss"]}')
    print(f'TPUT MFU formula: positions/s * (6*N + 12*L*d*T) / 989e12 (H100/H200 SXM bf16 dense peak), '
          f'N={N_PARAMS:,}, L={L}, d={D}, T={T}: {FLOPS_PER_POSITION / 1e9:.3f} GFLOP per position; '
          f'K=4: positions = tokens/4')
    if launch:
        states = {}
        for r in launch['runs']:
            states.setdefault(r['state'], []).append(r['key'])
        print(f'TPUT launcher: lookahead {launch["lookahead"]}, at most {launch["max_alive_seen"]} processes alive, '
              f'train cpus {launch["train_cpus"]}, start cpus {launch["start_cpus"]}, dataset_num_proc '
              f'{launch["dataset_num_proc"]}; ' + '; '.join(f'{k}: {" ".join(v)}' for k, v in states.items()))
    prof = profile_diff(a.probe_dir)
    print_profile(prof)
    if a.json:
        with open(a.json, 'w') as f:
            json.dump({'runs': {f'{n}_r{r}': v for (n, r), v in figs.items()}, 'ratios': summary,
                       'step1_loss_identical': same_loss, 'profile': prof, 'launch': launch,
                       'flops_per_position': FLOPS_PER_POSITION, 'peak': PEAK}, f, indent=1)
    return figs, summary


if __name__ == '__main__':
    main()
