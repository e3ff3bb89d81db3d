"""The recipe's steps: each stage's state on disk (done, interrupted, not started), its `megatron pt` command and
environment, and the plan file that keeps a rerun on the same plan."""
import json
import os
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from swift_plt.recipe.export import PROVENANCE, checkpoint_iteration, list_checkpoints
from swift_plt.recipe.family import model_type_flags, read_config, run_model_type
from swift_plt.recipe.micro_batch import (EARLY_STAGE2_BYTES, STAGE1_ALLOC_CONF, STAGE1_MICRO_BATCH, Layout, ModelShape,
                                          estimate_bytes, fitting_micro_batch, gib, pick_stage1_micro_batch)
from swift_plt.recipe.options import Options, RecipeError, check_data_parallel, micro_batch_size
from swift_plt.recipe.plan import TwoStagePlan, make_plan
from swift_plt.recipe.process import (Launch, cli_executable, flag_value, gpu_count, gpu_memory, model_parallel_size,
                                      pick_launch, user_launch)

STAGE_DIRS = {1: 'stage1_patch', 2: 'stage2_token'}
EXPORT_DIR = 'hf'


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
    env: Dict[str, str] = field(default_factory=dict)  # added to the step's environment (the process count)


def stage_launch(opts: Options, plan: TwoStagePlan, environ: Optional[Mapping[str, str]] = None,
                 device_count: Optional[Callable[[], int]] = None,
                 total_memory: Optional[Callable[[], Optional[int]]] = None, early: bool = False) -> Launch:
    """The stages' process count and micro batches: the user's NPROC_PER_NODE / NNODES, else the visible GPUs (1
    without any), lowered only where a stage's global batch does not split over the data-parallel ranks even at
    micro batch 1 (elsewhere the stage gets a smaller micro batch); RecipeError before anything runs when the count
    does not fit the batch. ``stage_micro_batches`` adds each stage's micro-batch flags (``early``: stage 2 will
    wait beside stage 1, ``cli.early_stage2``)."""
    environ = os.environ if environ is None else environ
    lower = user_launch(environ) is None  # the recipe picks the count: it may lower a stage's micro batch too

    def fits(n: int) -> Optional[str]:
        try:
            check_data_parallel(opts, plan, n, lower)
        except RecipeError as e:
            return str(e)
        return None

    launch = pick_launch(environ, fits, device_count or gpu_count)
    why = None if launch.world_size is None else fits(launch.world_size)
    if why:
        raise RecipeError(f'{why} The stages would run {launch.note}: set NPROC_PER_NODE to a count that fits, or '
                          'change the batch flags.')
    launch.stage_args, launch.stage_notes, sized = stage_micro_batches(opts, plan, launch.world_size,
                                                                       total_memory or gpu_memory, early)
    if 'PYTORCH_CUDA_ALLOC_CONF' not in environ and sized:
        launch.stage_env[1] = dict(STAGE1_ALLOC_CONF)  # stage 1 sized to its memory: no fragmentation failure
    return launch


def all_gpus_hint(opts: Options, plan: TwoStagePlan, launch: Launch, resuming: bool = False) -> str:
    """One line, when the recipe runs fewer processes than the visible GPUs because a stage's global batch does not
    split over them: the smallest --global_batch_size above G that runs both stages on all of them, what it changes,
    and what runs now ('' when all run, when the user set the count, or when no global batch would do: e.g. TP·PP·CP
    does not divide the GPU count, or the budget is too small). The recipe does not change G itself: that changes the
    optimisation. ``resuming``: OUTPUT_DIR holds this plan already (another G needs a new --output_dir)."""
    gpus, now = launch.gpus, launch.world_size
    if not gpus or now is None or now >= gpus:
        return ''
    g = plan.global_batch_size
    for bigger in range(g + 1, g + plan.patch_size * gpus + 1):  # G = a multiple of K x the GPUs always splits
        try:
            other = make_plan(plan.tokens, plan.patch_size, plan.lam, seq_length=plan.seq_length,
                              global_batch_size=bigger, stage1_batch=plan.stage1_batch)
            check_data_parallel(opts, other, gpus, lower_micro_batch=True)
        except ValueError:  # RecipeError too
            continue
        where = f' in a new --output_dir (this one holds the run at {g})' if resuming else ''
        return (f'hint: the stages run on {now} of the {gpus} visible GPUs; --global_batch_size {bigger} (now {g}) '
                f'runs them on all {gpus}{where}: {bigger / g:.3g}x the tokens per step, '
                f'{other.stage1.train_iters} + {other.stage2.train_iters} steps instead of '
                f'{plan.stage1.train_iters} + {plan.stage2.train_iters}')
    return ''


