"""Continued pretraining: a model trained token-level on corpus A is continued on corpus B. Does two-stage PLT help
or damage it?

    python benchmarks/quality/continued.py RESULTS.json [RESULTS.json ...] [--md continued.md] [--png continued.png]

Reads the results.json of one or more run.py calls with --continue_from (a file, or the folder holding it; the same
job in two files: the first file's value counts) and writes, per size, start model and N_B (the continuation's N),
a table of
    start   (a) on N_A tokens of A (the start model; compute column: N_A / N_B)
    (a)     token-level on N_B tokens of B, from the start model                         (compute 1.0)
    (a½)    token-level on the first N_B/2 tokens of B                                   (compute 0.5)
    token-level on other N of B from the same start (points of the token-level curve)   (compute N / N_B)
    (b)     two-stage PLT on N_B tokens of B, K=4, λ=2/3, stage 1 from the start model   (compute ~0.5)
    (b′)    other two-stage variants on N_B (e.g. b_k2_l13: K=2, λ=1/3, compute ~0.83)
    (c)     two-stage PLT on 2 N_B tokens of B                                           (compute ~1.0)
with columns: compute vs (a) (training FLOPs of the continuation / those of (a); report.py's count), held-out B and
held-out A (mean over seeds; the seeds' values in brackets), ΔB vs (a) and vs (a½) (loss_B(run) / loss_B(ref) - 1
per seed, the same seed = the same start model and data order; mean, and the seeds' range in brackets: below 0 = the
run is better on B), ΔA vs start (loss_A(run) / loss_A(start) - 1 per seed: forgetting of A; above 0 = forgot), and
ΔB / ΔA against token-level training at the same compute (per seed, linear interpolation of that seed's token-level
curve: the start at compute 0 and every token-level run on B; none outside the curve's range).
A second table gives, per two-stage run, the end of stage 1 (the patch-level train loss) and the token-level train
loss right after the switch (the first 5 logged steps of stage 2), beside (a)'s first logged losses on B (the start
model's loss on B data). The plot: held-out B and held-out A against compute, per size (the start model at 0).
Runs that did not finish have no loss and are left out.
"""
import argparse
import json
import os
import sys
from collections import defaultdict
from fractions import Fraction

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from variants import parse_run, run_label  # noqa: E402


def load(paths):
    """(rows, repeats): the finished rows of continuation calls (continuations and the start models they name),
    each job once (the first file's), as dicts of results.json plus 'source'."""
    out, seen, repeats = [], {}, []
    for path in paths:
        if os.path.isdir(path):
            path = os.path.join(path, 'results.json')
        with open(path) as f:
            d = json.load(f)
        rows = d['rows']
        starts = {r['start'] for r in rows if r.get('from_n')}
        for r in rows:
            if not (r.get('from_n') or r['job'] in starts):
                continue
            status = r.get('status') or 'not finished'
            if status != 'done':
                continue
            if r['job'] in seen:  # a start model reused by a later call is scored again: noted only if it differs
                if r.get('heldout') != seen[r['job']][1]:
                    repeats.append(f"{r['job']} (in {seen[r['job']][0]} and {path})")
                continue
            seen[r['job']] = (path, r.get('heldout'))
            out.append(dict(r, source=path))
    return out, repeats


def nominal_ratio(run):
    """Planned compute of a run relative to (a) on the same N: λ/K + 1 - λ for (b), twice that for (c)."""
    base, K, lam = parse_run(run)
    if base == 'a':
        return Fraction(1)
    r = lam / K + 1 - lam
    return r if base == 'b' else 2 * r


def token_key(key):
    """True for the keys of token-level rows: 'start', 'a', 'ah' and 'a@N' (token-level on another N of B)."""
    return key in ('start', 'a', 'ah') or key.startswith('a@')


