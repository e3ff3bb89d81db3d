"""``--patch_size``: resolution (CLI > HF config.json > 1) and every check that must fail before step 1."""
import importlib.util
import json
import os
import re
from typing import Optional

from swift_plt import PLT_MODEL_TYPE, families
from swift_plt.patch_level import patch_size as patch_size_rule

PATCH_SIZE_HELP = ('Patch-level training: number of consecutive tokens K pooled into one patch (decoder-only '
                   f'families: {families.supported_list()}). 1 = ordinary token-level training. Default: 1 '
                   f'(model type {PLT_MODEL_TYPE}: `patch_size` of the HF config.json, else 1).')


def _meta(args):
    """Megatron arguments: mcore-bridge's model meta; HF-side arguments (no Megatron meta): ms-swift's."""
    return getattr(args, 'megatron_model_meta', None) or getattr(args, 'model_meta', None)


def is_plt_model(args) -> bool:
    """The design's model type ``llama3_2_plt``, whose config.json may carry ``patch_size``."""
    meta = _meta(args)
    return meta is not None and meta.model_type == PLT_MODEL_TYPE


def plt_model_refusal(args) -> Optional[str]:
    """None where this run's model trains at K > 1, else why not and what to do."""
    if is_plt_model(args):
        return None
    from swift_plt.critic.arguments import is_critic
    if is_critic(args):
        return f'`{args.model_type}` is a critic (value head), trained token by token. Use --patch_size 1.'
    meta = getattr(args, 'megatron_model_meta', None)
    if meta is not None and meta.model_type not in families.plt_mcore_types():
        reason = families.mcore_refusal(meta.model_type)  # every type of mcore-bridge 1.6.5 has one
        if reason:
            return f'`{args.model_type}` (mcore-bridge type `{meta.model_type}`) is not supported: {reason}. ' \
                   'Use --patch_size 1.'
        return (f'`{args.model_type}` is built by mcore-bridge as `{meta.model_type}`, not the GPT decoder PLT wraps '
                f'(supported: {families.supported_list()}). Use --patch_size 1.')
    return families.plt_refusal(hf_model_type(args), bool(getattr(args, 'is_multimodal', False)))


def hf_model_type(args):
    """The checkpoint's HF ``model_type``: config.json's where ms-swift has loaded it, else ``--model_type``."""
    config = getattr(getattr(args, 'model_info', None), 'config', None)
    return getattr(config, 'model_type', None) or getattr(args, 'model_type', None)


def resolve_patch_size(args) -> int:
    """Set ``args.patch_size`` to the effective K and raise ValueError (what is wrong, what to do) on bad input.
    Megatron arguments at K > 1 get the PLT model meta of their family (``use_plt_model_meta``)."""
    config = getattr(getattr(args, 'model_info', None), 'config', None) if is_plt_model(args) else None
    k = patch_size_rule.resolve_patch_size(args.patch_size, config)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f'--patch_size must be an integer >= 1 (1 = token-level training), got {k!r}.')
    args.patch_size = k
    if k > 1:
        refusal = plt_model_refusal(args)
        if refusal:
            raise ValueError(f'--patch_size {k}: {refusal}')
        check_plt_supported(args, k)
        use_plt_model_meta(args)
    return k


def use_plt_model_meta(args) -> None:
    """Megatron arguments of a family: build the model through PLT's mcore-bridge meta (``PLTGPTModel``)."""
    meta = getattr(args, 'megatron_model_meta', None)
    if meta is not None and not meta.model_type.endswith(families.PLT_SUFFIX):
        from swift_plt.plugin.register import plt_model_meta
        try:
            args.megatron_model_meta = plt_model_meta(meta.model_type)
        except RuntimeError as e:  # upstream moved, or a loader swift-plt was not verified with
            raise ValueError(f'--patch_size {args.patch_size}: {e}') from None


