"""What the stages saw and did: loss tokens per stage from stage 1's PLT data report, and the end-of-run summary
(steps, tokens, time, tokens/s) with the loss plot."""
import json
import os
import sys
from typing import List, Optional, Sequence, Tuple

from swift_plt.data.report import REPORT_FILE, estimate_loss_tokens, read_reports
from swift_plt.recipe.options import Options
from swift_plt.recipe.phases import phase_seconds
from swift_plt.recipe.plan import TwoStagePlan
from swift_plt.recipe.process import flag_bool
from swift_plt.recipe.stages import STAGE_DIRS


# ---------------------------------------------------------------------------------------------- PLT data report
def loss_token_lines(report: dict, plan: TwoStagePlan, opts: Options) -> List[str]:
    """How many loss tokens each stage will see, from stage 1's PLT data report (its train set)."""
    frac = report.get('effective_fraction')
    lines = [f'PLT data report of stage 1 ({REPORT_FILE}, {"first " if report.get("sampled") else ""}'
             f'{report["documents"]:,} documents): at K={plan.patch_size} '
             f'{report["loss_tokens"]:,} tokens carry a loss vs {report["loss_tokens_k1"]:,} at K=1 '
             f'({"n/a" if frac is None else f"{frac:.1%}"}), {report["documents_without_loss"]:,} documents none']
    for i, s, argv in ((1, plan.stage1, opts.stage1_args), (2, plan.stage2, opts.stage2_args)):
        packing = flag_bool(list(opts.args) + list(argv), 'packing')
        sequences = s.train_iters * s.global_batch_size
        n = estimate_loss_tokens(report, s.patch_size, sequences, s.seq_length, packing)
        how = (f'{sequences:,} packed rows x {s.seq_length} x loss tokens per encoded token, at most' if packing else
               f'{sequences:,} documents x mean loss tokens per document')
        lines.append(f'  stage {i} ({s.name} level, patch_size={s.patch_size}): ~{n:,} loss tokens '
                     f'({how}; {s.tokens:,} sequence slots)')
    lines.append('  (stage 2 is estimated from the same documents encoded at K=1 with the stage-1 max_length)')
    return lines


def publish_data_report(out: str, plan: TwoStagePlan, opts: Options) -> None:
    """Copy stage 1's PLT data report beside plan.json (once stage 1 has written it) and print the loss tokens
    each stage will see. Nothing when there is no report (stage 1 not started, or K=1)."""
    src = os.path.join(out, STAGE_DIRS[1], REPORT_FILE)
    dst = os.path.join(out, REPORT_FILE)
    reports = read_reports(src) or read_reports(dst)
    if not reports or 'train' not in reports:
        return
    if os.path.exists(src):
        with open(dst, 'w', encoding='utf-8') as f:
            json.dump(reports, f, indent=2)
    print('\n'.join(loss_token_lines(reports['train'], plan, opts)), flush=True)


# ---------------------------------------------------------------------------------------------- run report
def count_lines(path: str) -> int:
    if not os.path.exists(path):
        return 0
    with open(path, encoding='utf-8') as f:
        return sum(1 for _ in f)


def record_wall_time(logs_dir: str, name: str, seconds: float, rc: int, log_line: int = 0,
                     start_iteration: int = 0, settings: Optional[dict] = None) -> None:
    """Append one invocation of a stage to ``logs/<name>.time.jsonl``: its wall time (start-up included), exit code,
    the line of the stage's ``logging.jsonl`` where its logs begin, the iteration it started from (resume) and
    ``settings`` (its micro batch, recompute and why)."""
    os.makedirs(logs_dir, exist_ok=True)
    with open(os.path.join(logs_dir, f'{name}.time.jsonl'), 'a', encoding='utf-8') as f:
        f.write(json.dumps({'seconds': round(seconds, 3), 'rc': rc, 'log_line': log_line,
                            'start_iteration': start_iteration, **(settings or {})}) + '\n')


def read_wall_times(out: str, name: str) -> List[dict]:
    """The invocations ``record_wall_time`` recorded for a step (stage1, stage2, export) of the run in ``out``."""
    path = os.path.join(out, 'logs', f'{name}.time.jsonl')
    if not os.path.exists(path):
        return []
    with open(path, encoding='utf-8') as f:
        return [json.loads(line) for line in f if line.strip()]