def groups(rows):
    """{(size, corpus, N_A, N_B): {'start': {seed: row}, run key: {seed: row}}}; run keys: 'a', 'ah' (a on N_B/2),
    'a@N' (a on another N) and the two-stage run names. N_B: the N of the two-stage runs of the same start (else of
    (a))."""
    by_start = defaultdict(list)
    for r in rows:
        if r.get('from_n'):
            by_start[(r['size'], r['corpus'], r['from_n'])].append(r)
    starts = {r['job']: r for r in rows if not r.get('from_n')}
    out = {}
    for (size, corpus, n_a), rs in by_start.items():
        ns = sorted({r['N'] for r in rs if r['run'] != 'a'}) or [max(r['N'] for r in rs)]
        for n in ns:
            g = defaultdict(dict)
            for r in rs:
                if r['run'] == 'a' and r['N'] == n:
                    g['a'][r['seed']] = r
                elif r['run'] == 'a' and 2 * r['N'] == n:
                    g['ah'][r['seed']] = r
                elif r['run'] == 'a':
                    g[f"a@{r['N']}"][r['seed']] = r
                elif r['run'] != 'a' and r['N'] == n:
                    g[r['run']][r['seed']] = r
                if r['start'] in starts:
                    g['start'][r['seed']] = starts[r['start']]
            out[(size, corpus, n_a, n)] = dict(g)
    return out


def run_order(keys):
    """start, a, ah, the other token-level runs by N, b, the other b variants, c, the other c variants."""
    def key(k):
        if k in ('start', 'a', 'ah'):
            return (('start', 'a', 'ah').index(k), 0, '')
        if k.startswith('a@'):
            return (3, int(k[2:]), '')
        base = parse_run(k)[0]
        return (4 if base == 'b' else 5, 0, '' if k == base else k)
    return sorted(keys, key=key)


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _rel(run_rows, ref_rows, corpus):
    """{seed: loss(run) / loss(ref) - 1} over the seeds both have (held-out ``corpus``)."""
    out = {}
    for s, r in run_rows.items():
        ref = ref_rows.get(s)
        x, y = (r.get('heldout') or {}).get(corpus), ((ref or {}).get('heldout') or {}).get(corpus)
        if x is not None and y:
            out[s] = x / y - 1
    return out


def interpolate(points, x):
    """The value at ``x`` of the piecewise linear curve through ``points`` ((x, y), any order); None outside."""
    pts = sorted(points)
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 - 1e-9 <= x <= x1 + 1e-9:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (min(max(x, x0), x1) - x0) / (x1 - x0)
    return None


def _compute(k, r, ref):
    """Compute of row ``r`` relative to (a) ``ref`` of its seed: FLOPs, else steps (token-level), else the plan."""
    if ref and r.get('flops') and ref.get('flops'):
        return r['flops'] / ref['flops']
    if ref and token_key(k):
        return r['a_iters'] / ref['a_iters']
    return None if token_key(k) else float(nominal_ratio(k))


def _vs_token_level(g, key, which):
    """{seed: loss(run) / loss(token-level at the run's compute) - 1} of run ``key`` on held-out ``which`` (per seed:
    the start at compute 0 and every token-level continuation of that seed; seeds outside the curve left out)."""
    a = g.get('a', {})
    out = {}
    for s, r in g[key].items():
        ref = a.get(s)
        x, y = _compute(key, r, ref) if ref else None, (r.get('heldout') or {}).get(which)
        curve = [(0.0, (g.get('start', {}).get(s, {}).get('heldout') or {}).get(which))]
        curve += [(_compute(k, g[k][s], ref), (g[k][s].get('heldout') or {}).get(which))
                  for k in g if k != 'start' and token_key(k) and s in g[k]]
        curve = [(cx, cy) for cx, cy in curve if cx is not None and cy is not None]
        t = interpolate(curve, x) if x is not None and y is not None and len(curve) > 1 else None
        if t is not None:
            out[s] = y / t - 1
    return out