def check_plt_supported(args, k: int) -> None:
    problems = []
    if getattr(args, 'task_type', 'causal_lm') != 'causal_lm':
        problems.append(f'--task_type {args.task_type} (PLT trains causal LMs only; use --task_type causal_lm)')
    if getattr(args, 'rlhf_type', None) is not None:
        problems.append(f'rlhf_type={args.rlhf_type} (PLT is a pre-training objective; use `megatron pt`/`sft`)')
    if getattr(args, 'mtp_num_layers', None):
        problems.append('--mtp_num_layers (multi-token prediction is not supported with PLT; drop it)')
    if (getattr(args, 'context_parallel_size', 1) or 1) > 1 and getattr(args, 'cp_partition_mode',
                                                                         'zigzag') != 'zigzag':
        # Transformer Engine's CP attention and megatron's RoPE slicing for padded batches implement the zigzag
        # layout only; the contiguous split is a DeepSeek-V4 layout (its own attention).
        problems.append(f'--cp_partition_mode {args.cp_partition_mode} with --context_parallel_size > 1 (the '
                        'attention of these decoders under context parallel assumes the zigzag split; use '
                        '--cp_partition_mode zigzag, the default)')
    meta = getattr(args, 'megatron_model_meta', None)  # (ms-swift has not read config.json yet at this point)
    if meta is not None and families.is_linear_attention_mcore_type(meta.model_type):
        problems.extend(hybrid_problems(args))
    family = families.family(hf_model_type(args))
    if family is not None and family.attention_sinks and getattr(args, 'padding_free', False):
        from swift_plt.compat.versions import installed_version
        problem = sinks_thd_problem(installed_version('transformer_engine'))
        if problem:
            problems.append(problem)
    for name in ('max_length', 'packing_length', 'seq_length'):
        value = getattr(args, name, None)
        if value and value % k:
            problems.append(f'--{name} {value} is not a multiple of --patch_size {k} (use {value - value % k} '
                            f'or {value - value % k + k})')
    if problems:
        raise ValueError(f'--patch_size {k} cannot be used with: ' + '; '.join(problems) + '.')


def hybrid_problems(args) -> list:
    """What a Gated-DeltaNet hybrid (``Family.linear_attention``) cannot do at K > 1: context parallel where the stack
    has none for it (``families.linear_attention_problems``), fla's backward where this GPU's Triton breaks it."""
    problems = families.linear_attention_problems(getattr(args, 'context_parallel_size', 1))
    if problems:
        return problems
    extra = getattr(args, 'megatron_extra_kwargs', None) or {}
    extra = json.loads(extra) if isinstance(extra, str) else extra
    if extra.get('deterministic_mode') or getattr(args, 'deterministic_mode', False):
        return []  # megatron-core's torch Gated DeltaNet, not fla's kernels
    problem = fla_backward_problem()
    return [problem] if problem else []


def fla_backward_problem() -> Optional[str]:
    """Why fla's Gated DeltaNet backward would not run on this process's GPU (``fla_hopper_problem``); None where
    it would, or where fla does not run (no CUDA, no Triton) or tilelang replaces Triton."""
    import torch
    if not torch.cuda.is_available() or importlib.util.find_spec('tilelang') is not None:
        return None
    try:
        import triton
    except ImportError:
        return None
    return fla_hopper_problem(torch.cuda.get_device_capability(int(os.environ.get('LOCAL_RANK', 0))),
                              triton.__version__)


def fla_hopper_problem(capability, triton_version):
    """fla 0.6 stops the Gated DeltaNet backward at its first call on a Hopper GPU with Triton >= 3.4.0, < 3.7.1
    (there Triton computes wrong gradients for it: fla's GitHub #640): say so before step 1 instead. None when fine."""
    v = tuple(int(x) for x in re.findall(r'\d+', triton_version)[:3])
    if capability[0] != 9 or not (3, 4, 0) <= v < (3, 7, 1):
        return None
    return (f'Triton {triton_version} on this Hopper GPU (flash-linear-attention, the Gated DeltaNet kernels, refuses '
            'its backward with Triton 3.4.0 to 3.7.0, which computes wrong gradients there: install triton>=3.7.1 or '
            'tilelang; or megatron-core\'s torch path, padded batches only: --megatron_extra_kwargs '
            '\'{"deterministic_mode": true}\' --padding_free false)')


def sinks_thd_problem(te_version: Optional[str]) -> Optional[str]:
    """Transformer Engine 2.11 (verified; older ones too) has no attention kernel for attention sinks on padding-free
    (THD) rows: GPT-OSS stops at step 1 there, stock alike (H200, 2026-11-28). Say so before step 1. None when fine."""
    v = tuple(int(x) for x in re.findall(r'\d+', te_version or '')[:2])
    if not v or v >= (2, 12):
        return None
    return (f'--padding_free true (the default; also set by --packing true) with attention sinks (GPT-OSS): '
            f'Transformer Engine {te_version} has no attention kernel for sinks on padding-free rows, so step 1 would '
            'stop with "No dot product attention backend is available" (stock Megatron-SWIFT alike); use '
            '--padding_free false without --packing')


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


