#!/usr/bin/env python3
"""Summary lines for tests/gpu/run_all.sh from `megatron pt` output dirs (logging.jsonl) and logs.

    summarize.py curve   LABEL RUN_DIR LOG                       first/last loss, falling?
    summarize.py compare TOL REF_LABEL=REF_DIR LABEL=DIR ...     step-1 loss of each, relative diffs to the reference
    summarize.py same    LABEL_A=DIR_A LABEL_B=DIR_B              loss / grad_norm strings identical at every step?
    summarize.py close   RTOL LABEL_A=DIR_A LABEL_B=DIR_B         loss / grad_norm within RTOL (relative) at every step?
    summarize.py agree   RTOL MIN A=DIR B=DIR CTRL=DIR            A = B bit for bit wherever B = CTRL (>= MIN steps), else
                                                                  within RTOL
    summarize.py tps     LABEL=DIR:TOKENS_PER_STEP ... [--warm N]  tokens/s over the steps after warm-up, ratios

RUN_DIR is the --output_dir of the run (logging.jsonl sits in its v*-<time>/ subfolder); it holds `rc` and `secs`
written by run_all.sh, and `gpu` (which card ran it) where the script wrote one; with $LOGDIR set, a failed run's last error line is taken from $LOGDIR/<basename RUN_DIR>.log. Values are compared as the exact strings ms-swift printed (logging.jsonl holds the same
repr as the console line; ms-swift rounds floats to 8 decimals, finer than an fp32 ulp of a loss around 1-10).
"""
import glob
import json
import os
import re
import sys

KEY_RE = {k: re.compile(r'"%s":\s*([^,}]+)' % re.escape(k)) for k in ('loss', 'grad_norm', 'iteration',
                                                                       'train_speed(s/it)', 'memory(GiB)')}


def read_rows(run_dir):
    """[(raw line dict of strings)] for each logged training step, in order."""
    files = sorted(glob.glob(os.path.join(run_dir, '*', 'logging.jsonl'))) or sorted(
        glob.glob(os.path.join(run_dir, 'logging.jsonl')))
    rows = []
    for f in files[:1]:
        for line in open(f, encoding='utf-8'):
            line = line.strip()
            if not line or '"loss"' not in line:
                continue
            raw = {k: (m.group(1).strip() if (m := r.search(line)) else None) for k, r in KEY_RE.items()}
            if raw['iteration'] is None:
                continue
            raw['step'] = int(raw['iteration'].strip('"').split('/')[0])
            raw['json'] = json.loads(line)
            rows.append(raw)
    return rows


def meta(run_dir):
    def rd(name):
        try:
            return open(os.path.join(run_dir, name)).read().strip()
        except OSError:
            return '?'

    rc = rd('rc')
    err = ''
    if rc != '0' and os.environ.get('LOGDIR'):  # run_all.sh logs run NAME to $LOGDIR/NAME.log
        err = f' [{last_error(os.path.join(os.environ["LOGDIR"], os.path.basename(os.path.normpath(run_dir)) + ".log"))}]'
    gpu = rd('gpu')
    return f'rc={rc} {rd("secs")}s{"" if gpu == "?" else " on " + gpu}{err}'


def last_error(log):
    """The last line of the log that looks like an exception, for failed runs."""
    try:
        lines = open(log, encoding='utf-8', errors='replace').read().splitlines()
    except OSError:
        return ''
    pat = re.compile(r'(Error|Exception|error:|Traceback|Killed|CUDA out of memory)')
    hits = [ln.strip() for ln in lines if pat.search(ln) and 'Warning' not in ln]
    return hits[-1][:300] if hits else (lines[-1][:300] if lines else '')


def split_arg(arg):
    label, _, path = arg.partition('=')
    return label, path