def table(g):
    """Rows of one group's table: dicts key, label, compute, B / A {'mean', 'seeds'}, dB_a, dB_ah, dA_start, dB_eq,
    dA_eq ({'mean', 'lo', 'hi', 'per_seed'} or None; _eq: against token-level at the same compute)."""
    a = g.get('a', {})
    out = []
    for k in run_order(g):
        rs = g[k]
        comp = [_compute(k, r, a.get(s) or next(iter(a.values()), None)) for s, r in rs.items()]

        def summary(d):
            if not d:
                return None
            v = list(d.values())
            return {'mean': sum(v) / len(v), 'lo': min(v), 'hi': max(v), 'per_seed': d}

        row = {'key': k, 'seeds': sorted(rs), 'compute': _mean(comp),
               'B': {s: (r.get('heldout') or {}).get('B') for s, r in sorted(rs.items())},
               'A': {s: (r.get('heldout') or {}).get('A') for s, r in sorted(rs.items())}}
        row['B_mean'], row['A_mean'] = _mean(row['B'].values()), _mean(row['A'].values())
        row['dB_a'] = summary(_rel(rs, a, 'B')) if k != 'a' else None
        row['dB_ah'] = summary(_rel(rs, g.get('ah', {}), 'B')) if k != 'ah' else None
        row['dA_start'] = summary(_rel(rs, g.get('start', {}), 'A')) if k != 'start' else None
        row['dB_eq'] = None if token_key(k) else summary(_vs_token_level(g, k, 'B'))
        row['dA_eq'] = None if token_key(k) else summary(_vs_token_level(g, k, 'A'))
        out.append(row)
    return out


def label(key, n_a, n_b, corpus):
    def tok(n):
        return f'{n / 1e6:g} M' if n >= 10**6 else f'{n:,}'
    if key == 'start':
        return f'start: (a) on {tok(n_a)} of A'
    if key == 'a':
        return f'(a) token-level, {tok(n_b)} of {corpus}'
    if key == 'ah':
        return f'(a½) token-level, {tok(n_b // 2)} of {corpus}'
    if key.startswith('a@'):
        return f'token-level, {tok(int(key[2:]))} of {corpus}'
    text = run_label(key).replace(', 2N', f', 2N = {tok(2 * n_b)} of {corpus}').replace(', N', f', {tok(n_b)} of '
                                                                                         f'{corpus}')
    return text if key in ('b', 'c') else text.replace('(b)', '(b′)').replace('(c)', '(c′)')


def _fmt_loss(mean, seeds):
    if mean is None:
        return '—'
    vals = [v for v in seeds.values() if v is not None]
    return f'{mean:.4f}' + (f" ({', '.join(f'{v:.4f}' for v in vals)})" if len(vals) > 1 else '')


def _fmt_rel(d):
    if d is None:
        return '—'
    n = len(d['per_seed'])
    return f"{d['mean']:+.2%}" + (f" ({d['lo']:+.2%} .. {d['hi']:+.2%})" if n > 1 else '')


def markdown(gs, repeats=()):
    lines = []
    for (size, corpus, n_a, n_b), g in sorted(gs.items()):
        t = table(g)
        seeds = sorted({s for r in t for s in r['seeds']})
        lines += [f'### {size}: start (a) on {n_a:,} tokens of A, continued on N_B = {n_b:,} tokens of {corpus} '
                  f"(seeds {', '.join(map(str, seeds))})", '',
                  f'| run | compute vs (a) | held-out {corpus} | held-out A | Δ{corpus} vs (a) | Δ{corpus} vs (a½) | '
                  f'ΔA vs start (forgetting) | Δ{corpus} vs token-level, same compute | ΔA vs token-level, same '
                  'compute |', '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |']
        for r in t:
            lines.append(f"| {label(r['key'], n_a, n_b, corpus)} | "
                         f"{'—' if r['compute'] is None else format(r['compute'], '.2f')} | "
                         f"{_fmt_loss(r['B_mean'], r['B'])} | {_fmt_loss(r['A_mean'], r['A'])} | "
                         f"{_fmt_rel(r['dB_a'])} | {_fmt_rel(r['dB_ah'])} | {_fmt_rel(r['dA_start'])} | "
                         f"{_fmt_rel(r['dB_eq'])} | {_fmt_rel(r['dA_eq'])} |")
        lines.append('')
        switch = [(k, s, row) for k in run_order(g) if not token_key(k) for s, row in sorted(g[k].items())]
        if switch:
            lines += [f'Stage switch ({size}, N_B = {n_b:,}): train losses on {corpus} (iteration: loss).', '',
                      '| run | seed | end of stage 1 (patch-level loss) | first logged stage-2 losses (token level) |',
                      '| --- | ---: | ---: | --- |']
            for k, s, row in switch:
                st = row.get('stages') or []
                end1 = st[0].get('final_train_loss') if st else None
                first2 = row.get('stage2_first_losses') or []
                lines.append(f"| {label(k, n_a, n_b, corpus)} | {s} | "
                             f"{'—' if end1 is None else format(end1, '.4f')} | "
                             f"{', '.join(f'{i}: {v:.4f}' for i, v in first2) or '—'} |")
            for s, row in sorted(g.get('a', {}).items()):
                first = row.get('first_losses') or []
                lines.append(f"| {label('a', n_a, n_b, corpus)}: its first logged losses | {s} | — | "
                             f"{', '.join(f'{i}: {v:.4f}' for i, v in first) or '—'} |")
            lines.append('')
    lines.append('Compute: training FLOPs of the continuation / those of (a) (report.py; the start model\'s own '
                 'training not counted, its row: N_A / N_B). Δ: per seed against the same seed (the same start model'
                 ' and data order), mean (range over the seeds). ΔA vs start > 0: the run forgot A.')
    if repeats:
        lines.append(f"Repeated jobs (the first file's value counts): {'; '.join(repeats)}.")
    return '\n'.join(lines) + '\n'


