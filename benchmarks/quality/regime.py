"""Regime map: when does two-stage PLT pay? (b) against (a½) over tokens per non-embedding parameter.

    python benchmarks/quality/regime.py RESULTS.json [RESULTS.json ...] [--png regime.png] [--md regime.md]
        [--by_compute loss_vs_compute.png]

Reads the results.json of one or more calls of run.py (several GPU calls; older files too: one N, seed 42) and
prints, per size and N, the held-out losses of
    (a)   token-level on N tokens                         (compute 1.0)
    (a½)  token-level on the first N/2 tokens, per seed    (compute 0.5)
    (b)   two-stage PLT, K=4, λ=2/3, on N tokens, per seed (compute ~0.5: λ/K + 1 - λ)
and (b) vs (a½) = loss(b) / loss(a½) - 1 for each seed run of both (the same seed: the same init and data order
seed), their mean and their spread (max - min over the seeds); (b) vs (a) likewise (the seeds (a) has). x = tokens
per non-embedding parameter = N / (params - embedding params) (make_models.py; the embedding matrix is tied, so it
is the input embedding and the LM head at once); of an MoE, per ACTIVE non-embedding parameter (those a token
uses: top-k of the experts; report.py counts its FLOPs so; the table also per total one). A run that did not finish
has no loss and is left out; (c) on N is the same run as (b) on 2N and is counted as that. Sweep variants (b_k2,
b_l12, ...) are listed against (a½) and (a) with their compute ratio (not equal compute).

What the points mean. Ours, (b) vs (a½): EQUAL COMPUTE (both ~0.5x of (a)): PLT on N tokens against token-level on
the first N/2 of them; below 0 = PLT pays at a fixed compute budget (and uses twice the data). Beside it, (b) vs (a):
EQUAL DATA, PLT at ~half the compute; below 0 = PLT is better and cheaper.
The paper's points (Shao et al., arXiv 2407.12665, the 370 M model): token-level and PLT (K=4, λ=2/3) trained on the
same D tokens of the Pile, PLT at ~0.5x the compute (EQUAL DATA, our (b) vs (a)). PatchTrain's scripts show this set-
up for D = 360 B: run_token.sh trains shards 00-29 for 135k steps of 2048-token blocks, run_patch.sh shards 00-19 at
patch level (90k steps) then 20-29 token-level (45k steps), the same tokens per step. At 370 M the paper reports PLT
worse than token-level at D = 45 B and 90 B, better at 180 B and 360 B (docs/quality.md; the figure's values were not
found in the sources available here, so the plot shows the SIGN only: a marker above 0 = PLT worse, below = better,
its height not to scale). Its x: D / 303.6 M non-embedding parameters (run_token.sh's config: 24 layers of 1024,
FFN 2752, 16 heads, vocabulary 32,000, untied embeddings: 369.1 M parameters, 65.5 M of them embedding and LM head).
"""
import argparse
import json
import os
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from variants import parse_run

# the paper's 370 M model (PatchTrain run_token.sh): hidden 1024, 24 layers, FFN 2752, vocab 32,000, untied
PAPER_HIDDEN, PAPER_LAYERS, PAPER_FFN, PAPER_VOCAB = 1024, 24, 2752, 32000
PAPER_NON_EMB = PAPER_LAYERS * (4 * PAPER_HIDDEN ** 2 + 3 * PAPER_HIDDEN * PAPER_FFN + 2 * PAPER_HIDDEN) + PAPER_HIDDEN
PAPER_PARAMS = PAPER_NON_EMB + 2 * PAPER_VOCAB * PAPER_HIDDEN
# (D tokens, sign of PLT vs token-level on the same D: +1 worse, -1 better); values not found, sign only
PAPER_370M = [(45e9, +1), (90e9, +1), (180e9, -1), (360e9, -1)]
MARKERS = {'tiny': 'o', 'tinyMoE': 'P', 'tinyHybrid': 'X', 'XS': 's', 'S': '^', 'M': 'D'}
STRUCTURES = {'tiny': 'dense Llama', 'tinyMoE': 'Qwen3-MoE, 8 experts top-2', 'tinyHybrid': 'Qwen3.5 hybrid'}


