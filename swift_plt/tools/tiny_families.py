"""Tiny random-init HF models of several architecture families (dense, MoE, MLA), with the offline BPE tokenizer of
``swift_plt.tools.tiny``: small enough for CPU runs of ``megatron pt --model DIR --model_type FAMILY``."""
import os
from typing import Any, Dict, Tuple

from swift_plt.compat.transformers import hf_rope_guard
from swift_plt.tools.tiny import _fork_rng, _train_tokenizer, make_tokenizer_config_portable

FAMILIES: Tuple[str, ...] = ('llama', 'qwen2', 'qwen3', 'qwen3_moe', 'qwen2_moe', 'deepseek_v3')
# the structures of the other families, built on demand (tests/models/test_families_cpu.py)
MORE_FAMILIES: Tuple[str, ...] = ('glm4_moe', 'deepseek_v2', 'glm4_moe_lite', 'dots1', 'ernie4_5', 'ernie4_5_moe',
                                  'olmoe', 'gpt_oss', 'glm4', 'minimax_m2', 'hy_v3')
# the hybrid Gated-DeltaNet decoders: 3 linear-attention layers, then 1 gated full-attention layer
HYBRID_FAMILIES: Tuple[str, ...] = ('qwen3_next', 'qwen3_5', 'qwen3_5_moe')

_COMMON: Dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    initializer_range=0.05,  # > the usual 0.02: logits far from zero, so comparisons tell
    tie_word_embeddings=False,
)
_MOE: Dict[str, Any] = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1)
_HYBRID: Dict[str, Any] = dict(num_hidden_layers=4, full_attention_interval=4, head_dim=32, partial_rotary_factor=0.25,
                               linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                               linear_num_key_heads=2, linear_num_value_heads=4)

