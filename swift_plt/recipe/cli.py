"""``swift-plt-two-stage``: the two-stage PLT recipe in one command (patch-level stage, token-level stage from its
weights, vanilla HF export), each step a stock ms-swift CLI run; rerunning the same command resumes.

    swift-plt-two-stage --model HF_DIR --output_dir runs/plt --tokens 2B --max_length 2048 --global_batch_size 256 \\
        [--patch_size 4] [--lam 2/3] [--dry_run] [--config examples/two_stage.yaml] [any `megatron pt` flag]
"""
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from swift_plt.recipe.early_start import GATE_ENV, PARENT_ENV, write_gate
from swift_plt.recipe.export import check_export_args, export_vanilla
from swift_plt.recipe.family import causal_lm_class, check_family, read_config, run_model_type
from swift_plt.recipe.nodes import LeaderStatus, Nodes, node0_export_launch, node_note, read_nodes, wait_for
from swift_plt.recipe.options import Options, RecipeError, check_micro_batch, check_passthrough, parse_options
from swift_plt.recipe.phases import MilestoneClock
from swift_plt.recipe.plan import TwoStagePlan, make_plan
from swift_plt.recipe.process import LoggedRun, env_prefix, export_launch, failure_cause, flag_value, free_port
from swift_plt.recipe.stage_report import count_lines, publish_data_report, record_wall_time, write_report
from swift_plt.recipe.stages import (EXPORT_DIR, STAGE_DIRS, Step, all_gpus_hint, check_plan_file, exported_from,
                                     plan_steps, stage_launch, stage_state)


def checked_plan(opts: Options) -> TwoStagePlan:
    """The plan of ``opts``, after every check that needs no state on disk; RecipeError with what to do."""
    check_passthrough(opts.args, 'extra arguments', shared=True)
    for argv, where in ((opts.stage1_args, '--stage1_args'), (opts.stage2_args, '--stage2_args')):
        check_passthrough(argv, where)
    try:
        check_export_args(opts.export_args)
    except ValueError as e:
        raise RecipeError(f'--export_args: {e}') from None
    if not os.path.isdir(opts.model):
        raise RecipeError(f'--model {opts.model}: not a directory (pass a local HF model dir).')
    check_model(opts)
    try:
        plan = make_plan(opts.tokens, opts.patch_size, opts.lam, seq_length=opts.max_length,
                         global_batch_size=opts.global_batch_size, stage1_batch=opts.stage1_batch)
    except ValueError as e:
        raise RecipeError(str(e)) from None
    check_micro_batch(opts, plan)
    return plan


def check_model(opts: Options) -> None:
    """The model's family trains at patch level and, when the export is a step, has a plain transformers class."""
    try:
        config = read_config(opts.model)
        check_family(config.get('model_type'))
        if opts.stage in ('all', 'export'):
            causal_lm_class(config)
    except ValueError as e:
        raise RecipeError(f'--model {opts.model}: {e}') from None


@dataclass
class StageRun:
    """A stage's `megatron pt` process, started and not yet waited for, with what ``finish_stage`` needs."""
    step: Step
    log: str
    stage: int
    iters: int
    log_line: int
    offset: int
    resume_from: Optional[str]
    started: float
    clock: MilestoneClock
    run: LoggedRun


def start_stage(step: Step, out: str, plan: TwoStagePlan, nodes: Nodes = Nodes(),
                extra_env: Optional[dict] = None, quiet: bool = False) -> StageRun:
    """Start one stage's command, logged (to our stdout only from ``show()`` on when ``quiet``)."""
    logs = os.path.join(out, 'logs')
    log = os.path.join(logs, nodes.log_name(step.name))
    print(f'[{step.name}] running ({step.action}); log: {log}', flush=True)
    stage = int(step.name[-1])
    iters = plan.stage1.train_iters if stage == 1 else plan.stage2.train_iters
    before = stage_state(out, stage, iters)
    log_line = count_lines(os.path.join(before.run_dir, 'logging.jsonl'))
    offset = os.path.getsize(log) if os.path.exists(log) else 0
    clock = MilestoneClock()
    run = LoggedRun(step.cmd, log, dict(step.env, **(extra_env or {})), clock.line, quiet)
    return StageRun(step, log, stage, iters, log_line, offset, before.resume_from, time.time(), clock, run)


