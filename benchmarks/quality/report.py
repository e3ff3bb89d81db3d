"""Table, JSON and plot of a quality-benchmark run (run.py calls it; rerun it on a copied work dir any time).

    python benchmarks/quality/report.py WORK OUT      -> OUT/results.json, OUT/results.md, OUT/quality.png

One row per job (size, run, N, seed; jobs.py) with its status: a job that did not finish (not started, killed at
the deadline, failed) has no held-out loss. Older meta.json files (one N, seed 42, runs/SIZE_RUN) read the same.

Compute per model position (a token at K=1, a patch at K=4; a stage-1 row of K*T tokens is T positions), from
make_models.py's fields (flops_per_position):
    F = 6 * (P_active + V*H)  +  6 * L_attn * W_attn * T  +  24 * L_gdn * Hv*dk*dv
        matmuls incl. the LM head; P_active = the non-embedding parameters a position uses: all of them (dense,
        hybrid), or of an MoE the attention, norms, router and top-k of its experts (tinyMoE: 2 of 8, 75,136 of
        222,592); causal attention over T in the L_attn attention layers of query width W_attn (heads x head_dim; a
        dense model: every layer, W = H); the Gated DeltaNet's state update in its L_gdn layers (recurrent form, per
        value head: decay, k·S, rank-1 update, q·S ~ 4 dk·dv multiply-adds, x 2 x 3 with the backward; its chunked
        kernels do more, its convolution (kernel 4) is left out)
so a run's FLOPs = F * (positions of stage 1 + positions of stage 2); the ratio to (a) is the plan's
λ/K + 1 - λ (after rounding). The mean of K embeddings and the K-target loss are left out (O(K*H), O(K) a position);
so is a Qwen3.5 checkpoint's vision tower (Megatron runs it on a blank 16x16 image once a micro batch, times 0).

Continued pretraining (jobs on corpus B from a start model, run.py --continue_from): each row also has `corpus`,
`from_n`, `start` (the start job's id), `heldout` ({'A': loss, 'B': loss}: eval.jsonl's NAME and NAME@B) and
`heldout_loss` = the loss on the row's own training corpus (B for a continuation); `first_losses` (each stage's first
5 logged train losses, [iteration, loss]) and, for two-stage runs, `stage2_first_losses` (the token-level loss right
after the stage switch). continued.py makes the study's table and plot from these rows.
"""
import json
import os
import sys

from variants import run_label


def flops_per_position(m, T):
    """F of the module docstring for a make_models.py record ``m`` (older records: dense, every layer attention)."""
    active = m.get('active_non_embedding_params') or m['non_embedding_params']
    return (6 * (active + m['vocab'] * m['hidden']) + 6 * m.get('attention_layers', m['layers']) *
            m.get('attention_width', m['hidden']) * T + 24 * m.get('gdn_layers', 0) * m.get('gdn_state', 0))


def read_jsonl(path):
    out = []
    if os.path.exists(path):
        for line in open(path):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def meta_jobs(meta):
    """The jobs of a call: meta['jobs'] (run.py with several N and seeds), else those of an older meta.json (one N,
    seed 42, run dirs SIZE_RUN, eval names SIZE_RUN)."""
    if 'jobs' in meta:
        return meta['jobs']
    out = []
    for size in meta['sizes']:
        for run in meta['runs']:
            v = meta.get('variants', {}).get(run)
            K, G1 = run_shape(meta, run)
            out.append({'id': f'{size}_{run}', 'size': size, 'run': run, 'N': meta['N'], 'seed': 42, 'status': None,
                        'dir': None, 'a_iters': meta['a_iters'], 'K': K, 'G1': G1 if run != 'a' else None,
                        'plan': v.get('plan') if v else None})
    return out


def stage_dirs(work, job):
    base = os.path.join(work, 'runs', job['id'])
    if job['run'] == 'a':
        return [('token', os.path.join(base, 'token'))]
    return [('patch', os.path.join(base, 'stage1_patch')), ('token', os.path.join(base, 'stage2_token'))]


