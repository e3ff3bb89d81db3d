"""The two-stage PLT recipe in one command: patch-level stage, token-level stage, vanilla export.

    python -m swift_plt.recipe.cli --model HF_DIR --tokens 2B --max_length 2048 --global_batch_size 256 \\
        --output_dir runs/plt [--patch_size 4] [--lam 2/3] [--dry_run] [--config examples/two_stage.yaml] \\
        [any `megatron pt` flag: --dataset ... --lr ... (passed to both stages)]
    swift-plt-two-stage ...             (the same, console script)

Each step is a STOCK command run as a subprocess (so it runs wherever `megatron pt` runs: CPU harness, 1 GPU, or
torchrun with NPROC_PER_NODE set in the environment); its output goes to our stdout and to OUTPUT_DIR/logs/:

  stage 1  megatron pt --model_type llama3_2_plt --patch_size K --max_length K*T --train_iters n1
           --output_dir OUTPUT_DIR/stage1_patch
  stage 2  megatron pt --model_type llama3_2_plt --patch_size 1 --max_length T --train_iters n2
           --mcore_model OUTPUT_DIR/stage1_patch/checkpoint-n1 --finetune true --output_dir OUTPUT_DIR/stage2_token
  export   megatron export --mcore_model OUTPUT_DIR/stage2_token/checkpoint-n2 --to_hf ... -> OUTPUT_DIR/hf
           (then swift_plt.recipe.export.make_vanilla: a plain HF Llama)

Hand-over (weights only): ``--mcore_model <stage-1 checkpoint> --finetune true`` is ms-swift/Megatron's own
weights-only load (``load_mcore_checkpoint``: with finetune it loads no optimizer, LR scheduler or RNG state and
starts at iteration 0, i.e. exactly the paper's reset). It reads the checkpoint as trained (no HF round trip) and
dist-checkpointing reshards it, so stage 2 may use another TP/PP layout. For it the stages save Megatron
checkpoints (``--save_safetensors false``: ms-swift would skip the Megatron weights when saving safetensors without
optimizer state); the HF model comes from the export, for stage 1 too (``swift_plt.recipe.export``).

Resume (rerun the same command): the state of each stage is read from its output dir:
  * complete   ``checkpoint-n/latest_checkpointed_iteration.txt`` reads n (megatron writes it after the data) with
               n = the stage's train_iters -> skipped;
  * partial    a complete ``checkpoint-m``, m < n -> that stage resumes with ms-swift's own mechanism,
               ``--mcore_model checkpoint-m --finetune false`` (weights, optimizer, LR schedule, RNG, iteration and
               consumed samples; save them with ``--save_steps``; optimizer state is saved unless --no_save_optim);
  * not started -> it starts (stage 1 from --model, stage 2 from the stage-1 checkpoint: missing -> error).
The plan is written to OUTPUT_DIR/plan.json; a rerun with a different plan is refused before anything runs.
"""
import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from swift_plt import PLT_MODEL_TYPE
from swift_plt.data.report import REPORT_FILE, estimate_loss_tokens, read_reports
from swift_plt.recipe.plan import DEFAULT_LAM, DEFAULT_PATCH_SIZE, STAGE1_BATCH, TwoStagePlan, make_plan
from swift_plt.recipe.export import (PROVENANCE, REGISTER_FILE, check_export_args, checkpoint_iteration, cli_executable, export_vanilla,
                      list_checkpoints, run_logged)

STAGE_DIRS = {1: 'stage1_patch', 2: 'stage2_token'}
EXPORT_DIR = 'hf'
# Set by the recipe for each stage; a user value would contradict the plan or the hand-over.
RESERVED = ('train_iters', 'num_train_epochs', 'max_epochs', 'max_length', 'packing_length', 'seq_length',
            'patch_size', 'model_type', 'mcore_model', 'finetune', 'output_dir', 'add_version', 'save_safetensors',
            'global_batch_size', 'model')


class RecipeError(ValueError):
    """Bad input or state, found before any work starts."""