def finish_stage(sr: StageRun, out: str, plan: TwoStagePlan, opts: Options, nodes: Nodes = Nodes(),
                 status: Optional[LeaderStatus] = None, since: Optional[dict] = None, note: str = '',
                 alone_from: Optional[float] = None) -> int:
    """Wait for a started stage (logged, timed, with its micro batch and recompute and ``note``, why); 0 when its
    final checkpoint is there, else the exit code (or 1). A node other than 0 then waits for the final checkpoint
    (global rank 0 completes it) or node 0's failure after ``since``. ``alone_from``: when the stage started beside
    another, the time that one ended (its wall clock counts from there)."""
    rc = sr.run.wait()
    sr.clock.stop()
    stage, iters = sr.stage, sr.iters
    state = stage_state(out, stage, iters)
    if not nodes.leader:
        if rc == 0 and not state.complete:
            wait_for(f'{state.final_checkpoint}/latest_checkpointed_iteration.txt',
                     lambda: stage_state(out, stage, iters).complete, nodes, status, since)
            state = stage_state(out, stage, iters)
    else:
        start = int(os.path.basename(sr.resume_from).split('-')[-1]) if sr.resume_from else 0
        now, alone = time.time(), max(sr.started, alone_from or sr.started)
        record_wall_time(os.path.join(out, 'logs'), sr.step.name, now - alone, rc, sr.log_line, start, {
            'micro_batch_size': int(flag_value(sr.step.cmd, 'micro_batch_size') or 1),
            'recompute_granularity': flag_value(sr.step.cmd, 'recompute_granularity'), 'why': note,
            'milestones': sr.clock.marks(), 'beside_earlier_stage_seconds': round(alone - sr.started, 3)})
        if stage == 1:
            publish_data_report(out, plan, opts)
    if rc == 0 and state.complete:
        print(f'[{sr.step.name}] complete: {state.final_checkpoint}', flush=True)
        return 0
    cause = (failure_cause(sr.log, sr.offset) if rc else
             'it exited normally without writing its final checkpoint: see the end of the log.')
    print(f'[{sr.step.name}] failed (exit code {rc}; final checkpoint {state.final_checkpoint} '
          f'{"present" if state.complete else "missing"}).\n'
          f'    log: {sr.log}\n    likely cause: {cause}\n'
          '    Fix it and rerun the same command: it resumes from the latest checkpoint of this stage.',
          file=sys.stderr, flush=True)
    return rc or 1


def run_stage(step: Step, out: str, plan: TwoStagePlan, opts: Options, nodes: Nodes = Nodes(),
              status: Optional[LeaderStatus] = None, since: Optional[dict] = None, note: str = '') -> int:
    """Run one stage to its end (``start_stage`` then ``finish_stage``)."""
    return finish_stage(start_stage(step, out, plan, nodes), out, plan, opts, nodes, status, since, note)


def start_stage2_early(step: Step, out: str, plan: TwoStagePlan) -> Tuple[StageRun, str]:
    """Start stage 2 beside stage 1 (``early_start``): its own torchrun port, the gate file, and stage 1's final
    checkpoint dir made (ms-swift checks that --mcore_model exists when it parses its arguments)."""
    gate = os.path.join(out, 'logs', 'stage2.gate')
    if os.path.exists(gate):
        os.remove(gate)
    mcore = flag_value(step.cmd, 'mcore_model')
    if mcore:
        os.makedirs(mcore, exist_ok=True)
    env = {GATE_ENV: gate, PARENT_ENV: str(os.getpid()), 'MASTER_PORT': str(free_port())}
    print('[stage2] starts now, beside stage 1: start-up and data while stage 1 trains; it builds its model when '
          'stage 1 is done (--stage2_start after: one after the other)', flush=True)
    return start_stage(step, out, plan, extra_env=env, quiet=True), gate