# family -> (transformers config class, model class, config kwargs on top of _COMMON)
_SPECS: Dict[str, Tuple[str, str, Dict[str, Any]]] = {
    'llama': ('LlamaConfig', 'LlamaForCausalLM', {}),
    'qwen2': ('Qwen2Config', 'Qwen2ForCausalLM', {}),  # q/k/v projections with bias
    'qwen3': ('Qwen3Config', 'Qwen3ForCausalLM', dict(head_dim=32)),  # QK-norm; head_dim != hidden / heads
    'qwen3_moe': ('Qwen3MoeConfig', 'Qwen3MoeForCausalLM', dict(head_dim=32, norm_topk_prob=True, **_MOE)),
    # shared expert with a sigmoid gate; Qwen1.5-MoE does not renormalise the top-k probabilities
    'qwen2_moe': ('Qwen2MoeConfig', 'Qwen2MoeForCausalLM',
                  dict(norm_topk_prob=False, shared_expert_intermediate_size=64, **_MOE)),
    # MLA (q/kv LoRA ranks, decoupled RoPE dims), one dense first layer, then MoE with a shared expert and sigmoid
    # routing with expert bias over 2 groups. scoring_func / topk_method are what DeepSeek-V3's config.json says
    # (transformers' config has no such fields and always routes that way; mcore-bridge reads them).
    'deepseek_v3': ('DeepseekV3Config', 'DeepseekV3ForCausalLM',
                    dict(num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=8,
                         qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1, n_group=2,
                         topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True, num_nextn_predict_layers=0,
                         scoring_func='sigmoid', topk_method='noaux_tc')),
    # --- structures of the other families (tests/models/test_families_cpu.py; their published shapes run on the GPU,
    # tests/gpu/make_family_configs.py) ---
    # partial rotary (half of head_dim), qkv bias, QK-norm (GLM-4.5), sigmoid routing with expert bias and scaling,
    # a shared expert, one dense first layer
    'glm4_moe': ('Glm4MoeConfig', 'Glm4MoeForCausalLM',
                 dict(head_dim=32, partial_rotary_factor=0.5, attention_bias=True, use_qk_norm=True,
                      n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                      first_k_dense_replace=1, n_group=1, topk_group=1, routed_scaling_factor=2.5,
                      norm_topk_prob=True)),
    # MLA without q-LoRA (DeepSeek-V2-Lite: a full q_proj), YaRN with mscale = mscale_all_dim, softmax routing
    # (greedy top-k, no renormalisation), two shared experts, one dense first layer
    'deepseek_v2': ('DeepseekV2Config', 'DeepseekV2ForCausalLM',
                    dict(num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8,
                         qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=32, n_shared_experts=2, first_k_dense_replace=1, topk_method='greedy',
                         n_group=1, topk_group=1, norm_topk_prob=False, routed_scaling_factor=1.0,
                         rope_scaling=dict(type='yarn', factor=40, beta_fast=32, beta_slow=1, mscale=0.707,
                                           mscale_all_dim=0.707, original_max_position_embeddings=128))),
    # GLM-4.7-Flash: MLA with q-LoRA and v_head_dim != qk_nope_head_dim, sigmoid routing with expert bias
    'glm4_moe_lite': ('Glm4MoeLiteConfig', 'Glm4MoeLiteForCausalLM',
                      dict(num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
                           qk_nope_head_dim=16, v_head_dim=32, n_routed_experts=4, num_experts_per_tok=2,
                           moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1, n_group=1,
                           topk_group=1, routed_scaling_factor=1.8, norm_topk_prob=True)),
    # dots.llm1: QK-norm, sigmoid routing with expert bias, two shared experts, one dense first layer
    'dots1': ('Dots1Config', 'Dots1ForCausalLM',
              dict(head_dim=32, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                   n_shared_experts=2, first_k_dense_replace=1, n_group=1, topk_group=1, routed_scaling_factor=2.5,
                   norm_topk_prob=True, sliding_window=None)),
    # ERNIE-4.5: interleaved rotary, head_dim != hidden / heads, tied embeddings
    'ernie4_5': ('Ernie4_5Config', 'Ernie4_5ForCausalLM', dict(head_dim=32, tie_word_embeddings=True)),
    # ERNIE-4.5-MoE: interleaved rotary, softmax routing renormalised, two shared experts, MoE from layer 1, tied
    'ernie4_5_moe': ('Ernie4_5_MoeConfig', 'Ernie4_5_MoeForCausalLM',
                     dict(moe_num_experts=4, moe_k=2, moe_intermediate_size=32, moe_num_shared_experts=2,
                          moe_layer_start_index=1, moe_layer_end_index=-1, tie_word_embeddings=True)),
    # OLMoE (mcore-bridge type `olmoe`: its own attention): QK-norm over all heads' channels (not per head), softmax
    # routing not renormalised, no shared expert, MoE in every layer
    'olmoe': ('OlmoeConfig', 'OlmoeForCausalLM', dict(num_experts=4, num_experts_per_tok=2, norm_topk_prob=False)),
    # GPT-OSS: sliding-window attention (window 6 tokens, shorter than the tests' 32-token rows) in the first of each
    # two layers, learned attention sinks per head, biases everywhere, clamped SwiGLU experts with biases, router with
    # bias (softmax over the top-k logits), YaRN (transformers' default for it)
    'gpt_oss': ('GptOssConfig', 'GptOssForCausalLM',
                dict(head_dim=16, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, sliding_window=6,
                     attention_bias=True)),
    # GLM-4-0414 (mcore-bridge type `glm4`: its own layer spec): RMSNorms after attention and after the MLP, interleaved
    # rotary over half of head_dim, qkv bias, GQA, untied embeddings (GLM-4-9B/32B-0414's config.json)
    'glm4': ('Glm4Config', 'Glm4ForCausalLM',
             dict(head_dim=32, partial_rotary_factor=0.5, attention_bias=True, tie_word_embeddings=False)),
    # MiniMax-M2 (mcore-bridge type `minimax_m2`: its own attention): QK-norm over all heads' channels, partial rotary
    # (rotary_dim 16 of head_dim 32), GQA, sigmoid routing with an expert bias (e_score_correction_bias), top-k
    # renormalised (always, in transformers and megatron-core), no shared expert; the fields its config.json has
    'minimax_m2': ('MiniMaxM2Config', 'MiniMaxM2ForCausalLM',
                   dict(head_dim=32, rotary_dim=16, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                        use_qk_norm=True, qk_norm_type='per_layer', scoring_func='sigmoid', use_routing_bias=True)),
    # Hunyuan-V3 (mcore-bridge type `hy_v3`): per-head QK-norm, sigmoid routing with expert bias, top-k renormalised
    # and scaled, a shared MLP, one dense first layer; config.json's keys as published (first_k_dense_replace,
    # qk_norm, moe_router_use_sigmoid, ...: what mcore-bridge reads; transformers ignores them), its rope theta
    'hy_v3': ('HYV3Config', 'HYV3ForCausalLM',
              dict(head_dim=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, num_shared_experts=1,
                   router_scaling_factor=2.826, first_k_dense_replace=1, qk_norm=True, moe_router_use_sigmoid=True,
                   moe_router_enable_expert_bias=True, route_norm=True, enable_moe_fp32_combine=False,
                   rope_parameters={'rope_theta': 11158840.0, 'rope_type': 'default'})),
    # --- hybrids (Gated DeltaNet: conv + gated delta rule; gated attention with partial rotary and zero-centred
    # norms): 4 layers, the 4th full attention (full_attention_interval 4, what mcore-bridge reads) ---
    'qwen3_next': ('Qwen3NextConfig', 'Qwen3NextForCausalLM', dict(_HYBRID, shared_expert_intermediate_size=64,
                                                                   norm_topk_prob=True, **_MOE)),
    # multimodal checkpoints (text_config + vision_config); the language model is what PLT trains
    'qwen3_5': ('Qwen3_5Config', 'Qwen3_5ForConditionalGeneration', dict(_HYBRID)),
    'qwen3_5_moe': ('Qwen3_5MoeConfig', 'Qwen3_5MoeForConditionalGeneration',
                    dict(_HYBRID, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                         shared_expert_intermediate_size=64)),
}
# families whose RMSNorm weights (ones at init) are drawn as 1 + N(0, scale²), and whose biases (zeros) as N(0, 0.1²):
# a norm or bias the conversion or PLT dropped or swapped would otherwise still match
_RANDOM_NORM_SCALE: Dict[str, float] = {'glm4': 0.3, 'minimax_m2': 0.2, 'hy_v3': 0.3}
_RANDOM_BIASES: Tuple[str, ...] = ('glm4', )
# a vision tower of a few thousand parameters for the multimodal checkpoints (text-only at K > 1)
_TINY_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
                    num_position_embeddings=64)