@dataclass
class Options:
    model: str
    output_dir: str
    tokens: str
    max_length: int
    global_batch_size: int
    patch_size: int = DEFAULT_PATCH_SIZE
    lam: str = str(DEFAULT_LAM)
    stage1_batch: str = STAGE1_BATCH[0]
    args: List[str] = field(default_factory=list)  # both stages
    stage1_args: List[str] = field(default_factory=list)
    stage2_args: List[str] = field(default_factory=list)
    export_args: List[str] = field(default_factory=list)  # `megatron export` (e.g. --torch_dtype, CPU flags)
    stage: str = 'all'  # all | 1 | 2 | export
    stage1_checkpoint: Optional[str] = None  # stage 2's start (default: OUTPUT_DIR/stage1_patch/checkpoint-n1)
    dry_run: bool = False


# ---------------------------------------------------------------------------------------------- arguments
def _flag_names(argv: Sequence[str]) -> List[str]:
    return [a[2:].split('=', 1)[0].replace('-', '_') for a in argv if a.startswith('--')]


def check_passthrough(argv: Sequence[str], where: str) -> None:
    bad = sorted(set(_flag_names(argv)) & set(RESERVED))
    if bad:
        raise RecipeError(f'{where}: {", ".join("--" + b for b in bad)} is set by the two-stage recipe for each stage '
                          '(from --tokens/--max_length/--global_batch_size/--patch_size/--lam/--output_dir); drop it.')


def _flag_value(argv: Sequence[str], name: str) -> Optional[str]:
    """The last value of ``--name V`` / ``--name=V`` in argv (argparse: the last one wins), else None."""
    value = None
    for i, a in enumerate(argv):
        if a.startswith(f'--{name}='):
            value = a.split('=', 1)[1]
        elif a == f'--{name}' and i + 1 < len(argv):
            value = argv[i + 1]
    return value


def check_micro_batch(opts: 'Options', plan: TwoStagePlan) -> None:
    """Each stage's --micro_batch_size must divide its global batch (before anything runs; megatron would refuse
    it only when the stage starts). Data parallelism is not known here: megatron checks the rest."""
    for i, s, argv in ((1, plan.stage1, opts.stage1_args), (2, plan.stage2, opts.stage2_args)):
        value = _flag_value(list(opts.args) + list(argv), 'micro_batch_size')
        if value is None:
            continue
        try:
            mbs = int(value)
        except ValueError:
            raise RecipeError(f'--micro_batch_size {value!r} must be an integer.') from None
        if mbs < 1 or s.global_batch_size % mbs:
            hint = (f' Stage 1 takes G/K = {s.global_batch_size} sequences (of {s.seq_length} tokens) per step '
                    f'(--stage1_batch {plan.stage1_batch}); give stage 1 its own with --stage1_args '
                    f'"--micro_batch_size {math.gcd(s.global_batch_size, max(mbs, 1))}".' if i == 1 else '')
            raise RecipeError(f'stage {i}: --micro_batch_size {mbs} does not divide its --global_batch_size '
                              f'{s.global_batch_size}.{hint}')