def run_shape(meta, run):
    """(K, stage-1 sequences per step) of a run. Older meta.json files (runs a, b, c only) have one K and G1."""
    v = meta.get('variants', {}).get(run)
    if v:
        return v['K'], v['G1']
    return meta.get('K', 4), meta.get('G1', meta['G'])  # G1 absent: the first calls, --stage1_batch sequences


FIRST_LOGGED = 5  # how many of a stage's first logged losses a row keeps


def first_losses(logs, k=FIRST_LOGGED):
    """[[iteration, loss], ...] of the first ``k`` logged steps of a stage (logging.jsonl rows with a loss)."""
    return [[int(str(x['iteration']).split('/')[0]), x['loss']] for x in logs[:k]]


def main():
    work, out = sys.argv[1], sys.argv[2]
    meta = json.load(open(os.path.join(out, 'meta.json')))
    evals = {e['name']: e for e in read_jsonl(os.path.join(out, 'eval.jsonl'))}
    T, G = meta['T'], meta['G']
    rows = []
    for job in meta_jobs(meta):
        size, run = job['size'], job['run']
        m = meta['models'][size]
        F = flops_per_position(m, T)
        a_flops = F * job['a_iters'] * G * T  # token-level training on the job's N
        K, G1 = job['K'], job['G1']
        stages, x0, g0, toks, gpu = [], 0.0, 0.0, 0, 0.0
        for kind, d in stage_dirs(work, job):
            L = T * (K if kind == 'patch' else 1)
            Gs = G1 if kind == 'patch' else G
            logs = [x for x in read_jsonl(os.path.join(d, 'logging.jsonl')) if 'loss' in x]
            timing = json.load(open(os.path.join(d, 'gpu_time.json'))) if os.path.exists(
                os.path.join(d, 'gpu_time.json')) else {}
            steps_s = timing.get('step_seconds', [])
            cum = [sum(steps_s[:i + 1]) for i in range(len(steps_s))]
            pts = []
            for x in logs:
                it = int(str(x['iteration']).split('/')[0])
                gs = g0 + (cum[it - 1] if it - 1 < len(cum) else float('nan'))
                pts.append((x0 + F * it * Gs * T / a_flops, gs, x['loss']))
            n = int(str(logs[-1]['iteration']).split('/')[1]) if logs else 0
            # the last step is logged only at a multiple of --logging_steps; gpu_lock counts every step
            done = bool(logs) and (int(str(logs[-1]['iteration']).split('/')[0]) == n or
                                   timing.get('iterations') == n)
            if not done:  # steps reached (logged)
                n = int(str(logs[-1]['iteration']).split('/')[0]) if logs else 0
            stages.append({'kind': kind, 'dir': d, 'iterations': n, 'complete': done, 'seq_length': L,
                           'tokens': n * Gs * L, 'positions': n * Gs * T, 'global_batch_size': Gs,
                           'train_seconds': sum(steps_s) or None,
                           'lock_held_seconds': timing.get('train_seconds'),
                           'save_seconds': timing.get('save_seconds'),
                           'lock_wait_seconds': timing.get('lock_wait_seconds'),
                           'tokens_per_s': n * Gs * L / sum(steps_s) if steps_s else None,
                           'positions_per_s': n * Gs * T / sum(steps_s) if steps_s else None,
                           'final_train_loss': logs[-1]['loss'] if logs else None,
                           'first_losses': first_losses(logs), 'points': pts})
            x0 += F * n * Gs * T / a_flops
            g0 += sum(steps_s)
            toks += n * Gs * L
            gpu += sum(steps_s)
        if not all(st['complete'] and st['train_seconds'] for st in stages):
            gpu = None  # a stage did not finish (or has no timing): no total
        corpus = job.get('corpus') or 'A'
        labels = ['A'] + sorted({k.rsplit('@', 1)[1] for k in evals if '@' in k})
        heldout = {c: evals.get(job['id'] + ('' if c == 'A' else '@' + c), {}) for c in labels}
        e = heldout.get(corpus) or {}  # the held-out set of the corpus the job trained on (last)
        e1 = evals.get(f"{job['id']}_stage1" + ('' if corpus == 'A' else '@' + corpus), {})
        status = job.get('status') or ('done' if e.get('loss') is not None else 'not finished')
        loss = e.get('loss') if status == 'done' else None  # a job that did not finish has no result
        rows.append({'job': job['id'], 'run': run, 'size': size, 'N': job['N'], 'seed': job['seed'],
                     'corpus': corpus, 'from_n': job.get('from_n'), 'start': job.get('start'),
                     'reused_from': job.get('reused_from'),
                     'heldout': {c: (x.get('loss') if status == 'done' else None) for c, x in heldout.items()},
                     'first_losses': stages[0]['first_losses'] if stages else [],
                     'stage2_first_losses': stages[1]['first_losses'] if len(stages) > 1 else None,
                     'a_iters': job['a_iters'],
                     'status': status, 'params': m['params'], 'non_embedding_params': m['non_embedding_params'],
                     'active_non_embedding_params': m.get('active_non_embedding_params') or m['non_embedding_params'],
                     'structure': m.get('structure', 'dense'), 'flops_per_position': F,
                     'tokens': toks, 'tokens_per_param': toks / m['params'], 'gpu_seconds': gpu,
                     'flops': x0 * a_flops, 'flop_ratio': x0, 'heldout_loss': loss,
                     'ppl': e.get('ppl') if loss is not None else None,
                     'stage1_heldout_loss': e1.get('loss'), 'stage1_ppl': e1.get('ppl'),
                     'eval_error': e.get('error'), 'stages': stages,
                     'init_heldout_loss': evals.get(f'{size}_init', {}).get('loss')})

    def baseline(r):  # (a) of the same size, N, corpus and start: the same seed, else the first seed run
        same = [x for x in rows if x['size'] == r['size'] and x['run'] == 'a' and x['N'] == r['N'] and
                x['corpus'] == r['corpus'] and x['from_n'] == r['from_n']]
        return next((x for x in same if x['seed'] == r['seed']), same[0] if same else None)

    for r in rows:
        base = baseline(r)
        r['gpu_ratio'] = r['gpu_seconds'] / base['gpu_seconds'] if base and base['gpu_seconds'] and \
            r['gpu_seconds'] else None
        r['loss_vs_a'] = (r['heldout_loss'] / base['heldout_loss'] - 1) if base and base['heldout_loss'] and \
            r['heldout_loss'] else None
    json.dump({'meta': meta, 'rows': rows}, open(os.path.join(out, 'results.json'), 'w'), indent=1, default=str)

    names = {r['run']: run_label(r['run']) for r in rows}

    def where(r):  # a continuation: its corpus and start; a start model of an earlier call (--start_models)
        if r.get('reused_from'):
            return ' (start model of an earlier call, --start_models: not trained here)'
        return f" on {r['corpus']} from {r['start']}" if r['from_n'] else (
            f" on {r['corpus']}" if r['corpus'] != 'A' else '')

    lock = meta.get('gpu_lock', True)
    gpu_name = 'GPU s' if lock else 'loop s (no GPU lock)'

    def f(v, fmt):
        return '—' if v is None else format(v, fmt)

    lines = [f'| run | N | seed | model (params) | tokens (tokens/param) | steps (stage 1 + 2) | {gpu_name} (ratio to a) '
             '| FLOP ratio (plan) | held-out loss (vs a) | PPL | end of stage 1: held-out loss / PPL |',
             '| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |']
    for r in rows:
        m = meta['models'][r['size']]
        steps = ' + '.join(str(s['iterations']) for s in r['stages'])
        loss = f(r['heldout_loss'], '.4f') if r['status'] == 'done' else r['status']
        lines.append(
            f"| {names[r['run']]}{where(r)} | {r['N']:,} | {r['seed']} | {r['size']} ({m['params'] / 1e6:.1f} M, "
            f"{m['non_embedding_params'] / 1e6:.{3 if m['non_embedding_params'] < 1e6 else 1}f} M non-emb."
            + (f", {r['active_non_embedding_params'] / 1e6:.3f} M active"
               if r['active_non_embedding_params'] != m['non_embedding_params'] else '')
            + f") | {r['tokens'] / 1e6:.2f} M "
            f"({r['tokens_per_param']:.2f}) | {steps} | "
            f"{f(r['gpu_seconds'], '.1f')} ({f(r['gpu_ratio'], '.3f')}) | {r['flop_ratio']:.4f} | "
            f"{loss} ({'—' if r['loss_vs_a'] is None else format(r['loss_vs_a'], '+.2%')}) | "
            f"{f(r['ppl'], '.2f')} | "
            + (f"{f(r['stage1_heldout_loss'], '.4f')} / {f(r['stage1_ppl'], '.1f')}" if r['run'] != 'a' else '—')
            + ' |')
    lines.append('')
    lines.append('(vs a): against (a) of the same size, N and seed (else its first seed)'
                 + (', the same corpus and start model; held-out loss: on the corpus the run trained on (a '
                    'continuation: on B; continued.md has both)' if any(r['corpus'] != 'A' for r in rows) else '')
                 + '. Per stage ('
                 + ('GPU s = the sum of its training steps, alone on the GPU' if lock else
                    'loop s = the sum of its training steps; other runs trained at the same time (no GPU lock)')
                 + '; the final checkpoint save is not counted): ')
    lines.append('')
    lines.append(f'| job | stage | steps | tokens | {gpu_name} | tokens/s | positions/s | final train loss | '
                 'lock wait s |')
    lines.append('| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |')
    for r in rows:
        for s in r['stages']:
            lines.append(f"| {r['job']} | {s['kind']} (L={s['seq_length']}) | {s['iterations']}"
                         f"{'' if s['complete'] else ' (incomplete)'} | {s['tokens']:,} | {f(s['train_seconds'], '.1f')}"
                         f" | {f(s['tokens_per_s'], ',.0f')} | {f(s['positions_per_s'], ',.0f')} | "
                         f"{f(s['final_train_loss'], '.4f')} | {f(s['lock_wait_seconds'], '.0f')} |")
    init = ', '.join(f"{s}: {evals[f'{s}_init']['loss']:.3f}" for s in meta['sizes'] if
                     evals.get(f'{s}_init', {}).get('loss') is not None)
    lines.append('')
    lines.append(f'Held-out loss of the random-init models (seed 42): {init or "—"}.')
    unfinished = [f"{r['job']} ({r['status']})" for r in rows if r['status'] != 'done']
    if unfinished:
        lines.append(f"Not finished (no result): {', '.join(unfinished)}.")
    if meta.get('failed'):
        lines.append(f"Failed steps: {meta['failed']}")
    md = '\n'.join(lines) + '\n'
    open(os.path.join(out, 'results.md'), 'w').write(md)
    print(md)

    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        print('matplotlib missing: no plot')
        return
    sizes = meta['sizes']
    first = meta.get('seeds', [42])[0]
    shown = [r for r in rows if r['seed'] == first]  # curves of the first seed only
    n_ref = max(r['a_iters'] for r in rows)  # x: FLOPs / FLOPs of (a) on the largest N
    series = list(dict.fromkeys((r['run'], r['N'], r['corpus']) for r in shown))
    base_colors = {'a': 'tab:blue', 'b': 'tab:orange', 'c': 'tab:green'}
    one_n = len({r['N'] for r in rows}) == 1
    colors = {}
    for i, (run, n, corpus) in enumerate(series):
        colors[(run, n, corpus)] = base_colors[run] if one_n and run in base_colors else f'C{i % 10}'

    def label(r):
        tail = f" on {r['corpus']}" if r['corpus'] != 'A' else ''
        if one_n:
            return names[r['run']] + tail
        n = f"{r['N'] / 1e6:g}M" if r['N'] >= 10**6 else f"{r['N']:,}"
        return names[r['run']].replace(', N', f', N={n}').replace(', 2N', f', 2N (N={n})') + tail

    fig, axes = plt.subplots(2, len(sizes), figsize=(6.5 * len(sizes), 9), squeeze=False)
    for j, size in enumerate(sizes):
        for i, xkey in enumerate((0, 1)):
            ax = axes[i][j]
            for r in [x for x in shown if x['size'] == size]:
                c = colors[(r['run'], r['N'], r['corpus'])]
                scale = r['a_iters'] / n_ref if xkey == 0 else 1.0

                def X(p):
                    return p[xkey] * scale  # noqa: B023 -- used inside this iteration only

                for s in r['stages']:
                    pts = [p for p in s['points'] if p[xkey] == p[xkey]]
                    if not pts:
                        continue
                    ax.plot([X(p) for p in pts], [p[2] for p in pts], color=c,
                            ls='--' if s['kind'] == 'patch' else '-', lw=1.3,
                            label=label(r) + (' stage 1 (patch loss)' if s['kind'] == 'patch' else
                                              (' stage 2' if r['run'] != 'a' else '')))
                if r['run'] != 'a' and r['stages'][0]['points']:
                    sw = X(r['stages'][0]['points'][-1])
                    ax.axvline(sw, color=c, ls=':', lw=1)
                    if r['stage1_heldout_loss'] is not None:
                        ax.plot([sw], [r['stage1_heldout_loss']], marker='o', mfc='none', color=c, ms=9)
                last = [p for s in r['stages'] for p in s['points'] if p[xkey] == p[xkey]]
                if r['heldout_loss'] is not None and last:
                    ax.plot([X(last[-1])], [r['heldout_loss']], marker='*', color=c, ms=14)
            ref = f"(a) on N = {n_ref * G * T:,}" if not one_n else 'run a'
            ax.set_xlabel(f'training compute (FLOPs / FLOPs of {ref})' if xkey == 0 else
                          ('GPU seconds (training loops, one at a time on the GPU)' if lock else
                           'training-loop seconds (runs at the same time: no GPU lock)'))
            ax.set_ylabel('loss (nats/token)')
            m = meta['models'][size]
            ns = sorted({r['N'] for r in shown if r['size'] == size})
            ax.set_title(f"{size}: {m['params'] / 1e6:.1f} M params, N = {', '.join(f'{n:,}' for n in ns)} tokens"
                         + (f' (seed {first})' if len(meta.get('seeds', [42])) > 1 else ''), fontsize=10)
            ys = [p[2] for r in shown if r['size'] == size for st in r['stages'] for p in st['points']]
            ys += [v for r in shown if r['size'] == size for v in (r['heldout_loss'], r['stage1_heldout_loss']) if v]
            if ys:
                ax.set_ylim(min(ys) - 0.1, min(max(ys), min(ys) + 4) + 0.1)
            ax.grid(alpha=0.3)
            if i == 0:
                ax.legend(fontsize=7, loc='upper right')
    fig.suptitle('lines: training loss (stage 1 dashed: patch-level loss);\n★ held-out loss of the final model, '
                 '○ of the end of stage 1; dotted: stage switch.\n(a) token-level on N tokens, (b) PLT on N, '
                 '(c) PLT on 2N', fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, 'quality.png'), dpi=110)
    print(f"plot: {os.path.join(out, 'quality.png')}")


if __name__ == '__main__':
    main()