def train_logs(stage_dir: str) -> List[dict]:
    """The training log dicts ms-swift wrote to ``<stage dir>/logging.jsonl`` (entries with a loss), each with its
    line number under ``_line``."""
    out = []
    path = os.path.join(stage_dir, 'logging.jsonl')
    if os.path.exists(path):
        with open(path, encoding='utf-8') as f:
            for i, line in enumerate(f):
                try:
                    d = json.loads(line)
                except ValueError:
                    continue
                if isinstance(d, dict) and 'loss' in d and 'iteration' in d:
                    out.append(dict(d, _line=i))
    return out


def _iteration(d: dict) -> int:
    return int(str(d['iteration']).split('/')[0])


def _segments(logs: List[dict], invocations: Sequence[dict]) -> List[Tuple[int, List[dict]]]:
    """(start iteration, log entries) per invocation of a stage: a resumed stage's log split at its ``invocations``
    (``record_wall_time`` records); the whole log for none."""
    marks = sorted((r.get('log_line', 0), r.get('start_iteration', 0)) for r in invocations) or [(0, 0)]
    ends = [line for line, _ in marks[1:]] + [float('inf')]
    return [(start, [d for d in logs if line <= d.get('_line', 0) < end]) for (line, start), end in zip(marks, ends)]


def train_loop_seconds(logs: List[dict], invocations: Sequence[dict] = ()) -> Optional[Tuple[float, int]]:
    """(seconds, steps) of the logged training, start-up excluded, from ms-swift's ``train_speed(s/it)`` (the mean
    since the invocation started); a resumed stage adds speed x steps of each invocation."""
    total, steps = 0.0, 0
    for start, seg in _segments(logs, invocations):
        if not seg:
            continue
        speed = seg[-1].get('train_speed(s/it)')
        if speed is None:
            return None
        total += float(speed) * (_iteration(seg[-1]) - start)
        steps += _iteration(seg[-1]) - start
    return total, steps


def steady_step_seconds(logs: List[dict], invocations: Sequence[dict] = ()) -> Optional[float]:
    """Seconds per step after the first logged step of the first invocation (its first step pays compilation and
    warm-up: 8-30 s at K=1 on an H100); None with fewer than two logged steps."""
    start, seg = _segments(logs, invocations)[0]
    seg = [d for d in seg if d.get('train_speed(s/it)') is not None]
    if len(seg) < 2:
        return None
    (n0, t0), (n1, t1) = ((_iteration(d) - start, float(d['train_speed(s/it)']) * (_iteration(d) - start))
                          for d in (seg[0], seg[-1]))
    return (t1 - t0) / (n1 - n0) if n1 > n0 else None