def _as_argv(value) -> List[str]:
    """Extra args from the CLI (one shell-quoted string) or YAML (a string, a list, or a {flag: value} mapping)."""
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, dict):
        out = []
        for k, v in value.items():
            out += [f'--{k}'] + ([] if v is None else [json.dumps(v) if isinstance(v, (dict, list)) else
                                                       (str(v).lower() if isinstance(v, bool) else str(v))])
        return out
    return [str(v) for v in value]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog='swift-plt-two-stage',
        description='Two-stage patch-level training (PLT): stage 1 at patch size K on λ·N tokens, stage 2 at K=1 on '
        '(1-λ)·N tokens from the stage-1 weights (fresh optimizer and LR schedule), then a plain HF Llama export. '
        'Every flag not listed here is passed to `megatron pt` in both stages. Rerun the same command to resume.')
    p.add_argument('--config', help='YAML file whose keys are these flags (the command line wins)')
    p.add_argument('--model', help='HF Llama dir to start from')
    p.add_argument('--output_dir', help='run dir: stage1_patch/, stage2_token/, hf/, logs/, plan.json')
    p.add_argument('--tokens', help='token budget N: 2000000000, 2e9 or 2B (K/M/B/T = powers of 1000)')
    p.add_argument('--max_length', type=int, help='T: token-level sequence length (the patch stage uses K*T)')
    p.add_argument('--global_batch_size', type=int,
                   help='G: sequences per optimizer step of the token-level stage (stage 1: see --stage1_batch)')
    p.add_argument('--stage1_batch', choices=list(STAGE1_BATCH),
                   help='tokens (default, as in the paper): stage 1 takes G/K sequences of K*T tokens per step, the '
                   'same tokens per step as stage 2; sequences: G sequences per step (K times the tokens per step, '
                   '1/K the steps)')
    p.add_argument('--patch_size', type=int, help=f'K (default {DEFAULT_PATCH_SIZE})')
    p.add_argument('--lam', help=f'λ, the patch-level fraction of N, in (0, 1) (default {DEFAULT_LAM})')
    p.add_argument('--stage1_args', help='extra `megatron pt` flags for stage 1 only (one quoted string)')
    p.add_argument('--stage2_args', help='extra `megatron pt` flags for stage 2 only (one quoted string)')
    p.add_argument('--export_args', help='extra `megatron export` flags (one quoted string)')
    p.add_argument('--stage', choices=['all', '1', '2', 'export'], help='run only this step (default: all)')
    p.add_argument('--stage1_checkpoint', help='start stage 2 from this Megatron checkpoint')
    p.add_argument('--dry_run', action='store_true', default=None, help='print the plan and commands, run nothing')
    return p


def parse_options(argv: Optional[Sequence[str]] = None) -> Options:
    parser = build_parser()
    ns, rest = parser.parse_known_args(argv)
    values: Dict[str, object] = {}
    if ns.config:
        import yaml
        with open(ns.config, encoding='utf-8') as f:
            loaded = yaml.safe_load(f) or {}
        if not isinstance(loaded, dict):
            raise RecipeError(f'--config {ns.config}: expected a mapping of flag: value.')
        known = {a.dest for a in parser._actions} - {'help', 'config'}
        for k, v in loaded.items():
            k = k.replace('-', '_')
            if k == 'args':
                values['args'] = _as_argv(v)
            elif k in known:
                values[k] = v
            else:
                raise RecipeError(f'--config {ns.config}: unknown key {k!r} (use one of {sorted(known)}; '
                                  '`megatron pt` flags go under `args:`).')
    for k, v in vars(ns).items():
        if k != 'config' and v is not None:
            values[k] = v
    values['args'] = _as_argv(values.get('args')) + list(rest)
    for k in ('stage1_args', 'stage2_args', 'export_args'):
        values[k] = _as_argv(values.get(k))
    missing = [k for k in ('model', 'output_dir', 'tokens', 'max_length', 'global_batch_size') if values.get(k) is None]
    if missing:
        raise RecipeError('missing ' + ', '.join('--' + m for m in missing) + ' (on the command line or in --config).')
    for k in ('max_length', 'global_batch_size', 'patch_size'):
        if k in values and not isinstance(values[k], int):
            try:
                values[k] = int(values[k])
            except (TypeError, ValueError):
                raise RecipeError(f'--{k} must be an integer, got {values[k]!r}.') from None
    values['stage'] = str(values.get('stage', 'all'))
    if values['stage'] not in ('all', '1', '2', 'export'):
        raise RecipeError(f"--stage {values['stage']!r}: use all, 1, 2 or export.")
    values['tokens'] = str(values['tokens'])
    values['lam'] = str(values.get('lam', DEFAULT_LAM))
    values['stage1_batch'] = str(values.get('stage1_batch', STAGE1_BATCH[0]))
    values['dry_run'] = bool(values.get('dry_run', False))
    return Options(**values)


# ---------------------------------------------------------------------------------------------- state machine
@dataclass
class StageState:
    stage: int
    train_iters: int
    run_dir: str
    checkpoints: Dict[int, str]

    @property
    def complete(self) -> bool:
        return self.train_iters in self.checkpoints

    @property
    def resume_from(self) -> Optional[str]:
        """Latest complete checkpoint before the end (an interrupted stage), else None."""
        earlier = [i for i in self.checkpoints if i < self.train_iters]
        return self.checkpoints[max(earlier)] if earlier and not self.complete else None

    @property
    def final_checkpoint(self) -> str:
        return os.path.join(self.run_dir, f'checkpoint-{self.train_iters}')


