"""Mixture-of-experts decoders with ordinary attention: mcore-bridge's `gpt` type and the MoE types it builds with
layer specs or bridges of their own (OLMoE, MiniMax-M2, Hunyuan-V3, Ling/Ring 2.0)."""
from typing import List

from swift_plt.families.record import TINY_MOE, Critic, Family, Tiny
from swift_plt.families.upstream_keys import (TAIL, dropped_sliding_window, get, group_score_warnings, head,
                                              megatron_qk_norm, megatron_score_function, noaux_tc, sigmoid_only_scoring)


def minimax_m2_keys(config, model_type) -> List[str]:
    """transformers' MiniMaxM2 always applies QK-norm and sigmoid routing; Megatron only where config.json says so."""
    out = []
    if not megatron_qk_norm(config):
        out.append(head(model_type) + f'use_qk_norm={get(config, "use_qk_norm")}: Megatron builds no QK-norm '
                   '(mcore-bridge reads use_qk_norm), transformers\' MiniMaxM2 always applies q_norm and k_norm' + TAIL)
    scoring = megatron_score_function(config)
    if scoring != 'sigmoid':
        out.append(head(model_type) + f'scoring_func={get(config, "scoring_func")}: Megatron routes by {scoring} '
                   'without the expert bias, transformers\' MiniMaxM2 by sigmoid with e_score_correction_bias whatever '
                   'the field says' + TAIL)
    return out


def hy_v3_keys(config, model_type) -> List[str]:
    """transformers' HYV3 ignores qk_norm / moe_router_use_sigmoid / moe_router_enable_expert_bias (always per-head
    QK-norm, sigmoid with the bias); mcore-bridge reads them."""
    out = []
    if not megatron_qk_norm(config):
        out.append(head(model_type) + 'has no qk_norm=true: Megatron builds no QK-norm (the checkpoint\'s q_norm / '
                   'k_norm are not loaded), transformers\' HYV3 always normalises q and k per head' + TAIL)
    if megatron_score_function(config) != 'sigmoid' and not get(config, 'moe_router_enable_expert_bias'):
        out.append(head(model_type) + 'has neither moe_router_use_sigmoid=true nor moe_router_enable_expert_bias=true: '
                   'Megatron routes by softmax without the expert bias, transformers\' HYV3 by sigmoid with it' + TAIL)
    return out


def bailing_keys(config, model_type) -> List[str]:
    """Ling/Ring 2.0 against its own modeling code (tests/harness/bailing_moe.py): groups by their top-2 sum, and
    mcore-bridge reads the attention biases from ``use_bias`` where the model has ``use_qkv_bias`` and ``use_bias``."""
    out = group_score_warnings(config, head(model_type), 'Ling\'s own code by its top-2')
    if get(config, 'use_qkv_bias'):
        out.append(head(model_type) + 'use_qkv_bias=true: Megatron builds the QKV projection without it (mcore-bridge '
                   'reads use_bias for that bias), the checkpoint\'s own code adds it' + TAIL)
    if get(config, 'use_bias'):
        out.append(head(model_type) + 'use_bias=true: Megatron gives the QKV projection a bias its bridge does not '
                   'load and the output projection none, the checkpoint\'s own code the reverse' + TAIL)
    return out


def glm4_moe_router(config, model_type) -> List[str]:
    return sigmoid_only_scoring(config, model_type) + noaux_tc(config, model_type)


