"""Build mcore-bridge models from an HF directory the way ms-swift does, and run them / the HF reference."""
from dataclasses import fields
from typing import Any, Dict, List, Optional

from .patches import install
from swift_plt.compat.transformers import hf_rope_guard

# ModelConfig fields that ms-swift fills from its arguments; these are the values the CPU CLI flags of
# ``cli.CPU_MEGATRON_ARGS`` give (fp32, no fusions that need CUDA kernels, weights set by
# ``perform_initialization`` so that TP attributes exist, see cpu_notes' first hazard).
CPU_CONFIG_DEFAULTS: Dict[str, Any] = {
    'use_cpu_initialization': True,
    'perform_initialization': True,
    'bias_activation_fusion': True,
    'bias_dropout_fusion': True,
    'gradient_accumulation_fusion': False,
    'apply_rope_fusion': False,
    'sequence_parallel': False,
    # ms-swift without virtual pipeline: overlap_p2p_comm=False, batch_p2p_comm=True (megatron_args.py)
    'overlap_p2p_comm': False,
    'batch_p2p_comm': True,
}


def build_mcore_model(hf_dir: str,
                      *,
                      mcore_model_type: str = 'gpt',
                      tp: int = 1,
                      pp: int = 1,
                      extra_config: Optional[Dict[str, Any]] = None,
                      load_weights: bool = True) -> List[Any]:
    """Build the mcore-bridge model chunk(s) of this rank for ``hf_dir`` and load the HF weights (fp32).

    Mirrors ms-swift 4.6.0 ``swift.megatron.model.utils.get_mcore_model_config`` + ``mcore_bridge.get_mcore_model``
    + ``GPTBridge.load_weights`` (``trainers/base.py``): ``hf_to_mcore_config(hf_config)`` gives the model fields,
    ``get_model_meta(mcore_model_type).config_cls`` (a plugin's ModelConfig subclass, whose extra fields come in
    ``extra_config``) builds the config, ``config.model_meta.loader`` builds the model, ``config.bridge`` loads the
    safetensors. ``tp`` / ``pp`` must match the initialised parallel state (``init_megatron`` / ``spawn``); the expert
    parallel sizes (``expert_model_parallel_size`` / ``expert_tensor_parallel_size``) are taken from it.
    Returns the list ``get_mcore_model`` returns (one chunk without virtual pipeline), in eval mode.
    """
    install()
    import torch
    from megatron.core import parallel_state
    from megatron.core.transformer.enums import AttnBackend
    from transformers import AutoConfig

    from mcore_bridge import ModelConfig, get_mcore_model, hf_to_mcore_config
    from mcore_bridge.model import get_model_meta

    if (parallel_state.get_tensor_model_parallel_world_size(), parallel_state.get_pipeline_model_parallel_world_size()
            ) != (tp, pp):
        raise ValueError(f'parallel state is not (tp={tp}, pp={pp}); initialise it with init_megatron/spawn')
    from .bailing_moe import register_config
    register_config()  # Ling 2.0's config.json (no transformers class: its checkpoint's own configuration)
    model_meta = get_model_meta(mcore_model_type)
    if model_meta is None:
        raise ValueError(f'mcore_model_type {mcore_model_type!r} is not registered in mcore_bridge MODEL_MAPPING')
    hf_config = AutoConfig.from_pretrained(hf_dir)
    kwargs = hf_to_mcore_config(hf_config)
    kwargs.update(
        mcore_model_type=model_meta.model_type,
        hf_config=hf_config,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        params_dtype=torch.float32,
        attention_backend=AttnBackend.unfused,
        expert_model_parallel_size=parallel_state.get_expert_model_parallel_world_size(),
        expert_tensor_parallel_size=parallel_state.get_expert_tensor_parallel_world_size(),
        **CPU_CONFIG_DEFAULTS)
    # ms-swift's get_mcore_model_config after its arguments: no bias-dropout fusion for biased grouped experts
    # (GPT-OSS; --moe_grouped_gemm defaults to true), no bias-activation fusion without swiglu and biases
    if kwargs.get('add_bias_linear') and kwargs.get('num_moe_experts'):
        kwargs['bias_dropout_fusion'] = False
    if not kwargs.get('swiglu', True) and not kwargs.get('add_bias_linear'):
        kwargs['bias_activation_fusion'] = False
    kwargs.update(extra_config or {})
    config_cls = getattr(model_meta, 'config_cls', ModelConfig)
    unknown = set(kwargs) - {f.name for f in fields(config_cls)}
    if unknown:
        raise TypeError(f'{config_cls.__name__} has no fields {sorted(unknown)}')
    config = config_cls(**kwargs)
    models = get_mcore_model(config)
    if load_weights:
        config.bridge.load_weights(models, hf_dir)
    for m in models:
        m.eval()
    return models


def mcore_logits(models: List[Any], input_ids, position_ids=None, attention_mask=None):
    """Full-vocabulary logits ``[B, S, V]`` (fp32, no grad) of ``models`` for ``input_ids`` ``[B, S]``.

    Under TP the vocab-parallel output is gathered; under PP the batch runs through megatron's forward-only
    pipeline schedule (real gloo p2p) and only the last stage returns logits, the others ``None``.
    ``attention_mask=None`` means causal (megatron builds the mask).
    """
    import torch
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    B, S = input_ids.shape
    if position_ids is None:
        position_ids = torch.arange(S).unsqueeze(0).expand(B, S)

    def forward_step(data_iterator, model):
        next(data_iterator)
        out = model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=attention_mask,
            runtime_gather_output=True)
        return out, None  # loss_func None: the schedule stores the last stage's output as is

    with torch.no_grad():
        if parallel_state.get_pipeline_model_parallel_world_size() == 1:
            logits, _ = forward_step(iter([None]), models[0])
            return logits.float()
        out = get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter([None]),
            model=models,
            num_microbatches=1,
            seq_length=S,
            micro_batch_size=B,
            forward_only=True)
    if not parallel_state.is_pipeline_last_stage():
        return None
    return out[0].float()


def hf_logits(hf_dir: str, input_ids):
    """Reference logits ``[B, S, V]`` of the HF ``AutoModelForCausalLM`` of ``hf_dir`` in fp32 (eager attention).

    Safe after mcore-bridge models were built in this process (``hf_rope_guard``).
    """
    import torch
    from transformers import AutoModelForCausalLM

    from .hf_reference import as_transformers_5
    with hf_rope_guard():
        model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation='eager')
    as_transformers_5(model).eval()
    with torch.no_grad():
        return model(input_ids=input_ids).logits.float()