def stage_state(output_dir: str, stage: int, train_iters: int) -> StageState:
    run_dir = os.path.join(output_dir, STAGE_DIRS[stage])
    ckpts = list_checkpoints(run_dir) if os.path.isdir(run_dir) else {}
    later = sorted(i for i in ckpts if i > train_iters)
    if later:
        raise RecipeError(f'{run_dir} holds checkpoint-{later[-1]}, past this plan\'s train_iters {train_iters}: it '
                          'belongs to another plan. Use a new --output_dir.')
    return StageState(stage, train_iters, run_dir, ckpts)


@dataclass
class Step:
    name: str  # 'stage1', 'stage2', 'export'
    action: str  # 'skip (complete)', 'start', 'resume from ...', 'run'
    cmd: Optional[List[str]]


def _stage_cmd(opts: Options, plan: TwoStagePlan, stage: int, state: StageState, init: List[str]) -> List[str]:
    s = plan.stage1 if stage == 1 else plan.stage2
    extra = opts.stage1_args if stage == 1 else opts.stage2_args
    return [
        cli_executable('megatron'), 'pt', '--model', opts.model, '--model_type', PLT_MODEL_TYPE,
        '--custom_register_path', REGISTER_FILE, '--patch_size', str(s.patch_size), '--max_length',
        str(s.seq_length), '--global_batch_size', str(s.global_batch_size), '--train_iters', str(s.train_iters),
        '--output_dir', state.run_dir, '--add_version', 'false', '--save_safetensors', 'false', *init, *opts.args,
        *extra
    ]


def _stage_step(opts: Options, plan: TwoStagePlan, state: StageState, start_action: str,
                start_init: List[str]) -> Step:
    """complete -> skip; interrupted -> ms-swift's full resume from the latest checkpoint; else the fresh start."""
    name = f'stage{state.stage}'
    if state.complete:
        return Step(name, f'skip (complete: {state.final_checkpoint})', None)
    if state.resume_from:
        return Step(name, f'resume from {state.resume_from}',
                    _stage_cmd(opts, plan, state.stage, state, ['--mcore_model', state.resume_from, '--finetune',
                                                                 'false']))
    return Step(name, start_action, _stage_cmd(opts, plan, state.stage, state, start_init))


def plan_steps(opts: Options, plan: TwoStagePlan) -> List[Step]:
    """What a run of ``opts`` does now, from the state on disk. Raises RecipeError before anything runs."""
    out = os.path.abspath(opts.output_dir)
    s1 = stage_state(out, 1, plan.stage1.train_iters)
    s2 = stage_state(out, 2, plan.stage2.train_iters)
    steps = []
    want = {'all': (1, 2, 3), '1': (1, ), '2': (2, ), 'export': (3, )}[opts.stage]
    if 1 in want:
        steps.append(_stage_step(opts, plan, s1, 'start', []))
    if 2 in want:
        start = opts.stage1_checkpoint or s1.final_checkpoint
        will_exist = opts.stage1_checkpoint is None and 1 in want  # stage 1 runs first in this command
        if (not s2.complete and not s2.resume_from and not will_exist
                and checkpoint_iteration(start) is None):
            raise RecipeError(
                f'stage 2 starts from the stage-1 checkpoint {start}, which does not exist or is incomplete '
                f'(no {os.path.basename(start)}/latest_checkpointed_iteration.txt). Run stage 1 first (--stage 1 '
                'or --stage all, same --output_dir and plan), or pass --stage1_checkpoint <checkpoint-N dir>.')
        steps.append(_stage_step(opts, plan, s2, f'start from {start} (weights only: --finetune true)',
                                 ['--mcore_model', start, '--finetune', 'true']))
    if 3 in want:
        if not s2.complete and 2 not in want:
            raise RecipeError(f'nothing to export: stage 2 is not complete ({s2.final_checkpoint} missing). Run the '
                              'stages first, or export any checkpoint with `python -m swift_plt.recipe.export`.')
        hf = os.path.join(out, EXPORT_DIR)
        done = exported_from(hf) == os.path.abspath(s2.final_checkpoint)
        steps.append(Step('export', f'skip (done: {hf})' if done else f'{s2.final_checkpoint} -> {hf}', None))
    return steps