def stage_report(out: str, plan: TwoStagePlan) -> List[dict]:
    """Per stage: steps done, tokens (sequence slots: steps x global batch x length), training-loop seconds,
    tokens/s (and patches/s at K>1), wall seconds of the recipe's invocations (start-up included), losses."""
    rows = []
    for stage, s in ((1, plan.stage1), (2, plan.stage2)):
        logs = train_logs(os.path.join(out, STAGE_DIRS[stage]))
        # the last step is logged only if it is a multiple of --logging_steps: a complete stage ran train_iters
        done = s.train_iters if os.path.exists(os.path.join(out, STAGE_DIRS[stage], f'checkpoint-{s.train_iters}',
                                                            'latest_checkpointed_iteration.txt')) else None
        steps = done or (_iteration(logs[-1]) if logs else 0)
        tokens = steps * s.global_batch_size * s.seq_length
        invocations = read_wall_times(out, f'stage{stage}')
        wall = sum(r['seconds'] for r in invocations) if invocations else None
        timed = train_loop_seconds(logs, invocations) if logs else None
        last = invocations[-1] if invocations else {}
        # rate of the logged steps; the time of all steps at that rate (the unlogged tail is < --logging_steps)
        tps = timed[1] * s.global_batch_size * s.seq_length / timed[0] if timed and timed[0] > 0 else None
        secs = tokens / tps if tps else None
        steady = steady_step_seconds(logs, invocations) if logs else None
        phases: dict = {}  # summed over the stage's invocations
        for inv in invocations:
            for name, sec in phase_seconds(inv.get('milestones') or {}):
                phases[name] = phases.get(name, 0.0) + sec
        rows.append({
            'stage': stage, 'kind': s.name, 'patch_size': s.patch_size, 'seq_length': s.seq_length,
            'global_batch_size': s.global_batch_size, 'micro_batch_size': last.get('micro_batch_size'),
            'recompute_granularity': last.get('recompute_granularity'), 'micro_batch_why': last.get('why'),
            'planned_steps': s.train_iters, 'steps': steps, 'tokens': tokens, 'train_seconds': secs,
            'wall_seconds': wall, 'phases': phases if len(phases) > 1 else None,
            'beside_seconds': sum(r.get('beside_earlier_stage_seconds', 0.0) for r in invocations), 'tokens_per_s': tps,
            'steady_tokens_per_s': s.global_batch_size * s.seq_length / steady if steady else tps,
            'patches_per_s': tps / s.patch_size if tps and s.patch_size > 1 else None,
            'first_loss': logs[0]['loss'] if logs else None, 'last_loss': logs[-1]['loss'] if logs else None,
            'curve': [(_iteration(d), float(d['loss'])) for d in logs]})
    for r in rows:
        r['overhead_seconds'] = (r['wall_seconds'] - r['train_seconds']
                                 if r['wall_seconds'] is not None and r['train_seconds'] else None)
        # what a run of this stage alone would spend besides training: its time beside the earlier stage counts,
        # its wait for that stage does not
        r['overhead_alone_seconds'] = (None if r['overhead_seconds'] is None else r['overhead_seconds']
                                       + r['beside_seconds'] - (r['phases'] or {}).get('wait', 0.0))
    for r in rows:  # the same tokens trained token-level (same model, data and settings): stage 2 itself, and
        # stage 1's tokens at stage 2's rate after its first step (a token-level run pays that step once, in stage 2)
        steady2 = rows[1]['steady_tokens_per_s']
        r['token_level_seconds'] = (rows[1]['train_seconds'] if r is rows[1] else
                                    r['tokens'] / steady2 if steady2 else None)
    return rows


def export_seconds(out: str) -> Optional[float]:
    """Wall seconds of the recipe's last export (logs/export.time.jsonl), None without one."""
    runs = read_wall_times(out, 'export')
    return runs[-1]['seconds'] if runs else None


def against_token_level(rows: List[dict], export: Optional[float] = None) -> Optional[str]:
    """The recipe's training time and wall clock (the stages, and ``export`` seconds when given) against token-level
    training of the same tokens at stage 2's rate (its first step once) with one start-up (stage 2's overhead, as if
    it had run alone); None until both stages have both figures."""
    if any(r['train_seconds'] is None or r['overhead_seconds'] is None or r['token_level_seconds'] is None
           for r in rows):
        return None
    train, wall = sum(r['train_seconds'] for r in rows), sum(r['wall_seconds'] for r in rows) + (export or 0.0)
    est_train = sum(r['token_level_seconds'] for r in rows)
    est_wall = est_train + rows[1]['overhead_alone_seconds']
    what = f'the export\'s {export:.1f} s included' if export is not None else 'the export not counted'
    return (f'  against token-level training of the same {sum(r["tokens"] for r in rows):,} tokens at stage 2\'s rate, '
            f'its first step once (est. {est_train:.1f} s of training, {est_wall:.1f} s wall with one start-up): training '
            f'{train / est_train:.2f}x, wall {wall / est_wall:.2f}x ({what})')