def unavailable(family: str):
    """Why this transformers cannot build ``family`` (no such config class: Qwen3.5 needs transformers 5), else None."""
    import transformers
    config_cls = _SPECS[family][0]
    if not hasattr(transformers, config_cls):
        return f'transformers {transformers.__version__} has no {config_cls} (family {family})'
    return None


def make_tiny_family(family: str, out_dir: str, vocab_size: int = 512, seed: int = 0, **overrides) -> str:
    """Write a random-init fp32 HF causal LM of ``family`` (one of ``FAMILIES + MORE_FAMILIES``) and its BPE
    tokenizer (``<unk> <s> </s> <pad>`` = ids 0..3) to ``out_dir``; return it. ``overrides`` replace config fields."""
    import torch
    import transformers

    if family not in _SPECS:
        raise ValueError(f'unknown family {family!r}; one of {FAMILIES + MORE_FAMILIES + HYBRID_FAMILIES}')
    if vocab_size < 300:
        raise ValueError('vocab_size must be >= 300 (256 byte tokens + specials + merges).')
    config_cls, model_cls, extra = _SPECS[family]
    kwargs = {**_COMMON, **extra, **overrides}
    os.makedirs(out_dir, exist_ok=True)
    tokenizer = _train_tokenizer(vocab_size, seed, kwargs['max_position_embeddings'])
    tokenizer.save_pretrained(out_dir)
    make_tokenizer_config_portable(out_dir)
    ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id)
    if model_cls.endswith('ForConditionalGeneration'):  # text_config + vision_config; media ids past the text
        config = getattr(transformers, config_cls)(
            text_config=dict(vocab_size=vocab_size, **ids, **kwargs), vision_config=_TINY_VISION,
            image_token_id=vocab_size - 4, video_token_id=vocab_size - 3, vision_start_token_id=vocab_size - 2,
            vision_end_token_id=vocab_size - 1, tie_word_embeddings=kwargs['tie_word_embeddings'])
    else:
        config = getattr(transformers, config_cls)(vocab_size=vocab_size, **ids, **kwargs)
    with _fork_rng(seed), hf_rope_guard():
        model = getattr(transformers, model_cls)(config).float()
        for name, buf in model.named_buffers():
            if name.endswith('e_score_correction_bias'):  # zeros at init: make the expert-bias path matter
                buf.copy_(0.1 * torch.randn_like(buf))
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith('.sinks'):  # N(0, 0.05) at init: sinks of order 1 take a visible share of attention
                    param.copy_(torch.randn_like(param))
                elif name.endswith(('experts.gate_up_proj_bias', 'experts.down_proj_bias')):  # zeros at init
                    param.copy_(0.1 * torch.randn_like(param))
                elif family in _RANDOM_NORM_SCALE and name.endswith('norm.weight'):
                    param.copy_(1.0 + _RANDOM_NORM_SCALE[family] * torch.randn_like(param))
                elif family in _RANDOM_BIASES and name.endswith('.bias'):
                    param.copy_(0.1 * torch.randn_like(param))
    model.save_pretrained(out_dir, safe_serialization=True)
    if 'full_attention_interval' in kwargs:  # transformers 5 keeps layer_types only; mcore-bridge reads the interval
        _set_config_field(out_dir, 'full_attention_interval', kwargs['full_attention_interval'])
    return out_dir


def _set_config_field(out_dir: str, name: str, value) -> None:
    """Write ``name`` into config.json (its text_config for a multimodal checkpoint)."""
    import json
    path = os.path.join(out_dir, 'config.json')
    with open(path) as f:
        config = json.load(f)
    config.get('text_config', config)[name] = value
    with open(path, 'w') as f:
        json.dump(config, f, indent=2)