def packed_hybrid_problem(args, fla_kernels: Optional[bool] = None) -> Optional[str]:
    """HF backend at K > 1: a Gated-DeltaNet hybrid (``Family.linear_attention``) on padding-free rows (``--packing``
    or ``--padding_free``) whose Gated DeltaNet would not restart per document, else None. Qwen3.5 restarts with
    flash-linear-attention's kernels (``fla_kernels``; None: ``gdn_fla_kernels_available()``); transformers' torch
    fallback ignores the boundaries. Qwen3-Next (transformers 5.19's own forward) hands them to fla's recurrence only:
    its causal convolution crosses documents with any kernel. CPU proof: tests/models/test_hf_hybrid_packing.py."""
    if not (getattr(args, 'packing', False) or getattr(args, 'padding_free', False)):
        return None
    family = families.family(hf_model_type(args))
    if family is None or not family.linear_attention:
        return None
    rows = f'--packing / --padding_free (rows of several documents) with the Gated-DeltaNet hybrid `{family.hf_type}`'
    shared = 'so each document would start from the previous one\'s convolution and recurrent state'
    fix = ('use padded batches (no --packing, --padding_free false), or `megatron pt`, whose Gated DeltaNet restarts '
           'per document')
    if not family.hf_packed_rows_with_fla:
        return (f'{rows}: its Gated DeltaNet (transformers\' forward) runs the causal convolution across the documents '
                f'of a row with any kernels (it hands their boundaries to flash-linear-attention\'s recurrence only), '
                f'{shared}; {fix}')
    if fla_kernels is None:
        fla_kernels = gdn_fla_kernels_available()
    if fla_kernels:
        return None
    return (f'{rows} without flash-linear-attention\'s kernels (the fla package and a CUDA GPU): transformers\' torch '
            f'fallback of the Gated DeltaNet ignores the documents\' boundaries, {shared} (ms-swift itself stops at '
            f'step 1); install flash-linear-attention on a CUDA machine, or {fix}')


def gdn_fla_kernels_available() -> bool:
    """flash-linear-attention's Gated DeltaNet kernels would run here, not transformers' torch fallback: transformers'
    test (fla >= 0.2.2 and a CUDA, XPU or MLU device), the one ms-swift's Qwen3.5 forward keys on."""
    try:
        from transformers.utils.import_utils import is_flash_linear_attention_available
    except ImportError:
        return False
    return bool(is_flash_linear_attention_available())


def resolve_patch_size_hf(args, command: str) -> int:
    """HF-side arguments: ``resolve_patch_size`` plus what only the HF backend needs. ``command``: 'train' (swift
    pt/sft), 'export' (weights do not depend on K: accepted and recorded) or anything else (refused at K > 1)."""
    k = resolve_patch_size(args)
    if k == 1 or command == 'export':
        return k
    if command != 'train':
        raise ValueError(f'--patch_size {k}: a patch-level (PLT) model does not generate token by token, so only '
                         'training (swift pt/sft, megatron pt/sft) and swift export take --patch_size > 1. Use the '
                         'token-level model here: drop --patch_size (checkpoints are saved as the plain model).')
    family = families.family(hf_model_type(args))
    if family is not None and family.hf_side_refusal:
        raise ValueError(f'--patch_size {k}: `{family.hf_type}` on the HF backend: {family.hf_side_refusal}. '
                         'Or use --patch_size 1.')
    problems = [msg for name, is_set, msg in HF_UNSUPPORTED if is_set(getattr(args, name, None))]
    loss_scale = getattr(args, 'loss_scale', None)
    if loss_scale is not None and not getattr(args, 'is_binary_loss_scale', None):
        from swift.loss_scale import get_loss_scale
        if not get_loss_scale(loss_scale).is_binary_loss_scale:
            problems.append(f'--loss_scale {loss_scale} (non-binary token weights are applied outside the model; '
                            'use default/all)')
    packed_hybrid = packed_hybrid_problem(args)
    if packed_hybrid:
        problems.append(packed_hybrid)
    if problems:
        raise ValueError(f'--patch_size {k} cannot be used with: ' + '; '.join(problems) + '.')
    return k