def format_report(rows: List[dict], plan: TwoStagePlan, export: Optional[float] = None) -> str:
    lines = ['Two-stage PLT summary (tokens = steps x global_batch_size x max_length; time = training loop at the '
             "logged steps' rate (ms-swift's train_speed), wall = the `megatron pt` invocation(s), start-up included)"]
    for r in rows:
        mbs = f", micro_batch_size={r['micro_batch_size']}" if r.get('micro_batch_size') else ''
        if r.get('recompute_granularity'):
            mbs += f", recompute_granularity={r['recompute_granularity']}"
        name = f"stage {r['stage']} ({r['kind']} level, K={r['patch_size']}, max_length={r['seq_length']}{mbs})"
        if not r['steps']:
            lines.append(f'  {name}: no training log')
            continue
        t = f"{r['train_seconds']:.1f} s" if r['train_seconds'] else 'n/a'
        w = f"{r['wall_seconds']:.1f} s" if r['wall_seconds'] is not None else 'n/a'
        speed = f"{r['tokens_per_s']:,.0f} tokens/s" if r['tokens_per_s'] else 'tokens/s n/a'
        if r['patches_per_s']:
            speed += f", {r['patches_per_s']:,.0f} patches/s"
        if r.get('beside_seconds'):
            w += f" after stage 1; started {r['beside_seconds']:.1f} s earlier beside it"
        if r.get('overhead_seconds') is not None:
            w += f": {r['overhead_seconds']:.1f} s start-up, data and saving"
        est = f"; token-level est. {r['token_level_seconds']:.1f} s" if r.get('token_level_seconds') else ''
        lines.append(f"  {name}: {r['steps']}/{r['planned_steps']} steps, {r['tokens']:,} tokens, time {t} "
                     f"(wall {w}){est}, {speed}; loss {r['first_loss']:.4f} -> {r['last_loss']:.4f}")
        if r.get('phases'):
            lines.append('    wall clock: ' + ', '.join(f'{k} {v:.1f} s' for k, v in r['phases'].items()))
    total = against_token_level(rows, export)
    return '\n'.join(lines + ([total] if total else []))


def plot_report(rows: List[dict], plan: TwoStagePlan, path: str) -> Optional[str]:
    """Both stages' loss against tokens and against compute (model positions = tokens / K); stage 1 dashed, since
    its loss is the patch-level one."""
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    offsets = [0, 0]
    for i, r in enumerate(rows):
        g = r['global_batch_size']
        tok = [it * g * r['seq_length'] + offsets[0] for it, _ in r['curve']]
        pos = [it * g * r['seq_length'] // r['patch_size'] + offsets[1] for it, _ in r['curve']]
        loss = [v for _, v in r['curve']]
        label = f"stage {r['stage']} (K={r['patch_size']}" + (', patch-level loss)' if r['patch_size'] > 1 else ')')
        for ax, x in zip(axes, (tok, pos)):
            ax.plot(x, loss, ls='--' if r['patch_size'] > 1 else '-', color='tab:orange' if i == 0 else 'tab:blue',
                    label=label)
        offsets = [offsets[0] + r['tokens'], offsets[1] + r['tokens'] // r['patch_size']]
        if i == 0:
            for ax, x in zip(axes, offsets):
                ax.axvline(x, color='gray', ls=':', lw=1)
    axes[0].set_xlabel('tokens')
    axes[1].set_xlabel('compute: model positions (tokens / K), proportional to FLOPs')
    for ax in axes:
        ax.set_ylabel('training loss')
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f'swift-plt two-stage: N={plan.tokens:,}, K={plan.patch_size}, λ={plan.lam}', fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_report(out: str, plan: TwoStagePlan) -> None:
    """At the end of a run: OUTPUT_DIR/summary.txt (+ summary.json) and OUTPUT_DIR/loss_curves.png."""
    try:
        rows = stage_report(out, plan)
        text = format_report(rows, plan, export_seconds(out))
        with open(os.path.join(out, 'summary.txt'), 'w', encoding='utf-8') as f:
            f.write(text + '\n')
        with open(os.path.join(out, 'summary.json'), 'w', encoding='utf-8') as f:
            json.dump(rows, f, indent=1)
        print(text, flush=True)
        png = plot_report(rows, plan, os.path.join(out, 'loss_curves.png'))
        print(f'[report] {os.path.join(out, "summary.txt")}' + (f', {png}' if png else ' (no matplotlib: no plot)'),
              flush=True)
    except Exception as e:  # noqa: BLE001 -- the run itself succeeded; a report problem must not fail it
        print(f'[report] could not write the summary: {type(e).__name__}: {e}', file=sys.stderr, flush=True)