def load(paths):
    """Rows of finished runs: dicts size, run, N, seed, loss, non_emb (active), non_emb_total, setup, source (c on N
    -> b on 2N). Rows of continued pretraining (another corpus, a start model: continued.py) are left out."""
    out = []
    for path in paths:
        if os.path.isdir(path):
            path = os.path.join(path, 'results.json')
        with open(path) as f:
            d = json.load(f)
        meta = d['meta']
        for r in d['rows']:
            status = r.get('status') or ('done' if r.get('heldout_loss') is not None else 'not finished')
            if status != 'done' or r.get('heldout_loss') is None:
                continue
            if r.get('from_n') or (r.get('corpus') or 'A') != 'A':
                continue  # continued pretraining (continued.py): not a point of the map
            run, n = r['run'], r.get('N', meta.get('N'))
            base, K, lam = parse_run(run)
            if base == 'c':  # PLT on 2N: the same run as (b) on 2N
                run, n = 'b' + run[1:], 2 * n
            lr = meta.get('lr', {}).get(r['size'])
            out.append({'size': r['size'], 'run': run, 'N': n, 'seed': r.get('seed', 42),
                        'loss': r['heldout_loss'], 'non_emb_total': r['non_embedding_params'], 'K': K, 'lam': lam,
                        'non_emb': r.get('active_non_embedding_params') or r['non_embedding_params'],
                        'fpp': r.get('flops_per_position'),
                        'setup': (meta['T'], meta['G'], lr, meta.get('stage1_batch', 'tokens'), bool(meta.get('cpu')),
                                  (meta.get('kit') or {}).get('train_tokens')),
                        'source': path})
    return out


def index(rows):
    """{(size, run, N): {seed: loss}} (the first file's value when a run is in several) and the repeats."""
    idx, repeats = defaultdict(dict), []
    for r in rows:
        key = (r['size'], r['run'], r['N'])
        if r['seed'] in idx[key]:
            repeats.append(f"{r['size']}_{r['run']}_n{r['N']}_s{r['seed']} ({r['loss']:.4f} in {r['source']} "
                           f"not used: {idx[key][r['seed']]:.4f})")
            continue
        idx[key][r['seed']] = r['loss']
    return idx, repeats


def compare(num, den):
    """Per seed run of both: num/den - 1; mean, min, max and spread (max - min) over them (None without any)."""
    d = {s: num[s] / den[s] - 1 for s in sorted(num) if s in den}
    if not d:
        return {'per_seed': {}, 'mean': None, 'lo': None, 'hi': None, 'spread': None}
    v = list(d.values())
    return {'per_seed': d, 'mean': sum(v) / len(v), 'lo': min(v), 'hi': max(v), 'spread': max(v) - min(v)}


