"""The two-stage recipe's options (command line and YAML) and their checks against the plan, before anything runs."""
import argparse
import json
import shlex
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from swift_plt.recipe.early_start import STAGE2_START
from swift_plt.recipe.micro_batch import STAGE1_MICRO_BATCH, fitting_micro_batch
from swift_plt.recipe.plan import DEFAULT_LAM, DEFAULT_PATCH_SIZE, STAGE1_BATCH, TwoStagePlan
from swift_plt.recipe.process import flag_int, flag_value, model_parallel_size

# Set by the recipe for each stage; a user value would contradict the plan or the hand-over.
RESERVED = ('train_iters', 'num_train_epochs', 'max_epochs', 'max_length', 'packing_length', 'seq_length',
            'patch_size', 'mcore_model', 'finetune', 'output_dir', 'add_version', 'save_safetensors',
            'global_batch_size', 'model')
# Allowed with the flags of both stages only: both stages and the export must use the same one.
SHARED_ONLY = ('model_type', )


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
    stage1_micro_batch: str = STAGE1_MICRO_BATCH[0]  # auto: from GPU memory (micro_batch.py); keep: as given
    args: List[str] = field(default_factory=list)  # both stages
    stage1_args: List[str] = field(default_factory=list)
    stage2_args: List[str] = field(default_factory=list)
    export_args: List[str] = field(default_factory=list)  # `megatron export` (e.g. --torch_dtype, CPU flags)
    stage: str = 'all'  # all | 1 | 2 | export
    stage1_checkpoint: Optional[str] = None  # stage 2's start (default: OUTPUT_DIR/stage1_patch/checkpoint-n1)
    stage2_start: str = STAGE2_START[0]  # early: its start-up and data beside stage 1 (early_start.py); after
    dry_run: bool = False

    def stage_args(self, stage: int) -> List[str]:
        """The pass-through flags of a stage's `megatron pt`: both stages', then its own (the last value wins)."""
        return list(self.args) + list(self.stage1_args if stage == 1 else self.stage2_args)


def _flag_names(argv: Sequence[str]) -> List[str]:
    return [a[2:].split('=', 1)[0].replace('-', '_') for a in argv if a.startswith('--')]


def check_passthrough(argv: Sequence[str], where: str, shared: bool = False) -> None:
    """Refuse the flags the recipe sets itself; ``shared``: the flags of both stages, which may set SHARED_ONLY."""
    bad = sorted(set(_flag_names(argv)) & set(RESERVED))
    if bad:
        raise RecipeError(f'{where}: {", ".join("--" + b for b in bad)} is set by the two-stage recipe for each stage '
                          '(from --tokens/--max_length/--global_batch_size/--patch_size/--lam/--output_dir); drop it.')
    bad = [] if shared else sorted(set(_flag_names(argv)) & set(SHARED_ONLY))
    if bad:
        raise RecipeError(f'{where}: {", ".join("--" + b for b in bad)} must be the same for both stages and the '
                          'export: pass it with the flags of both stages (not --stage1_args/--stage2_args).')


def micro_batch_size(argv: Sequence[str]) -> int:
    """The stage's --micro_batch_size (ms-swift's default 1); RecipeError unless an integer."""
    try:
        return flag_int(argv, 'micro_batch_size')
    except ValueError as e:
        raise RecipeError(str(e)) from None


def check_micro_batch(opts: Options, plan: TwoStagePlan) -> None:
    """Each stage's --micro_batch_size is a positive integer; whether it splits the stage's global batch depends on
    the data-parallel size (``check_data_parallel``)."""
    for i in (1, 2):
        mbs = micro_batch_size(opts.stage_args(i))
        if mbs < 1:
            raise RecipeError(f'stage {i}: --micro_batch_size {mbs} must be at least 1.')


