"""``--patch_size``: resolution (CLI > HF config.json > 1) and every check that must fail before step 1."""
from typing import Optional

from . import PLT_MODEL_TYPE

PATCH_SIZE_HELP = ('Patch-level training: number of consecutive tokens K pooled into one patch (model type '
                   f'{PLT_MODEL_TYPE} only). 1 = ordinary token-level training. Default: `patch_size` of the HF '
                   'config.json, else 1.')


def is_plt_model(args) -> bool:
    meta = getattr(args, 'megatron_model_meta', None)
    return meta is not None and meta.model_type == PLT_MODEL_TYPE


def resolve_patch_size(args) -> int:
    """Set ``args.patch_size`` to the effective K and raise ValueError (what is wrong, what to do) on bad input."""
    plt = is_plt_model(args)
    k: Optional[int] = args.patch_size
    if k is None and plt:
        config = getattr(getattr(args, 'model_info', None), 'config', None)
        k = getattr(config, 'patch_size', None)
    k = 1 if k is None else k
    check_patch_size(k, args.model_type, plt)
    args.patch_size = k
    if k > 1:
        check_plt_supported(args, k)
    return k


def check_patch_size(k, model_type: str, plt: bool) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f'--patch_size must be an integer >= 1 (1 = token-level training), got {k!r}.')
    if k > 1 and not plt:
        raise ValueError(f'--patch_size {k}: model type `{model_type}` has no patch-level training. Use '
                         f'`--model_type {PLT_MODEL_TYPE} --custom_register_path custom_model/llama.py` (Llama '
                         f'checkpoints), or drop --patch_size.')


def check_plt_supported(args, k: int) -> None:
    problems = []
    if getattr(args, 'task_type', 'causal_lm') != 'causal_lm':
        problems.append(f'--task_type {args.task_type} (PLT trains causal LMs only; use --task_type causal_lm)')
    if getattr(args, 'rlhf_type', None) is not None:
        problems.append(f'rlhf_type={args.rlhf_type} (PLT is a pre-training objective; use `megatron pt`/`sft`)')
    if getattr(args, 'mtp_num_layers', None):
        problems.append('--mtp_num_layers (multi-token prediction is not supported with PLT; drop it)')
    if getattr(args, 'is_multimodal', False):
        problems.append('a multimodal model (PLT supports text-only Llama models)')
    if getattr(args, 'context_parallel_size', 1) > 1:
        problems.append('--context_parallel_size > 1 (not supported with PLT yet; use TP/PP/DP)')
    if getattr(args, 'sequence_parallel', False):
        problems.append('--sequence_parallel true (not supported with PLT yet; drop it)')
    for name in ('max_length', 'packing_length', 'seq_length'):
        value = getattr(args, name, None)
        if value and value % k:
            problems.append(f'--{name} {value} is not a multiple of --patch_size {k} (use {value - value % k} '
                            f'or {value - value % k + k})')
    if problems:
        raise ValueError(f'--patch_size {k} cannot be used with: ' + '; '.join(problems) + '.')