def stage_micro_batches(opts: Options, plan: TwoStagePlan, world_size: Optional[int],
                        total_memory: Callable[[], Optional[int]],
                        early: bool = False) -> Tuple[Dict[int, List[str]], Dict[int, str], bool]:
    """Per stage, the flags added at the end of its command and why: a micro batch lowered to what the global batch
    gives each data-parallel rank, and stage 1's micro batch and recompute from its GPU memory (``micro_batch.py``;
    not with --stage1_micro_batch keep or a --micro_batch_size / --recompute_* of --stage1_args); and whether stage 1
    was sized so."""
    args: Dict[int, List[str]] = {}
    notes: Dict[int, str] = {}
    mbs = {i: micro_batch_size(opts.stage_args(i)) for i in (1, 2)}

    def unsized(why: str) -> Tuple[Dict[int, List[str]], Dict[int, str], bool]:
        notes[1] = f'{notes.get(1, f"stage 1: --micro_batch_size {mbs[1]}")}; not sized from GPU memory: {why}'
        return args, notes, False

    if world_size is None:
        return unsized('the data-parallel size is not known (the process count is torchrun\'s)')
    dp = {}
    for i, s in ((1, plan.stage1), (2, plan.stage2)):
        asked, dp[i] = mbs[i], world_size // model_parallel_size(opts.stage_args(i))
        per_rank = s.global_batch_size // dp[i]
        mbs[i] = fitting_micro_batch(per_rank, asked)
        if mbs[i] != asked:
            args[i] = ['--micro_batch_size', str(mbs[i])]
            notes[i] = (f'stage {i}: --micro_batch_size {mbs[i]}, not {asked}: its --global_batch_size '
                        f'{s.global_batch_size} gives each of its {dp[i]} data-parallel ranks {per_rank} '
                        f'sequence{"s" if per_rank > 1 else ""} per step')
    if opts.stage1_micro_batch != STAGE1_MICRO_BATCH[0]:
        return unsized(f'--stage1_micro_batch {opts.stage1_micro_batch}')
    memory = total_memory()
    if memory is None:
        return unsized('no CUDA device here')
    try:
        config = read_config(opts.model)
        shape = ModelShape.from_config(config)
        layout1, layout2 = (Layout.from_argv(opts.stage_args(i), config) for i in (1, 2))
    except ValueError as e:
        return unsized(f'cannot estimate it ({e})')
    positions = plan.stage1.seq_length // plan.patch_size
    own = [f for f in ('micro_batch_size', 'recompute_granularity', 'recompute_method', 'recompute_num_layers')
           if flag_value(opts.stage1_args, f) is not None]
    if own:
        est = estimate_bytes(shape, layout1, positions, plan.patch_size, mbs[1], dp[1])
        return unsized(f'{", ".join("--" + f for f in own)} from --stage1_args (est. {gib(est)} of {gib(memory)} '
                       f'at K={plan.patch_size})')
    choice = pick_stage1_micro_batch(shape, layout1, positions, plan.patch_size, plan.stage1.global_batch_size // dp[1],
                                     dp[1], mbs[1], memory, (layout2, mbs[2], dp[2]),
                                     beside=EARLY_STAGE2_BYTES if early else 0)
    args[1], notes[1] = list(choice.flags), choice.reason
    return args, notes, True


def _stage_cmd(opts: Options, plan: TwoStagePlan, stage: int, state: StageState, init: List[str],
               added: Sequence[str] = ()) -> List[str]:
    s = plan.stage1 if stage == 1 else plan.stage2
    extra = opts.stage1_args if stage == 1 else opts.stage2_args
    # Megatron checkpoints, which stage 2 loads as trained: with safetensors and no optimizer state ms-swift would
    # save no Megatron weights. The HF model comes from the export.
    # the model type: the user's --model_type (shared flags only), else from config.json (Llama: llama3_2_plt)
    return [
        cli_executable('megatron'), 'pt', '--model', opts.model,
        *model_type_flags(run_model_type(opts.model, opts.args)),
        '--patch_size', str(s.patch_size), '--max_length', str(s.seq_length), '--global_batch_size',
        str(s.global_batch_size), '--train_iters', str(s.train_iters), '--output_dir', state.run_dir, '--add_version',
        'false', '--save_safetensors', 'false', *init, *opts.args, *extra, *added
    ]