def regime_table(rows, run='b'):
    """One entry per size and N of a `run` (default b: K=4, λ=2/3) with losses of (a), (a½), (b) per seed and the
    comparisons; sorted by size (rows' order) and N."""
    idx, _ = index(rows)
    non_emb = {r['size']: (r['non_emb'], r.get('non_emb_total', r['non_emb'])) for r in rows}
    sizes = sorted({r['size'] for r in rows}, key=lambda s: (list(MARKERS).index(s) if s in MARKERS else 9, s))
    out = []
    for size in sizes:
        for n in sorted({k[2] for k in idx if k[0] == size and k[1] == run}):
            b = idx[(size, run, n)]
            a = idx.get((size, 'a', n), {})
            ah = idx.get((size, 'a', n // 2), {})
            out.append({'size': size, 'N': n, 'run': run, 'non_emb': non_emb[size][0], 'tpp': n / non_emb[size][0],
                        'non_emb_total': non_emb[size][1], 'tpp_total': n / non_emb[size][1],
                        'a': a, 'ah': ah, 'b': b, 'b_vs_ah': compare(b, ah), 'b_vs_a': compare(b, a)})
    return out


def check_setups(rows):
    """Warnings when one size's runs come from different set-ups (T, G, LR, stage-1 batch, CPU, kit)."""
    by = defaultdict(set)
    for r in rows:
        by[r['size']].add(r['setup'])
    return [f'{s}: runs of {len(v)} different set-ups (T, G, LR, stage1_batch, cpu, kit tokens): {sorted(v, key=str)}'
            for s, v in by.items() if len(v) > 1]


def pct(v):
    return '—' if v is None else f'{100 * v:+.2f} %'


def seeds_text(d):
    return ' / '.join(f'{v:.4f} ({s})' for s, v in sorted(d.items())) or '—'


def markdown(table, sweeps):
    lines = [('| size | N | tokens / non-emb. param (MoE: active) | total | (a) N | (a½) N/2 (seed) | (b) N (seed) | '
              '(b) vs (a½) per seed | (b) vs (a½) mean | spread (max − min) | (b) vs (a) mean |'),
             '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |']
    for e in table:
        c = e['b_vs_ah']
        per = ' / '.join(f'{pct(v)} ({s})' for s, v in c['per_seed'].items()) or '—'
        spread = '—' if len(c['per_seed']) < 2 else f"{100 * c['spread']:.2f} pp"
        lines.append(f"| {e['size']} | {e['N']:,} | {e['tpp']:.2f} | {e['tpp_total']:.2f} | "
                     f"{seeds_text(e['a'])} | {seeds_text(e['ah'])} | "
                     f"{seeds_text(e['b'])} | {per} | {pct(c['mean'])} | {spread} | {pct(e['b_vs_a']['mean'])} |")
    if sweeps:
        lines += ['', 'Sweeps (not equal compute: FLOP ratio λ/K + 1 − λ against (a); (a½) is 0.5):', '',
                  '| size | run | N | compute | loss (seed) | vs (a½) mean | vs (a) mean |',
                  '| --- | --- | ---: | ---: | ---: | ---: | ---: |']
        for e, ratio in sweeps:
            lines.append(f"| {e['size']} | {e['run']} | {e['N']:,} | {ratio:.3f} | {seeds_text(e['b'])} | "
                         f"{pct(e['b_vs_ah']['mean'])} | {pct(e['b_vs_a']['mean'])} |")
    return '\n'.join(lines) + '\n'


def plot(table, png):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(13, 6.2), sharex=True)
    panels = (('b_vs_ah', '(b) vs (a½): EQUAL COMPUTE (~0.5x of (a))\nPLT on N tokens vs token-level on N/2'),
              ('b_vs_a', '(b) vs (a): EQUAL DATA, PLT at ~0.5x compute\n(the comparison of the paper\'s points)'))
    for ax, (key, title) in zip(axes, panels):
        ys = []
        for size in dict.fromkeys(e['size'] for e in table):
            pts = [e for e in table if e['size'] == size and e[key]['mean'] is not None]
            if not pts:
                continue
            x = [e['tpp'] for e in pts]
            y = [100 * e[key]['mean'] for e in pts]
            err = [[100 * (e[key]['mean'] - e[key]['lo']) for e in pts],
                   [100 * (e[key]['hi'] - e[key]['mean']) for e in pts]]
            ne, nt = pts[0]['non_emb'], pts[0]['non_emb_total']
            what = f'{ne / 1e6:.3f} M of {nt / 1e6:.3f} M non-emb. params active' if nt != ne else \
                f'{ne / 1e6:.2f} M non-emb. params'
            ax.errorbar(x, y, yerr=err, marker=MARKERS.get(size, 'v'), ms=7, capsize=4, lw=1,
                        label=f'ours, {size} ({what}): mean over seeds, bar = min…max')
            ys += [100 * e[key][k] for e in pts for k in ('lo', 'hi')]
        lim = max([abs(v) for v in ys] + [2.0])
        h = 0.15 * lim
        for i, (d, sign) in enumerate(PAPER_370M):
            ax.plot([d / PAPER_NON_EMB], [sign * h], marker='^' if sign > 0 else 'v', color='0.35', ms=10, ls='none',
                    label=(f'paper, 370 M ({PAPER_NON_EMB / 1e6:.1f} M non-emb.), D = 45/90/180/360 B: SIGN ONLY '
                           '(PLT vs token-level on the same D, 0.5x compute): ▲ PLT worse, ▼ better; height not to '
                           'scale') if i == 0 else None)
            ax.annotate(f'{d / 1e9:g} B', (d / PAPER_NON_EMB, sign * h), textcoords='offset points',
                        xytext=(0, 9 if sign > 0 else -14), ha='center', fontsize=7, color='0.35')
        ax.axhline(0, ls='--', color='k', lw=1)
        ax.set_xscale('log')
        ax.set_xlabel('tokens per non-embedding parameter (ours: N; paper: D)')
        ax.set_ylabel('held-out loss difference (%)  (< 0: PLT better)')
        ax.set_title(title, fontsize=10)
        ax.set_ylim(-1.2 * lim, 1.2 * lim)
        ax.grid(alpha=0.3, which='both')
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc='lower center', fontsize=8, ncol=1, frameon=False)
    fig.suptitle('When does two-stage PLT (K=4, λ=2/3) pay? Held-out loss, our sizes and the paper\'s 370 M for '
                 'scale', fontsize=11)
    fig.tight_layout(rect=(0, 0.05 + 0.035 * len(labels), 1, 1))
    fig.savefig(png, dpi=110)
    return png


def compute(r):
    """Training FLOPs of a row: N x the compute ratio of its run (1 for (a), λ/K + 1 - λ for PLT) x its FLOPs per
    position (report.flops_per_position); None for rows without that figure."""
    return None if not r.get('fpp') else float(r['N'] * (r['lam'] / r['K'] + 1 - r['lam']) * r['fpp'])