def run(opts: Options) -> int:
    """Check, print the plan, the process count and the steps, then run the steps that are not done yet. On several
    nodes (``swift_plt.recipe.nodes``) every node joins the stages; node 0 alone writes the run's files and exports."""
    plan = checked_plan(opts)
    out = os.path.abspath(opts.output_dir)
    print(plan.summary(), flush=True)
    check_plan_file(out, plan, write=False)
    steps = plan_steps(opts, plan)
    notes, launch, export = [], None, None
    if any(s.cmd for s in steps):
        launch = stage_launch(opts, plan, early=early_stage2(opts, steps, several_nodes(os.environ)))
        notes.append(launch.note)
    nodes = read_nodes(os.environ)
    if nodes.multi:
        notes.insert(0, node_note(nodes, os.environ))
    if nodes.leader:
        publish_data_report(out, plan, opts)  # a rerun: the report of the earlier stage-1 start
    if any(s.name == 'export' and not s.action.startswith('skip') for s in steps):
        try:
            export = (node0_export_launch(opts.export_args, os.environ) if nodes.multi else
                      export_launch(opts.export_args))
        except ValueError as e:
            raise RecipeError(f'--export_args: {e}') from None
        if launch is None or export.env != launch.env:
            notes.append(f'the export: {export.note}')
    if notes:
        print('swift-plt-two-stage: ' + '; '.join(notes), flush=True)
    running = {int(s.name[-1]) for s in steps if s.cmd and s.name.startswith('stage')}
    for i, note in sorted(launch.stage_notes.items() if launch else ()):
        if i in running:
            print(f'swift-plt-two-stage: {note}', flush=True)
    hint = launch and all_gpus_hint(opts, plan, launch, os.path.exists(os.path.join(out, 'plan.json')))
    if hint:  # one line, before the steps: the flag that runs the stages on every visible GPU
        print(f'swift-plt-two-stage: {hint}', flush=True)
    steps = plan_steps(opts, plan, launch and launch.env, export and export.env, launch and launch.stage_args,
                       launch and launch.stage_env)
    for step in steps:
        print(f'[{step.name}] {step.action}', flush=True)
        if step.cmd:
            print(f'    $ {env_prefix(step.env) + " " if step.env else ""}{subprocess.list2cmdline(step.cmd)}',
                  flush=True)
    if opts.dry_run:
        return 0
    status = LeaderStatus(out) if nodes.multi else None
    since = status.read() if status else None  # node 0's record before this node's next step: older ones are stale
    if nodes.leader:
        check_plan_file(out, plan, write=True)
    else:  # node 0 writes plan.json first: the same plan on both nodes, or a refusal here
        plan_file = os.path.join(out, 'plan.json')
        wait_for(plan_file, lambda: os.path.exists(plan_file), nodes, status, since)
        check_plan_file(out, plan, write=False)
    hf = os.path.join(out, EXPORT_DIR)
    final = os.path.join(out, STAGE_DIRS[2], f'checkpoint-{plan.stage2.train_iters}')
    early: Optional[Tuple[StageRun, str]] = None  # stage 2 started beside stage 1, and its gate file
    stage1_end: Optional[float] = None

    def recorded(name: str, fn) -> int:  # node 0 of several records each step's state for the others
        log = os.path.join(out, 'logs', nodes.log_name(name))
        return status.step(name, log, fn) if status and nodes.leader else fn()

    def export_step(step: Step) -> int:
        print(f'[export] vanilla HF model -> {hf}', flush=True)
        t = time.time()
        export_vanilla(final, hf, opts.model, opts.export_args, log_path=os.path.join(out, 'logs', 'export.log'),
                       extra_env=step.env, model_type=run_model_type(opts.model, opts.args))
        record_wall_time(os.path.join(out, 'logs'), 'export', time.time() - t, 0)
        return 0

    for step in steps:
        if step.name == 'export':
            if step.action.startswith('skip'):
                continue
            if nodes.leader:
                recorded('export', lambda step=step: export_step(step))
            else:
                print(f'[export] node 0 writes the vanilla HF model {hf}; waiting for it', flush=True)
                wait_for(f'the export {hf}', lambda: exported_from(hf) == final, nodes, status, since)
                print(f'[export] done by node 0: {hf}', flush=True)
        elif step.cmd is not None:
            since = status.read() if status else None
            note = launch.stage_notes.get(int(step.name[-1]), '') if launch else ''
            if step.name == 'stage2' and early is not None:
                rc = finish_stage(early[0], out, plan, opts, note=note, alone_from=stage1_end)
            else:
                if step.name == 'stage1' and early_stage2(opts, steps, nodes.multi):
                    early = start_stage2_early(next(s for s in steps if s.name == 'stage2'), out, plan)
                rc = recorded(step.name, lambda step=step, since=since, note=note: run_stage(
                    step, out, plan, opts, nodes, status, since, note))
                if early is not None:
                    stage1_end = time.time()
                    write_gate(early[1], rc == 0, f'stage 1 failed (exit code {rc}; log: {out}/logs/stage1.log)')
                    if rc:
                        early[0].run.wait()
                    else:
                        print(f'[stage2] started {stage1_end - early[0].started:.0f} s ago beside stage 1; its '
                              'output so far:', flush=True)
                        early[0].run.show()
            if rc:
                return rc
    print('[done] ' + (f'vanilla HF model: {hf}' if any(s.name == 'export' for s in steps)
                       else 'requested stage(s) complete'), flush=True)
    if nodes.leader:
        write_report(out, plan)
        if status:
            status.write('all', 'done')
    return 0


def several_nodes(environ) -> bool:
    """NNODES > 1 (a set-up ``read_nodes`` refuses counts too: its error comes after the process count's)."""
    try:
        return read_nodes(environ).multi
    except RecipeError:
        return True


def early_stage2(opts: Options, steps: Sequence[Step], multi: bool) -> bool:
    """Stage 2 starts beside stage 1: both run in this command, on one node, unless --stage2_start after."""
    running = {s.name for s in steps if s.cmd}
    return opts.stage2_start == 'early' and {'stage1', 'stage2'} <= running and not multi


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        return run(parse_options(argv))
    except (RecipeError, FileNotFoundError) as e:
        print(f'swift-plt-two-stage: error: {e}', file=sys.stderr)
        return 2
    except RuntimeError as e:  # a failed export (its log is named in the message)
        print(f'swift-plt-two-stage: {e}', file=sys.stderr)
        return 1


if __name__ == '__main__':
    sys.exit(main())
