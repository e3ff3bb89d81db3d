"""``--patch_size``: resolution (CLI > HF config.json > 1) and every check that must fail before step 1."""
from swift_plt import PLT_MODEL_TYPE
from swift_plt.patch_level import patch_size as patch_size_rule

PATCH_SIZE_HELP = ('Patch-level training: number of consecutive tokens K pooled into one patch (model type '
                   f'{PLT_MODEL_TYPE} only). 1 = ordinary token-level training. Default: `patch_size` of the HF '
                   'config.json, else 1.')


def is_plt_model(args) -> bool:
    """Megatron arguments: mcore-bridge's model meta; HF-side arguments (no Megatron meta): ms-swift's."""
    meta = getattr(args, 'megatron_model_meta', None) or getattr(args, 'model_meta', None)
    return meta is not None and meta.model_type == PLT_MODEL_TYPE


def resolve_patch_size(args) -> int:
    """Set ``args.patch_size`` to the effective K and raise ValueError (what is wrong, what to do) on bad input."""
    plt = is_plt_model(args)
    config = getattr(getattr(args, 'model_info', None), 'config', None) if plt else None
    k = patch_size_rule.resolve_patch_size(args.patch_size, config)
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
    if (getattr(args, 'context_parallel_size', 1) or 1) > 1 and getattr(args, 'cp_partition_mode',
                                                                         'zigzag') != 'zigzag':
        # Transformer Engine's CP attention (Llama's) and megatron's RoPE slicing for padded batches implement the
        # zigzag layout only; the contiguous split is a DeepSeek-V4 layout (its own attention).
        problems.append(f'--cp_partition_mode {args.cp_partition_mode} with --context_parallel_size > 1 (the '
                        'attention of a dense Llama under context parallel assumes the zigzag split; use '
                        '--cp_partition_mode zigzag, the default)')
    for name in ('max_length', 'packing_length', 'seq_length'):
        value = getattr(args, name, None)
        if value and value % k:
            problems.append(f'--{name} {value} is not a multiple of --patch_size {k} (use {value - value % k} '
                            f'or {value - value % k + k})')
    if problems:
        raise ValueError(f'--patch_size {k} cannot be used with: ' + '; '.join(problems) + '.')


# HF backend (`swift pt/sft`): options with which ms-swift's HF trainer computes the loss outside the model
# (swift/trainers/seq2seq_trainer.py: compute_loss pops the labels and applies a token-level shifted CE) or changes
# the model's forward; the PLT loss must come from the model. (attribute, is it set?, what to do)
HF_UNSUPPORTED = [
    ('sequence_parallel_size', lambda v: (v or 1) > 1, '--sequence_parallel_size > 1 (not supported with PLT)'),
    ('enable_dft_loss', bool, '--enable_dft_loss (a token-level loss computed outside the model; drop it)'),
    ('enable_channel_loss', bool, '--enable_channel_loss (a token-level loss computed outside the model; drop it)'),
    ('loss_type', lambda v: v is not None, '--loss_type (PLT computes its own loss in the model; drop it)'),
    ('label_smoothing_factor', bool, '--label_smoothing_factor (not part of the PLT loss; drop it)'),
    ('use_liger_kernel', bool, '--use_liger_kernel (replaces the model\'s loss; drop it)'),
    ('use_logits_to_keep', bool, '--use_logits_to_keep true (trims the labels token by token; drop it)'),
    ('tuner_backend', lambda v: v == 'unsloth', '--tuner_backend unsloth (loads its own model class)'),
]


def resolve_patch_size_hf(args, command: str) -> int:
    """HF-side arguments: ``resolve_patch_size`` plus what only the HF backend needs. ``command``: 'train' (swift
    pt/sft), 'export' (weights do not depend on K: accepted and recorded) or anything else (refused at K > 1)."""
    k = resolve_patch_size(args)
    if k == 1 or command == 'export':
        return k
    if command != 'train':
        raise ValueError(f'--patch_size {k}: a patch-level (PLT) model does not generate token by token, so only '
                         'training (swift pt/sft, megatron pt/sft) and swift export take --patch_size > 1. Use the '
                         'token-level model here: drop --patch_size (checkpoints are saved as plain Llama).')
    problems = [msg for name, is_set, msg in HF_UNSUPPORTED if is_set(getattr(args, name, None))]
    loss_scale = getattr(args, 'loss_scale', None)
    if loss_scale is not None and not getattr(args, 'is_binary_loss_scale', None):
        from swift.loss_scale import get_loss_scale
        if not get_loss_scale(loss_scale).is_binary_loss_scale:
            problems.append(f'--loss_scale {loss_scale} (non-binary token weights are applied outside the model; '
                            'use default/all)')
    if problems:
        raise ValueError(f'--patch_size {k} cannot be used with: ' + '; '.join(problems) + '.')
    return k