def plot_by_compute(rows, png):
    """Held-out loss against training FLOPs, one panel per size: token-level (a) and PLT (b) at each N, mean over
    seeds with a min..max bar; each (b) is labelled with its difference to the token-level run of the same compute
    ((a) on N/2)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    idx, _ = index([r for r in rows if r['run'] in ('a', 'b') and compute(r)])
    sizes = list(dict.fromkeys(k[0] for k in idx))
    if not sizes:
        raise SystemExit('--by_compute: no (a) or (b) rows with flops_per_position')
    fpp = {r['size']: r['fpp'] for r in rows if r.get('fpp')}
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.6 * len(sizes), 4.8), sharex=True, sharey=True, squeeze=False)
    for ax, size in zip(axes[0], sizes):
        for run, label, marker in (('a', 'token-level (a)', 'o'), ('b', 'PLT K=4, λ=2/3 (b)', 's')):
            ns = sorted(n for s, r, n in idx if s == size and r == run)
            _, K, lam = parse_run(run)
            x = [compute({'N': n, 'K': K, 'lam': lam, 'fpp': fpp[size]}) for n in ns]
            v = [list(idx[(size, run, n)].values()) for n in ns]
            y = [sum(s) / len(s) for s in v]
            ax.errorbar(x, y, yerr=[[m - min(s) for m, s in zip(y, v)], [max(s) - m for m, s in zip(y, v)]],
                        marker=marker, capsize=3, lw=1.2, label=label)
            for n, xi, yi in zip(ns, x, y):
                ah = idx.get((size, 'a', n // 2)) if run == 'b' else None
                c = compare(idx[(size, run, n)], ah) if ah else None
                text = f'{n / 1e6:g} M' + (f"\n{100 * c['mean']:+.1f} %" if c and c['mean'] is not None else '')
                ax.annotate(text, (xi, yi), textcoords='offset points', xytext=(4, -22 if run == 'b' else 6),
                            fontsize=7)
        ax.set_xscale('log')
        ax.margins(x=0.15)
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        what = f'{STRUCTURES[size]}, ' if size in STRUCTURES else ''
        ax.set_title(f'{size} ({what}{fpp[size] / 1e6:.2f} M FLOPs / position)', fontsize=9)
        ax.set_xlabel('training FLOPs')
        ax.grid(alpha=0.3, which='both')
    axes[0][0].set_ylabel('held-out loss')
    axes[0][0].legend(fontsize=8)
    fig.suptitle('Held-out loss against compute; N = tokens of the run, % = (b) vs token-level at the same compute '
                 '((a) on N/2)', fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    return png


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('results', nargs='+', help='results.json files (or the folders that hold them)')
    ap.add_argument('--png', default='regime.png')
    ap.add_argument('--md', default=None, help='also write the table here')
    ap.add_argument('--by_compute', default=None, metavar='PNG',
                    help='also plot held-out loss against training FLOPs, a panel per size (rows with '
                         'flops_per_position)')
    a = ap.parse_args(argv)
    rows = load(a.results)
    if not rows:
        raise SystemExit('no finished runs in ' + ', '.join(a.results))
    table = regime_table(rows)
    sweeps = []
    for run in sorted({r['run'] for r in rows if parse_run(r['run'])[0] == 'b' and r['run'] != 'b'}):
        _, K, lam = parse_run(run)
        sweeps += [(e, float(lam / K + 1 - lam)) for e in regime_table(rows, run)]
    _, repeats = index(rows)
    md = markdown(table, sweeps)
    notes = check_setups(rows)
    if repeats:
        notes.append('runs in more than one file (the first used): ' + '; '.join(repeats))
    md += ''.join(f'\nNote: {n}' for n in notes) + ('\n' if notes else '')
    md += (f'\nPaper (370 M, {PAPER_PARAMS / 1e6:.1f} M params, {PAPER_NON_EMB / 1e6:.1f} M non-emb.): PLT vs '
           'token-level on the same D (0.5x compute): worse at D = 45 B, 90 B (' +
           ', '.join(f'{d / PAPER_NON_EMB:.0f}' for d, _ in PAPER_370M[:2]) + ' tokens/non-emb. param), better at '
           '180 B, 360 B (' + ', '.join(f'{d / PAPER_NON_EMB:.0f}' for d, _ in PAPER_370M[2:]) + '); sign only.\n')
    print(md)
    if a.md:
        with open(a.md, 'w') as f:
            f.write(md)
    try:
        print(f'plot: {plot(table, a.png)}')
        if a.by_compute:
            print(f'plot: {plot_by_compute(rows, a.by_compute)}')
    except ImportError:
        print('matplotlib missing: no plot')
    return 0


if __name__ == '__main__':
    sys.exit(main())