def exported_from(hf_dir: str) -> Optional[str]:
    """The checkpoint a finished vanilla export in ``hf_dir`` came from (its provenance file), else None."""
    try:
        with open(os.path.join(hf_dir, PROVENANCE), encoding='utf-8') as f:
            return json.load(f).get('checkpoint')
    except (OSError, ValueError):
        return None


def check_plan_file(out: str, plan: TwoStagePlan, write: bool) -> None:
    path = os.path.join(out, 'plan.json')
    current = plan.to_dict()
    if os.path.exists(path):
        with open(path, encoding='utf-8') as f:
            old = json.load(f)
        if old != current:
            diff = {k: (old.get(k), current[k]) for k in current if old.get(k) != current[k]}
            raise RecipeError(f'{out} holds a run with another plan (old, new): {diff}. Rerun with the same '
                              '--tokens/--patch_size/--lam/--max_length/--global_batch_size/--stage1_batch to resume it, or use a '
                              'new --output_dir.')
    elif write:
        os.makedirs(out, exist_ok=True)
        with open(path, 'w', encoding='utf-8') as f:
            json.dump(current, f, indent=2)


# ---------------------------------------------------------------------------------------------- PLT data report
def _packing(argv: Sequence[str]) -> bool:
    """Whether `--packing true` is among the pass-through flags (the last value wins, as in ms-swift)."""
    return str(_flag_value(argv, 'packing')).lower() in ('true', '1', 'yes')


def loss_token_lines(report: dict, plan: TwoStagePlan, opts: Options) -> List[str]:
    """How many loss tokens each stage will see, from stage 1's PLT data report (its train set)."""
    frac = report.get('effective_fraction')
    lines = [f'PLT data report of stage 1 ({REPORT_FILE}, {"first " if report.get("sampled") else ""}'
             f'{report["documents"]:,} documents): at K={plan.patch_size} '
             f'{report["loss_tokens"]:,} tokens carry a loss vs {report["loss_tokens_k1"]:,} at K=1 '
             f'({"n/a" if frac is None else f"{frac:.1%}"}), {report["documents_without_loss"]:,} documents none']
    for i, s, argv in ((1, plan.stage1, opts.stage1_args), (2, plan.stage2, opts.stage2_args)):
        packing = _packing(list(opts.args) + list(argv))
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