def check_data_parallel(opts: Options, plan: TwoStagePlan, processes: int, lower_micro_batch: bool = False) -> None:
    """With ``processes`` per stage, megatron needs them to be a multiple of TP·PP·CP and each stage's global batch
    to be a multiple of micro batch x data-parallel size (processes / TP·PP·CP). ``lower_micro_batch`` (the recipe
    picked the count): only the data-parallel size must divide it, the stage then runs a smaller micro batch."""
    for i, s in ((1, plan.stage1), (2, plan.stage2)):
        argv = opts.stage_args(i)
        try:
            mp = model_parallel_size(argv)
        except ValueError as e:
            raise RecipeError(str(e)) from None
        if processes % mp:
            raise RecipeError(f'stage {i}: {processes} process(es) is not a multiple of TP·PP·CP = {mp} (tensor x '
                              'pipeline x context parallel size).')
        g, mbs, dp = s.global_batch_size, max(micro_batch_size(argv), 1), processes // mp
        hint = (f' (stage 1 takes G/K = {g} sequence{"s" if g > 1 else ""} of {s.seq_length} tokens per step, '
                f'--stage1_batch {plan.stage1_batch})' if i == 1 and plan.stage1_batch == STAGE1_BATCH[0] else '')
        if g % dp:
            raise RecipeError(f'stage {i}: its --global_batch_size {g} is not a multiple of data-parallel size {dp}, '
                              f'not even at --micro_batch_size 1{hint}.')
        if g % (mbs * dp) and not lower_micro_batch:
            raise RecipeError(f'stage {i}: its --global_batch_size {g} is not a multiple of --micro_batch_size {mbs} '
                              f'x data-parallel size {dp}{hint}: give stage {i} --stage{i}_args "--micro_batch_size '
                              f'{fitting_micro_batch(g // dp, mbs)}" (the training is the same at any micro batch).')


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
        '(1-λ)·N tokens from the stage-1 weights (fresh optimizer and LR schedule), then an export as the family\'s '
        'plain HF model (e.g. Qwen3ForCausalLM). Every flag not listed here is passed to `megatron pt` in both stages. '
        'Rerun the same command to resume.')
    p.add_argument('--config', help='YAML file whose keys are these flags (the command line wins)')
    p.add_argument('--model', help='local HF dir to start from (Llama, Qwen3, ...: see swift_plt.families); its '
                   'config.json model_type picks --model_type (llama3_2_plt for Llama) unless --model_type is given')
    p.add_argument('--output_dir', help='run dir: stage1_patch/, stage2_token/, hf/, logs/, plan.json')
    p.add_argument('--tokens', help='token budget N: 2000000000, 2e9 or 2B (K/M/B/T = powers of 1000)')
    p.add_argument('--max_length', type=int, help='T: token-level sequence length (the patch stage uses K*T)')
    p.add_argument('--global_batch_size', type=int,
                   help='G: sequences per optimizer step of the token-level stage (stage 1: see --stage1_batch)')
    p.add_argument('--stage1_batch', choices=list(STAGE1_BATCH),
                   help='tokens (default, as in the paper): stage 1 takes G/K sequences of K*T tokens per step, the '
                   'same tokens per step as stage 2; sequences: G sequences per step (K times the tokens per step, '
                   '1/K the steps)')
    p.add_argument('--stage1_micro_batch', choices=list(STAGE1_MICRO_BATCH),
                   help='auto (default): stage 1 gets the largest --micro_batch_size its GPU memory holds (estimated '
                   'from config.json), and drops or adds recompute accordingly; keep: the --micro_batch_size of both '
                   'stages (lowered only where the global batch does not split into it over the GPUs). '
                   '--stage1_args "--micro_batch_size N" always wins')
    p.add_argument('--patch_size', type=int, help=f'K (default {DEFAULT_PATCH_SIZE})')
    p.add_argument('--lam', help=f'λ, the patch-level fraction of N, in (0, 1) (default {DEFAULT_LAM})')
    p.add_argument('--stage1_args', help='extra `megatron pt` flags for stage 1 only (one quoted string)')
    p.add_argument('--stage2_args', help='extra `megatron pt` flags for stage 2 only (one quoted string)')
    p.add_argument('--export_args', help='extra `megatron export` flags (one quoted string)')
    p.add_argument('--stage', choices=['all', '1', '2', 'export'], help='run only this step (default: all)')
    p.add_argument('--stage1_checkpoint', help='start stage 2 from this Megatron checkpoint')
    p.add_argument('--stage2_start', choices=list(STAGE2_START),
                   help='early (default): when both stages run in this command on one node, stage 2\'s process '
                   'starts with stage 1\'s and does its start-up and data encoding while stage 1 trains, waiting for '
                   'stage 1 to finish before it builds its model; after: it starts when stage 1 has finished')
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
    values['stage1_micro_batch'] = str(values.get('stage1_micro_batch', STAGE1_MICRO_BATCH[0]))
    if values['stage1_micro_batch'] not in STAGE1_MICRO_BATCH:
        raise RecipeError(f"--stage1_micro_batch {values['stage1_micro_batch']!r}: use auto or keep.")
    values['stage2_start'] = str(values.get('stage2_start', STAGE2_START[0]))
    if values['stage2_start'] not in STAGE2_START:
        raise RecipeError(f"--stage2_start {values['stage2_start']!r}: use early or after.")
    values['dry_run'] = bool(values.get('dry_run', False))
    return Options(**values)
