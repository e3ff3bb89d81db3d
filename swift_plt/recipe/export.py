"""Vanilla export: a Megatron checkpoint of a PLT run (either stage, any supported family) -> the family's own plain
HF model (e.g. LlamaForCausalLM, Qwen3ForCausalLM) that plain transformers loads. ms-swift's ``megatron export
--to_hf`` writes the weights (a PLT model's weights are the family's at any K), then ``make_vanilla`` drops the PLT
parts of config.json and ms-swift's args.json.

    swift-plt-export-vanilla --checkpoint OUT/stage2_token [--output_dir DIR] [--model HF_DIR] [EXPORT_ARGS]
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
from typing import List, Mapping, Optional, Sequence

from swift_plt.recipe.family import causal_lm_class, model_type_flags, read_config, swift_model_type
from swift_plt.recipe.process import cli_executable, export_launch, failure_cause, flag_value, run_logged

TRACKER = 'latest_checkpointed_iteration.txt'
PROVENANCE = 'swift_plt_export.json'
# config.json keys a plain model must not have: PLT's training-time K, and remote-code hooks.
NON_VANILLA_KEYS = ('patch_size', 'auto_map', 'custom_pipelines')


# ---------------------------------------------------------------------------------------------- checkpoints
def checkpoint_iteration(ckpt_dir: str) -> Optional[int]:
    """Iteration recorded by megatron in ``ckpt_dir/latest_checkpointed_iteration.txt`` (written after the
    checkpoint's data are saved), or None when there is no complete checkpoint there."""
    path = os.path.join(ckpt_dir, TRACKER)
    try:
        with open(path) as f:
            it = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return it if os.path.isdir(os.path.join(ckpt_dir, f'iter_{it:07d}')) else None


def list_checkpoints(run_dir: str) -> dict:
    """{iteration: dir} of the complete ms-swift checkpoints ``run_dir/checkpoint-N`` of a `megatron pt` run."""
    found = {}
    for d in glob.glob(os.path.join(run_dir, 'checkpoint-*')):
        m = re.fullmatch(r'checkpoint-(\d+)', os.path.basename(d))
        if m and checkpoint_iteration(d) == int(m.group(1)):
            found[int(m.group(1))] = d
    return found


def resolve_checkpoint(path: str) -> str:
    """A Megatron checkpoint dir (``.../checkpoint-N``) or a run's output dir (its latest complete checkpoint)."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f'checkpoint {path!r} does not exist.')
    if checkpoint_iteration(path) is not None:
        return path
    found = list_checkpoints(path)
    if not found:
        raise FileNotFoundError(f'{path!r} holds no complete Megatron checkpoint (a `checkpoint-N` folder with '
                                f'{TRACKER}); pass the output_dir of a `megatron pt` run or one of its '
                                'checkpoint-N folders.')
    return found[max(found)]


def run_args(ckpt_dir: str) -> dict:
    """ms-swift's args.json of the run that wrote ``ckpt_dir`` (in it or beside it), else {}."""
    for path in (os.path.join(ckpt_dir, 'args.json'), os.path.join(os.path.dirname(ckpt_dir), 'args.json')):
        if os.path.exists(path):
            with open(path, encoding='utf-8') as f:
                return json.load(f)
    return {}


def source_model_dir(ckpt_dir: str) -> str:
    """The HF model dir the run started from (tokenizer, config), from ms-swift's args.json in the checkpoint."""
    args = run_args(ckpt_dir)
    for key in ('model_dir', 'model'):
        if args.get(key) and os.path.isdir(args[key]):
            return args[key]
    raise FileNotFoundError(f'cannot tell which HF model {ckpt_dir!r} was trained from (no args.json naming an '
                            'existing model dir); pass --model <the HF model dir of the run>.')


# ---------------------------------------------------------------------------------------------- vanilla config
def vanilla_config(config: dict) -> dict:
    """config.json of a (PLT-trained) model -> the family's plain config (a new dict): its own model_type and
    transformers ``*ForCausalLM``, no PLT or remote-code keys. ValueError without such a class."""
    out = {k: v for k, v in config.items() if k not in NON_VANILLA_KEYS}
    out['architectures'] = [causal_lm_class(config)]
    return out


def make_vanilla(hf_dir: str, provenance: Optional[dict] = None) -> None:
    """Rewrite an HF dir written by the bridge in place into a plain checkpoint of its family (module docstring)."""
    path = os.path.join(hf_dir, 'config.json')
    with open(path, encoding='utf-8') as f:
        config = json.load(f)
    with open(path, 'w', encoding='utf-8') as f:
        json.dump(vanilla_config(config), f, indent=2, sort_keys=True)
    for py in glob.glob(os.path.join(hf_dir, '*.py')):
        os.remove(py)
    record = dict(provenance or {})
    args_path = os.path.join(hf_dir, 'args.json')
    if os.path.exists(args_path):
        with open(args_path, encoding='utf-8') as f:
            record['ms_swift_args'] = json.load(f)
        os.remove(args_path)
    with open(os.path.join(hf_dir, PROVENANCE), 'w', encoding='utf-8') as f:
        json.dump(record, f, indent=2, default=str)


def check_vanilla(hf_dir: str) -> dict:
    """Raise AssertionError unless ``hf_dir`` is a plain HF causal LM of its config's model_type that plain
    transformers loads as its own class, without remote code; return a short report (the class loaded). Run it where
    swift-plt is not active (``SWIFT_PLT_DISABLE=1``) to prove that nothing of the plugin is needed."""
    with open(os.path.join(hf_dir, 'config.json'), encoding='utf-8') as f:
        config = json.load(f)
    problems = [f'config.json has {k!r}' for k in NON_VANILLA_KEYS if k in config]
    try:
        want = causal_lm_class(config)
    except ValueError:
        want = None
        problems.append(f'model_type is {config.get("model_type")!r} (no transformers causal LM class)')
    if want and config.get('architectures') != [want]:
        problems.append(f'architectures is {config.get("architectures")!r}, not {[want]!r}')
    problems += [f'custom code file {os.path.basename(p)}' for p in glob.glob(os.path.join(hf_dir, '*.py'))]
    if problems:
        raise AssertionError(f'{hf_dir} is not a vanilla checkpoint: ' + '; '.join(problems))
    from transformers import AutoConfig

    from swift_plt.compat.transformers import hf_rope_guard
    from swift_plt.models.hf_causal_lm import causal_lm_class as transformers_class
    with hf_rope_guard():  # safe after mcore-bridge ran in this process, on transformers 4.57.x and 5.x
        # transformers' Auto mapping of the config (Qwen3.5: its multimodal class, vision tower included)
        auto = transformers_class(AutoConfig.from_pretrained(hf_dir, trust_remote_code=False))
        model = auto.from_pretrained(hf_dir, trust_remote_code=False)
    cls = type(model)
    if (not cls.__module__.startswith('transformers.models.') or cls.__name__ != want
            or getattr(cls.config_class, 'model_type', None) != config['model_type']):
        raise AssertionError(f'{hf_dir} loads as {cls.__module__}.{cls.__name__}, not transformers {want} '
                             f'(model_type {config["model_type"]!r})')
    return {'class': f'{cls.__module__}.{cls.__name__}', 'model_type': config['model_type'],
            'num_parameters': sum(p.numel() for p in model.parameters())}


# ---------------------------------------------------------------------------------------------- the export
def check_export_args(extra: Sequence[str], patch_size: Optional[int] = None) -> None:
    """Refuse a request to export a patch-level (K>1) model, and the flags the export sets itself."""
    ks = [patch_size] if patch_size is not None else []
    ks += [extra[i + 1] for i, a in enumerate(extra[:-1]) if a == '--patch_size']
    ks += [a.split('=', 1)[1] for a in extra if a.startswith('--patch_size=')]
    for k in ks:
        if str(k).strip() != '1':
            raise ValueError(f'--patch_size {k}: the vanilla export writes a plain model (no patch_size in its config: '
                             'the same weights serve every K, and K is a training-time setting). Drop --patch_size; '
                             'to train further at patch level, pass the exported dir to `megatron pt --patch_size K` '
                             '(with its usual --model_type).')
    for flag in ('--to_mcore', '--mcore_model', '--output_dir', '--model_type', '--to_hf'):
        if any(a == flag or a.startswith(flag + '=') for a in extra):
            raise ValueError(f'{flag} is set by the vanilla export itself; drop it from the extra arguments.')


def export_command(ckpt_dir: str, output_dir: str, model: str, model_type: str, extra: Sequence[str] = (),
                   template: Optional[str] = None) -> List[str]:
    # --patch_size 1: the Megatron side of ms-swift's optional --test_convert_precision check is the token-level model.
    # --template: the run's, unless given (ms-swift finds none itself for a local dir of several candidate templates)
    template = [] if template is None or flag_value(extra, 'template') else ['--template', template]
    return [
        cli_executable('megatron'), 'export', '--mcore_model', ckpt_dir, '--model', model,
        *model_type_flags(model_type), *template, '--patch_size', '1', '--to_hf', 'true', '--output_dir', output_dir,
        *extra
    ]


def export_model_type(ckpt_dir: str, model: str) -> str:
    """The ms-swift model type the run that wrote ``ckpt_dir`` trained with (its args.json), else from config.json."""
    return run_args(ckpt_dir).get('model_type') or swift_model_type(read_config(model).get('model_type'))


def export_vanilla(checkpoint: str,
                   output_dir: str,
                   model: Optional[str] = None,
                   extra: Sequence[str] = (),
                   patch_size: Optional[int] = None,
                   log_path: Optional[str] = None,
                   dry_run: bool = False,
                   extra_env: Optional[Mapping[str, str]] = None,
                   model_type: Optional[str] = None) -> List[str]:
    """Export ``checkpoint`` (a checkpoint-N dir or a run's output dir) to ``output_dir`` as its family's plain HF
    model; ``model_type``: the ms-swift model type (default: the run's, ``export_model_type``); the run's
    ``--template`` (args.json) too unless ``extra`` has one.

    ``extra``: more `megatron export` flags; ``extra_env``: added to its environment (default: ``export_launch``'s
    process count). Writes ``output_dir + '.tmp'`` and renames it at the end, so ``output_dir`` is always finished.
    """
    check_export_args(extra, patch_size)
    ckpt = resolve_checkpoint(checkpoint)
    model = model or source_model_dir(ckpt)
    output_dir = os.path.abspath(output_dir)
    tmp = output_dir + '.tmp'
    cmd = export_command(ckpt, tmp, model, model_type or export_model_type(ckpt, model), extra,
                         run_args(ckpt).get('template'))
    if dry_run:
        return cmd
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    log_path = log_path or os.path.join(os.path.dirname(output_dir), 'logs', 'export.log')
    offset = os.path.getsize(log_path) if os.path.exists(log_path) else 0
    rc = run_logged(cmd, log_path, export_launch(extra).env if extra_env is None else extra_env)
    if rc != 0:
        raise RuntimeError(f'`megatron export` failed (exit code {rc}); log: {log_path}; likely cause: '
                           f'{failure_cause(log_path, offset)}')
    make_vanilla(tmp, {'checkpoint': os.path.abspath(ckpt), 'iteration': checkpoint_iteration(ckpt),
                       'source_model': model, 'command': cmd})
    if os.path.exists(output_dir):
        shutil.rmtree(output_dir)
    os.rename(tmp, output_dir)
    return cmd


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog='swift-plt-export-vanilla',
        description='Export a Megatron checkpoint of a PLT run (patch or token stage) as its family\'s plain HF model '
        '(e.g. LlamaForCausalLM). Unknown flags are passed to `megatron export`.')
    parser.add_argument('--checkpoint', required=False, help='checkpoint-N dir, or a `megatron pt` output_dir')
    parser.add_argument('--output_dir', help='default: <checkpoint>-vanilla')
    parser.add_argument('--model', help='HF model dir the run started from (default: from args.json)')
    parser.add_argument('--model_type', help='ms-swift model type of the run (default: from args.json, else from '
                        'config.json: llama3_2_plt for Llama, else its model_type)')
    parser.add_argument('--patch_size', type=int, help='refused unless 1: exported models are plain models')
    parser.add_argument('--check', metavar='HF_DIR', help='only check that HF_DIR is a vanilla model and exit')
    parser.add_argument('--dry_run', action='store_true', help='print the command only')
    args, extra = parser.parse_known_args(argv)
    try:
        if args.check:
            print(json.dumps(check_vanilla(args.check)))
            return 0
        if not args.checkpoint:
            parser.error('--checkpoint is required (or --check HF_DIR)')
        out = args.output_dir or os.path.abspath(resolve_checkpoint(args.checkpoint)) + '-vanilla'
        check_export_args(extra, args.patch_size)
        launch = export_launch(extra)
        print(f'swift-plt-export-vanilla: {launch.note}', flush=True)
        cmd = export_vanilla(args.checkpoint, out, args.model, extra, args.patch_size, dry_run=args.dry_run,
                             extra_env=launch.env, model_type=args.model_type)
    except (ValueError, FileNotFoundError, RuntimeError, AssertionError) as e:
        print(f'swift-plt-export-vanilla: error: {e}', file=sys.stderr)
        return 2
    print(('would run: ' if args.dry_run else 'exported with: ') + subprocess.list2cmdline(cmd))
    if not args.dry_run:
        print(f'vanilla model written to {out}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