def run(opts: Options) -> int:
    for argv, where in ((opts.args, 'extra arguments'), (opts.stage1_args, '--stage1_args'),
                        (opts.stage2_args, '--stage2_args')):
        check_passthrough(argv, where)
    try:
        check_export_args(opts.export_args)
    except ValueError as e:
        raise RecipeError(f'--export_args: {e}') from None
    if not os.path.isdir(opts.model):
        raise RecipeError(f'--model {opts.model}: not a directory (pass a local HF Llama dir).')
    try:
        plan = make_plan(opts.tokens, opts.patch_size, opts.lam, seq_length=opts.max_length,
                         global_batch_size=opts.global_batch_size, stage1_batch=opts.stage1_batch)
    except ValueError as e:
        raise RecipeError(str(e)) from None
    check_micro_batch(opts, plan)
    out = os.path.abspath(opts.output_dir)
    print(plan.summary(), flush=True)
    check_plan_file(out, plan, write=False)
    publish_data_report(out, plan, opts)  # a rerun: the report of the earlier stage-1 start
    steps = plan_steps(opts, plan)
    for step in steps:
        print(f'[{step.name}] {step.action}' + (f'\n    $ {subprocess.list2cmdline(step.cmd)}' if step.cmd else ''),
              flush=True)
    if opts.dry_run:
        return 0
    check_plan_file(out, plan, write=True)
    logs = os.path.join(out, 'logs')
    for step in steps:
        if step.name == 'export':
            if step.action.startswith('skip'):
                continue
            print(f'[export] vanilla HF Llama -> {os.path.join(out, EXPORT_DIR)}', flush=True)
            export_vanilla(os.path.join(out, STAGE_DIRS[2], f'checkpoint-{plan.stage2.train_iters}'),
                           os.path.join(out, EXPORT_DIR), opts.model, opts.export_args,
                           log_path=os.path.join(logs, 'export.log'))
            continue
        if step.cmd is None:
            continue
        print(f'[{step.name}] running ({step.action}); log: {os.path.join(logs, step.name + ".log")}', flush=True)
        stage = int(step.name[-1])
        before = stage_state(out, stage, plan.stage1.train_iters if stage == 1 else plan.stage2.train_iters)
        log_line = _count_lines(os.path.join(before.run_dir, 'logging.jsonl'))
        t = time.time()
        rc = run_logged(step.cmd, os.path.join(logs, step.name + '.log'))
        start = int(os.path.basename(before.resume_from).split('-')[-1]) if before.resume_from else 0
        record_wall_time(logs, step.name, time.time() - t, rc, log_line, start)
        state = stage_state(out, stage, plan.stage1.train_iters if stage == 1 else plan.stage2.train_iters)
        if stage == 1:
            publish_data_report(out, plan, opts)
        if rc != 0 or not state.complete:
            print(f'[{step.name}] failed (exit code {rc}; final checkpoint {state.final_checkpoint} '
                  f'{"present" if state.complete else "missing"}). Fix the cause and rerun the same command: it '
                  'resumes from the latest checkpoint of this stage.', file=sys.stderr, flush=True)
            return rc or 1
        print(f'[{step.name}] complete: {state.final_checkpoint}', flush=True)
    print('[done] ' + (f'vanilla HF Llama: {os.path.join(out, EXPORT_DIR)}' if any(s.name == 'export' for s in steps)
                       else 'requested stage(s) complete'), flush=True)
    write_report(out, plan)
    return 0


# ---------------------------------------------------------------------------------------------- run report
def _count_lines(path: str) -> int:
    if not os.path.exists(path):
        return 0
    with open(path, encoding='utf-8') as f:
        return sum(1 for _ in f)


def record_wall_time(logs_dir: str, name: str, seconds: float, rc: int, log_line: int = 0,
                     start_iteration: int = 0) -> None:
    """Append one invocation of a stage to ``logs/<name>.time.jsonl``: its wall time (start-up included), exit code,
    the line of the stage's ``logging.jsonl`` where its logs begin and the iteration it started from (resume)."""
    os.makedirs(logs_dir, exist_ok=True)
    with open(os.path.join(logs_dir, f'{name}.time.jsonl'), 'a', encoding='utf-8') as f:
        f.write(json.dumps({'seconds': round(seconds, 3), 'rc': rc, 'log_line': log_line,
                            'start_iteration': start_iteration}) + '\n')


def _train_logs(stage_dir: str) -> List[dict]:
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


def train_loop_seconds(logs: List[dict], invocations: Sequence[dict] = ()) -> Optional[Tuple[float, int]]:
    """(seconds, steps) of the logged training (start-up excluded), from ms-swift's ``train_speed(s/it)``: the time
    since an invocation's first step / its steps so far. ``invocations`` (records of ``record_wall_time``) split
    the log of a resumed stage into its invocations: each contributes its last ``train_speed`` x its steps (its
    last logged iteration - the iteration it started from). Without them the log is one invocation from 0."""
    marks = sorted((r.get('log_line', 0), r.get('start_iteration', 0)) for r in invocations) or [(0, 0)]
    total, steps = 0.0, 0
    for k, (line, start) in enumerate(marks):
        end = marks[k + 1][0] if k + 1 < len(marks) else float('inf')
        seg = [d for d in logs if line <= d.get('_line', 0) < end]
        if not seg:
            continue
        speed = seg[-1].get('train_speed(s/it)')
        if speed is None:
            return None
        total += float(speed) * (_iteration(seg[-1]) - start)
        steps += _iteration(seg[-1]) - start
    return total, steps