def cmd_curve(label, run_dir, log):
    rows = read_rows(run_dir)
    if not rows:
        print(f'{label}: {meta(run_dir)} NO LOSSES LOGGED. last error: {last_error(log)}')
        return 1
    losses = [r['json']['loss'] for r in rows]
    n = len(losses)
    w = max(1, min(5, n // 4))
    first5, last5 = sum(losses[:w]) / w, sum(losses[-w:]) / w
    falling = losses[-1] < losses[0] and last5 < first5
    mem = rows[-1]['json'].get('memory(GiB)')
    print(f'{label}: {meta(run_dir)} steps={n} first_loss={losses[0]:.6f} last_loss={losses[-1]:.6f} '
          f'mean(first {w})={first5:.4f} mean(last {w})={last5:.4f} falling={"yes" if falling else "NO"} '
          f'min={min(losses):.4f} mem={mem}GiB')
    return 0 if falling else 1


def cmd_compare(tol, ref_arg, others):
    tol = float(tol)
    ref_label, ref_dir = split_arg(ref_arg)
    ref = read_rows(ref_dir)
    if not ref:
        print(f'{ref_label}: {meta(ref_dir)} NO LOSSES LOGGED')
        return 1
    ref_by_step = {r['step']: r['json']['loss'] for r in ref}
    parts = [f'{ref_label} ({meta(ref_dir)}) step1={ref[0]["json"]["loss"]:.6f}']
    bad = 0
    for arg in others:
        label, d = split_arg(arg)
        rows = read_rows(d)
        if not rows:
            parts.append(f'{label} ({meta(d)}): NO LOSSES LOGGED')
            bad += 1
            continue
        l1 = rows[0]['json']['loss']
        r1 = abs(l1 - ref[0]['json']['loss']) / abs(ref[0]['json']['loss'])
        common = [r for r in rows if r['step'] in ref_by_step]
        rmax = max(abs(r['json']['loss'] - ref_by_step[r['step']]) / abs(ref_by_step[r['step']]) for r in common)
        ok = r1 < tol
        bad += not ok
        parts.append(f'{label} ({meta(d)}) step1={l1:.6f} rel_diff_step1={r1:.2e} '
                     f'max_rel_diff_over_{len(common)}_steps={rmax:.2e} {"OK" if ok else "FAIL"}(tol {tol:g})')
    print('; '.join(parts))
    return 1 if bad else 0


def cmd_same(arg_a, arg_b):
    (la, da), (lb, db) = split_arg(arg_a), split_arg(arg_b)
    a, b = read_rows(da), read_rows(db)
    if not a or not b:
        print(f'{la} vs {lb}: {la} {meta(da)} {len(a)} steps, {lb} {meta(db)} {len(b)} steps: NOT COMPARABLE')
        return 1
    bs = {r['step']: r for r in b}
    n = loss_same = gn_same = 0
    first_diff = None
    for r in a:
        o = bs.get(r['step'])
        if o is None:
            continue
        n += 1
        ls, gs = r['loss'] == o['loss'], r['grad_norm'] == o['grad_norm']
        loss_same += ls
        gn_same += gs
        if (not ls or not gs) and first_diff is None:
            first_diff = (f'first difference at step {r["step"]}: loss {r["loss"]} vs {o["loss"]}, '
                          f'grad_norm {r["grad_norm"]} vs {o["grad_norm"]}')
    ident = n > 0 and loss_same == n and gn_same == n and len(a) == len(b)
    print(f'{la} ({meta(da)}) vs {lb} ({meta(db)}): {n} common steps, loss strings identical {loss_same}/{n}, '
          f'grad_norm strings identical {gn_same}/{n} -> {"IDENTICAL" if ident else "DIFFERENT"}'
          f'{"" if first_diff is None else "; " + first_diff}; step1 loss {a[0]["loss"]} vs {b[0]["loss"]}')
    return 0 if ident else 1


def cmd_close(rtol, arg_a, arg_b):
    """Runs on different GPUs: the same numbers up to rounding, not bit for bit (kernels may differ per card)."""
    rtol = float(rtol)
    (la, da), (lb, db) = split_arg(arg_a), split_arg(arg_b)
    a, b = read_rows(da), read_rows(db)
    if not a or not b or len(a) != len(b):
        print(f'{la} vs {lb}: {la} {meta(da)} {len(a)} steps, {lb} {meta(db)} {len(b)} steps: NOT COMPARABLE')
        return 1
    bs = {r['step']: r['json'] for r in b}
    worst = {'loss': 0.0, 'grad_norm': 0.0}
    for r in a:
        o = bs.get(r['step'])
        if o is None:
            print(f'{la} vs {lb}: step {r["step"]} missing in {lb}: NOT COMPARABLE')
            return 1
        for k in worst:
            x, y = float(r['json'][k]), float(o[k])
            worst[k] = max(worst[k], abs(x - y) / max(abs(y), 1e-12))
    ok = max(worst.values()) <= rtol
    print(f'{la} ({meta(da)}) vs {lb} ({meta(db)}): {len(a)} steps, max rel diff loss {worst["loss"]:.2e}, '
          f'grad_norm {worst["grad_norm"]:.2e} -> {"CLOSE" if ok else "NOT CLOSE"} (rtol {rtol:g})')
    return 0 if ok else 1


def cmd_agree(rtol, min_steps, arg_a, arg_b, arg_c):
    """A = B bit for bit on the steps where B and its repeat CTRL print identical strings (upstream's own run-to-run
    agreement: its first MIN steps at least), within RTOL on the steps after; A follows B or CTRL exactly?"""
    (la, da), (lb, db), (lc, dc) = split_arg(arg_a), split_arg(arg_b), split_arg(arg_c)
    a, b, c = read_rows(da), read_rows(db), read_rows(dc)
    if not a or len(a) != len(b) or len(b) != len(c):
        print(f'{la} vs {lb}: {len(a)}/{len(b)}/{len(c)} steps ({la} {meta(da)}): NOT COMPARABLE')
        return 1
    key = lambda r: (r['loss'], r['grad_norm'])  # noqa: E731
    prefix = next((i for i, (x, y) in enumerate(zip(b, c)) if key(x) != key(y)), len(b))
    same = next((i for i in range(prefix) if key(a[i]) != key(b[i])), None)
    worst = max(abs(float(x['json'][k]) - float(y['json'][k])) / max(abs(float(y['json'][k])), 1e-12)
                for x, y in zip(a[prefix:], b[prefix:]) for k in ('loss', 'grad_norm')) if prefix < len(b) else 0.0
    follows = [lbl for lbl, rows in ((lb, b), (lc, c)) if all(key(x) == key(y) for x, y in zip(a, rows))]
    ok = same is None and prefix >= int(min_steps) and (worst <= float(rtol) or bool(follows))
    why = '' if ok else (f'; differs at step {a[same]["step"]} where upstream agrees with itself: loss {a[same]["loss"]} '
                         f'vs {b[same]["loss"]}, grad_norm {a[same]["grad_norm"]} vs {b[same]["grad_norm"]}'
                         if same is not None else f'; upstream agrees with itself on {prefix} steps only (< {min_steps})'
                         if prefix < int(min_steps) else f'; after step {prefix} rel diff {worst:.2e} > {rtol}')
    print(f'{la} ({meta(da)}) vs {lb} ({meta(db)}), control {lc}: upstream = its repeat on steps 1..{prefix} of '
          f'{len(b)}; {la} = {lb} bit for bit there: {"yes" if same is None else "NO"}; after: max rel diff '
          f'{worst:.2e}, {la} identical to {" and ".join(follows) or "neither"} at every step -> '
          f'{"AGREES" if ok else "DIFFERENT"}{why}')
    return 0 if ok else 1


def cmd_tps(args):
    warm = 5
    if '--warm' in args:
        i = args.index('--warm')
        warm = int(args[i + 1])
        args = args[:i] + args[i + 2:]
    res = []
    for arg in args:
        label, rest = split_arg(arg)
        d, _, tok = rest.rpartition(':')
        rows = read_rows(d)
        by = {r['step']: r['json'] for r in rows}
        last = max(by) if by else 0
        if warm not in by or last <= warm:
            print(f'TPS {label}: {meta(d)} not enough logged steps ({len(rows)}; need > {warm})')
            res.append((label, None))
            continue
        # ms-swift logs train_speed(s/it) = elapsed since train start / steps done: elapsed_N = speed_N * N
        t = by[last]['train_speed(s/it)'] * last - by[warm]['train_speed(s/it)'] * warm
        steps = last - warm
        tps = int(tok) * steps / t
        res.append((label, tps))
        print(f'TPS {label}: {meta(d)} {steps} steps after {warm} warm-up in {t:.3f}s = {t / steps * 1e3:.1f} '
              f'ms/step, {int(tok)} tokens/step -> {tps:,.0f} tokens/s; memory {by[last].get("memory(GiB)")} GiB')
    if len(res) >= 2 and res[0][1] and res[1][1]:
        print(f'TPS ratio {res[0][0]}/{res[1][0]} tokens/s = {res[0][1] / res[1][1]:.3f}')
    return 0 if all(v for _, v in res) else 1


def main(argv):
    cmd, args = argv[0], argv[1:]
    if cmd == 'curve':
        return cmd_curve(*args)
    if cmd == 'compare':
        return cmd_compare(args[0], args[1], args[2:])
    if cmd == 'same':
        return cmd_same(*args)
    if cmd == 'close':
        return cmd_close(*args)
    if cmd == 'agree':
        return cmd_agree(*args)
    if cmd == 'tps':
        return cmd_tps(args)
    raise SystemExit(__doc__)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