def plot(gs, png):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    keys = sorted(gs)
    fig, axes = plt.subplots(len(keys), 2, figsize=(12, 4.2 * len(keys)), squeeze=False)
    colors = {'start': 'black', 'a': 'tab:blue', 'ah': 'tab:cyan', 'b': 'tab:orange', 'c': 'tab:green'}
    colors.update({k: 'tab:blue' for g in gs.values() for k in g if k.startswith('a@')})
    others = ('tab:red', 'tab:purple', 'tab:brown', 'tab:pink', 'tab:olive', 'tab:gray')
    for i, (size, corpus, n_a, n_b) in enumerate(keys):
        t = table(gs[(size, corpus, n_a, n_b)])
        for j, which in enumerate(('B', 'A')):
            ax = axes[i][j]
            name = corpus if which == 'B' else 'A'
            line = []
            for k, r in enumerate(t):
                c = colors.get(r['key']) or others[sum(1 for q in t[:k] if q['key'] not in colors) % len(others)]
                x = 0.0 if r['key'] == 'start' else r['compute']
                mean = r[f'{which}_mean']
                if mean is None or x is None:
                    continue
                if r['key'] == 'start':
                    ax.axhline(mean, color='gray', ls=':', lw=1)
                ax.plot([x] * len([v for v in r[which].values() if v is not None]),
                        [v for v in r[which].values() if v is not None], 'o', color=c, ms=4, alpha=0.5)
                ax.plot([x], [mean], marker='D' if token_key(r['key']) else '*', ms=11, color=c,
                        ls='', label=label(r['key'], n_a, n_b, corpus))
                if token_key(r['key']):
                    line.append((x, mean))
            if len(line) > 1:
                ax.plot(*zip(*sorted(line)), color='tab:blue', lw=1, alpha=0.6)
            ax.set_xlabel('training compute of the continuation / that of (a) (start model at 0)')
            ax.set_ylabel(f'held-out {name} loss (nats/token)')
            ax.set_title(f'{size}: start (a) on {n_a:,} tokens of A, N_B = {n_b:,} of {corpus}: held-out {name}',
                         fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle('Continued pretraining on B from a token-level model of A: ◆ token-level (line: start → ... → (a)),'
                 ' ★ two-stage PLT; small dots: seeds; dotted: the start model', fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('results', nargs='+')
    ap.add_argument('--md', default=None)
    ap.add_argument('--png', default=None)
    a = ap.parse_args(argv)
    rows, repeats = load(a.results)
    gs = groups(rows)
    if not gs:
        print('continued.py: no finished continuation run in ' + ', '.join(a.results))
        return 1
    md = markdown(gs, repeats)
    print(md)
    if a.md:
        with open(a.md, 'w') as f:
            f.write(md)
    if a.png:
        try:
            plot(gs, a.png)
            print(f'plot: {a.png}')
        except ImportError:
            print('matplotlib missing: no plot')
    return 0


if __name__ == '__main__':
    sys.exit(main())