def stage_report(out: str, plan: TwoStagePlan) -> List[dict]:
    """Per stage: steps done, tokens (sequence slots: steps x global batch x length), training-loop seconds,
    tokens/s (and patches/s at K>1), wall seconds of the recipe's invocations (start-up included), losses."""
    rows = []
    for stage, s in ((1, plan.stage1), (2, plan.stage2)):
        logs = _train_logs(os.path.join(out, STAGE_DIRS[stage]))
        # the last step is logged only if it is a multiple of --logging_steps: a complete stage ran train_iters
        done = s.train_iters if os.path.exists(os.path.join(out, STAGE_DIRS[stage], f'checkpoint-{s.train_iters}',
                                                            'latest_checkpointed_iteration.txt')) else None
        steps = done or (_iteration(logs[-1]) if logs else 0)
        tokens = steps * s.global_batch_size * s.seq_length
        wall, invocations = None, []
        wall_path = os.path.join(out, 'logs', f'stage{stage}.time.jsonl')
        if os.path.exists(wall_path):
            with open(wall_path, encoding='utf-8') as f:
                invocations = [json.loads(line) for line in f if line.strip()]
            wall = sum(r['seconds'] for r in invocations)
        timed = train_loop_seconds(logs, invocations) if logs else None
        # rate of the logged steps; the time of all steps at that rate (the unlogged tail is < --logging_steps)
        tps = timed[1] * s.global_batch_size * s.seq_length / timed[0] if timed and timed[0] > 0 else None
        secs = tokens / tps if tps else None
        rows.append({
            'stage': stage, 'kind': s.name, 'patch_size': s.patch_size, 'seq_length': s.seq_length,
            'global_batch_size': s.global_batch_size,
            'planned_steps': s.train_iters, 'steps': steps, 'tokens': tokens, 'train_seconds': secs,
            'wall_seconds': wall, 'tokens_per_s': tps,
            'patches_per_s': tps / s.patch_size if tps and s.patch_size > 1 else None,
            'first_loss': logs[0]['loss'] if logs else None, 'last_loss': logs[-1]['loss'] if logs else None,
            'curve': [(_iteration(d), float(d['loss'])) for d in logs]})
    return rows


def format_report(rows: List[dict], plan: TwoStagePlan) -> str:
    lines = ['Two-stage PLT summary (tokens = steps x global_batch_size x max_length; time = training loop at the '
             "logged steps' rate (ms-swift's train_speed), wall = the `megatron pt` invocation(s), start-up included)"]
    for r in rows:
        name = f"stage {r['stage']} ({r['kind']} level, K={r['patch_size']}, max_length={r['seq_length']})"
        if not r['steps']:
            lines.append(f'  {name}: no training log')
            continue
        t = f"{r['train_seconds']:.1f} s" if r['train_seconds'] else 'n/a'
        w = f"{r['wall_seconds']:.1f} s" if r['wall_seconds'] is not None else 'n/a'
        speed = f"{r['tokens_per_s']:,.0f} tokens/s" if r['tokens_per_s'] else 'tokens/s n/a'
        if r['patches_per_s']:
            speed += f", {r['patches_per_s']:,.0f} patches/s"
        lines.append(f"  {name}: {r['steps']}/{r['planned_steps']} steps, {r['tokens']:,} tokens, time {t} "
                     f"(wall {w}), {speed}; loss {r['first_loss']:.4f} -> {r['last_loss']:.4f}")
    return '\n'.join(lines)


def plot_report(rows: List[dict], plan: TwoStagePlan, path: str) -> Optional[str]:
    """Loss of both stages on one figure: against tokens, and against compute (model positions = tokens / K, the
    FLOPs of a step are proportional to them). Stage 1 dashed (its loss is the patch-level loss), stage 2 solid."""
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
        text = format_report(rows, plan)
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        return run(parse_options(argv))
    except (RecipeError, FileNotFoundError) as e:
        print(f'swift-plt-two-stage: error: {e}', file=sys.stderr)
        return 2
    except RuntimeError as e:  # a failed export (its log is above)
        print(f'swift-plt-two-stage: {e}', file=sys.stderr)
        return 1


if __name__ == '__main__':
    sys.exit(main())