def _stage_step(opts: Options, plan: TwoStagePlan, state: StageState, start_action: str, start_init: List[str],
                env: Mapping[str, str], added: Sequence[str] = ()) -> Step:
    """complete -> skip; interrupted -> ms-swift's full resume from the latest checkpoint; else the fresh start."""
    name = f'stage{state.stage}'
    if state.complete:
        return Step(name, f'skip (complete: {state.final_checkpoint})', None)
    if state.resume_from:  # --finetune false: weights, optimizer, LR schedule, RNG, iteration and data position
        return Step(name, f'resume from {state.resume_from}',
                    _stage_cmd(opts, plan, state.stage, state, ['--mcore_model', state.resume_from, '--finetune',
                                                                 'false'], added), dict(env))
    return Step(name, start_action, _stage_cmd(opts, plan, state.stage, state, start_init, added), dict(env))


def plan_steps(opts: Options, plan: TwoStagePlan, env: Optional[Mapping[str, str]] = None,
               export_env: Optional[Mapping[str, str]] = None,
               stage_args: Optional[Mapping[int, Sequence[str]]] = None,
               stage_env: Optional[Mapping[int, Mapping[str, str]]] = None) -> List[Step]:
    """What a run of ``opts`` does now, from the state on disk, with ``env`` added to the stages' environment,
    ``export_env`` to the export's and ``stage_args`` (Launch.stage_args) at the end of each stage's command. Raises
    RecipeError before anything runs."""
    env, export_env, stage_args, stage_env = env or {}, export_env or {}, stage_args or {}, stage_env or {}
    out = os.path.abspath(opts.output_dir)
    s1 = stage_state(out, 1, plan.stage1.train_iters)
    s2 = stage_state(out, 2, plan.stage2.train_iters)
    steps = []
    want = {'all': (1, 2, 3), '1': (1, ), '2': (2, ), 'export': (3, )}[opts.stage]
    if 1 in want:
        steps.append(_stage_step(opts, plan, s1, 'start', [], dict(env, **stage_env.get(1, {})),
                                 stage_args.get(1, ())))
    if 2 in want:
        start = opts.stage1_checkpoint or s1.final_checkpoint
        will_exist = opts.stage1_checkpoint is None and 1 in want  # stage 1 runs first in this command
        if (not s2.complete and not s2.resume_from and not will_exist
                and checkpoint_iteration(start) is None):
            raise RecipeError(
                f'stage 2 starts from the stage-1 checkpoint {start}, which does not exist or is incomplete '
                f'(no {os.path.basename(start)}/latest_checkpointed_iteration.txt). Run stage 1 first (--stage 1 '
                'or --stage all, same --output_dir and plan), or pass --stage1_checkpoint <checkpoint-N dir>.')
        # weights only, as in the paper: no optimizer, LR schedule or RNG state, iteration 0
        steps.append(_stage_step(opts, plan, s2, f'start from {start} (weights only: --finetune true)',
                                 ['--mcore_model', start, '--finetune', 'true'], env, stage_args.get(2, ())))
    if 3 in want:
        if not s2.complete and 2 not in want:
            raise RecipeError(f'nothing to export: stage 2 is not complete ({s2.final_checkpoint} missing). Run the '
                              'stages first, or export any checkpoint with `python -m swift_plt.recipe.export`.')
        hf = os.path.join(out, EXPORT_DIR)
        done = exported_from(hf) == os.path.abspath(s2.final_checkpoint)
        steps.append(Step('export', f'skip (done: {hf})' if done else f'{s2.final_checkpoint} -> {hf}', None,
                          dict(export_env)))
    return steps


def exported_from(hf_dir: str) -> Optional[str]:
    """The checkpoint a finished vanilla export in ``hf_dir`` came from (its provenance file), else None."""
    try:
        with open(os.path.join(hf_dir, PROVENANCE), encoding='utf-8') as f:
            return json.load(f).get('checkpoint')
    except (OSError, ValueError):
        return None


def check_plan_file(out: str, plan: TwoStagePlan, write: bool) -> None:
    """Refuse an OUTPUT_DIR whose plan.json holds another plan (a rerun resumes only the same plan); write it."""
    path = os.path.join(out, 'plan.json')
    current = plan.to_dict()
    if os.path.exists(path):
        with open(path, encoding='utf-8') as f:
            old = json.load(f)
        if old != current:
            diff = {k: (old.get(k), current[k]) for k in current if old.get(k) != current[k]}
            raise RecipeError(f'{out} holds a run with another plan (old, new): {diff}. Rerun with the same '
                              '--tokens/--patch_size/--lam/--max_length/--global_batch_size/--stage1_batch to resume '
                              'it, or use a new --output_dir.')
    elif write:
        os.makedirs(out, exist_ok=True)
        tmp = f'{path}.{os.getpid()}.tmp'
        with open(tmp, 'w', encoding='utf-8') as f:
            json.dump(current, f, indent=2)
        os.replace(tmp, path)  # another node never reads half of it