FAMILIES = (
    # shared expert with a sigmoid gate; Qwen1.5-MoE does not renormalise the top-k probabilities
    Family('qwen2_moe', moe=True, critic=Critic('qwen2_moe_critic', 'qwen', None),
           upstream_checks=(dropped_sliding_window, ),
           tiny=Tiny('Qwen2MoeConfig', 'Qwen2MoeForCausalLM',
                     dict(norm_topk_prob=False, shared_expert_intermediate_size=64, **TINY_MOE), core=True)),
    Family('qwen3_moe', moe=True, critic=Critic('qwen3_moe_critic', 'qwen3', None),
           upstream_checks=(dropped_sliding_window, ),
           tiny=Tiny('Qwen3MoeConfig', 'Qwen3MoeForCausalLM', dict(head_dim=32, norm_topk_prob=True, **TINY_MOE),
                     core=True)),
    Family('deepseek', moe=True),
    # dots.llm1: QK-norm, sigmoid routing with expert bias, two shared experts, one dense first layer
    Family('dots1', moe=True, upstream_checks=(noaux_tc, ),
           tiny=Tiny('Dots1Config', 'Dots1ForCausalLM',
                     dict(head_dim=32, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                          n_shared_experts=2, first_k_dense_replace=1, n_group=1, topk_group=1,
                          routed_scaling_factor=2.5, norm_topk_prob=True, sliding_window=None))),
    # ERNIE-4.5-MoE: interleaved rotary, softmax routing renormalised, two shared experts, MoE from layer 1, tied
    Family('ernie4_5_moe', moe=True,
           tiny=Tiny('Ernie4_5_MoeConfig', 'Ernie4_5_MoeForCausalLM',
                     dict(moe_num_experts=4, moe_k=2, moe_intermediate_size=32, moe_num_shared_experts=2,
                          moe_layer_start_index=1, moe_layer_end_index=-1, tie_word_embeddings=True))),
    # GLM-4.5: partial rotary (half of head_dim), qkv bias, QK-norm, sigmoid routing with expert bias and scaling, a
    # shared expert, one dense first layer
    Family('glm4_moe', moe=True, upstream_checks=(glm4_moe_router, ),
           tiny=Tiny('Glm4MoeConfig', 'Glm4MoeForCausalLM',
                     dict(head_dim=32, partial_rotary_factor=0.5, attention_bias=True, use_qk_norm=True,
                          n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                          first_k_dense_replace=1, n_group=1, topk_group=1, routed_scaling_factor=2.5,
                          norm_topk_prob=True))),
    # GPT-OSS: sliding-window layers (a window of W tokens is ceil(W / K) patches: swift_plt.patch_level.window),
    # attention sinks, biases everywhere, clamped SwiGLU experts with biases, router with bias, YaRN. Tiny: window 6
    # tokens (shorter than the tests' 32-token rows) in the first of each two layers
    Family('gpt_oss', moe=True, attention_sinks=True,
           tiny=Tiny('GptOssConfig', 'GptOssForCausalLM',
                     dict(head_dim=16, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                          sliding_window=6, attention_bias=True))),
    # OLMoE (its own attention on the `gpt` layer spec): QK-norm over all heads' channels (not per head), softmax
    # routing not renormalised, no shared expert, MoE in every layer
    Family('olmoe', moe=True, mcore_type='olmoe', loader='mcore_bridge.model.gpts.olmoe:OLMoELoader',
           bridge='mcore_bridge.model.gpts.olmoe:OLMoEBridge',
           tiny=Tiny('OlmoeConfig', 'OlmoeForCausalLM', dict(num_experts=4, num_experts_per_tok=2,
                                                             norm_topk_prob=False))),
    # MiniMax-M2 (its own attention and MoE bridge): QK-norm over all heads' channels, partial rotary (rotary_dim 16
    # of head_dim 32), GQA, sigmoid routing with an expert bias, top-k renormalised, no shared expert
    Family('minimax_m2', moe=True, mcore_type='minimax_m2',
           loader='mcore_bridge.model.gpts.minimax_m2:MinimaxM2Loader',
           bridge='mcore_bridge.model.gpts.minimax_m2:MinimaxM2Bridge', upstream_checks=(minimax_m2_keys, ),
           tiny=Tiny('MiniMaxM2Config', 'MiniMaxM2ForCausalLM',
                     dict(head_dim=32, rotary_dim=16, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                          use_qk_norm=True, qk_norm_type='per_layer', scoring_func='sigmoid', use_routing_bias=True),
                     norm_scale=0.2)),
    # Hunyuan-V3 (the `gpt` loader; its bridge names the router, expert bias and shared MLP its way): per-head
    # QK-norm, sigmoid routing with expert bias, top-k renormalised and scaled, a shared MLP, one dense first layer;
    # config.json's keys as published (what mcore-bridge reads; transformers ignores them), its rope theta
    Family('hy_v3', moe=True, mcore_type='hy_v3', bridge='mcore_bridge.model.gpts.hunyuan:HyV3Bridge',
           upstream_checks=(hy_v3_keys, ),
           tiny=Tiny('HYV3Config', 'HYV3ForCausalLM',
                     dict(head_dim=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                          num_shared_experts=1, router_scaling_factor=2.826, first_k_dense_replace=1, qk_norm=True,
                          moe_router_use_sigmoid=True, moe_router_enable_expert_bias=True, route_norm=True,
                          enable_moe_fp32_combine=False,
                          rope_parameters={'rope_theta': 11158840.0, 'rope_type': 'default'}),
                     norm_scale=0.3)),
    # Ling/Ring 2.0 (BailingMoeV2; the `gpt` loader, its bridge splits the fused QKV [Q heads | K | V] per group):
    # per-head QK-norm, partial rotary, sigmoid group-limited routing with expert bias, renormalised and scaled, a
    # shared expert, dense first layer(s). Megatron side only: tests/harness/bailing_moe.py is its reference
    Family('bailing_moe', moe=True, mcore_type='bailing_moe',
           bridge='mcore_bridge.model.gpts.bailing_moe:BailingMoeBridge', upstream_checks=(bailing_keys, ),
           hf_side_refusal=('transformers has no class for Ling/Ring 2.0 (its checkpoints bring their own modeling '
                            'code), and the HF-side PLT model wraps transformers\' own class of the family; train it '
                            'at K > 1 with `megatron pt/sft`')),
)
