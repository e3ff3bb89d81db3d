"""Decoders with multi-head latent attention (MLA) and MoE, all mcore-bridge's `gpt` type."""
from typing import List

from swift_plt.families.record import Critic, Family, Refused, Tiny
from swift_plt.families.upstream_keys import TAIL, get, head, noaux_tc, sigmoid_only_scoring


def deepseek_v2_norm_topk(config, model_type) -> List[str]:
    """``norm_topk_prob: true``: mcore-bridge makes megatron renormalise the top-k softmax weights (DeepSeek's own
    code does too), transformers' DeepseekV2 never does."""
    topk = get(config, 'num_experts_per_tok')
    if get(config, 'norm_topk_prob') is not True or not topk or topk <= 1:
        return []
    return [head(model_type) + f'norm_topk_prob=true: Megatron renormalises the top-{topk} softmax weights (as '
            'DeepSeek\'s own modeling_deepseek.py), transformers\' DeepseekV2 does not; every routed expert weight '
            'differs' + TAIL]


def sigmoid_router(config, model_type) -> List[str]:
    """transformers' noaux_tc router (sigmoid only, DeepSeek-V3's)."""
    return sigmoid_only_scoring(config, model_type) + noaux_tc(config, model_type)


# DeepSeek-V3's tiny MLA + MoE: q/kv LoRA ranks, decoupled RoPE dims, one dense first layer, then MoE with a shared
# expert and sigmoid routing with expert bias over 2 groups; scoring_func / topk_method as DeepSeek-V3's config.json
_V3 = dict(num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16,
           v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
           first_k_dense_replace=1, n_group=2, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
           num_nextn_predict_layers=0, scoring_func='sigmoid', topk_method='noaux_tc')

FAMILIES = (
    # MLA without q-LoRA (DeepSeek-V2-Lite: a full q_proj), YaRN with mscale = mscale_all_dim, softmax routing
    # (greedy top-k, no renormalisation), two shared experts, one dense first layer
    Family('deepseek_v2', moe=True, mla=True, default_topk_method='greedy', upstream_checks=(deepseek_v2_norm_topk, ),
           tiny=Tiny('DeepseekV2Config', 'DeepseekV2ForCausalLM',
                     dict(num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8,
                          qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=32, n_shared_experts=2, first_k_dense_replace=1,
                          topk_method='greedy', n_group=1, topk_group=1, norm_topk_prob=False,
                          routed_scaling_factor=1.0,
                          rope_scaling=dict(type='yarn', factor=40, beta_fast=32, beta_slow=1, mscale=0.707,
                                            mscale_all_dim=0.707, original_max_position_embeddings=128)))),
    Family('deepseek_v3', moe=True, mla=True, upstream_checks=(sigmoid_router, ),
           # the published checkpoint's multi-token-prediction layer: transformers 5.x ignores it on load
           critic=Critic('deepseek_v3_critic', 'deepseek_v2_5', 'deepseek_v2',
                         ignored_on_load=(r'model\.layers\.61.*', )),
           tiny=Tiny('DeepseekV3Config', 'DeepseekV3ForCausalLM', _V3, core=True)),
    # ms-swift registers the Kimi-K2 checkpoints under deepseek_v3
    Family('kimi_k2', moe=True, mla=True, swift_type='deepseek_v3', upstream_checks=(sigmoid_router, )),
    # GLM-4.7-Flash: MLA with q-LoRA and v_head_dim != qk_nope_head_dim, sigmoid routing with expert bias
    Family('glm4_moe_lite', moe=True, mla=True, upstream_checks=(sigmoid_router, ),
           tiny=Tiny('Glm4MoeLiteConfig', 'Glm4MoeLiteForCausalLM',
                     dict(num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
                          qk_nope_head_dim=16, v_head_dim=32, n_routed_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1, n_group=1,
                          topk_group=1, routed_scaling_factor=1.8, norm_topk_prob=True))),
)

REFUSED = (
    Refused('deepseek_v32', 'DeepSeek sparse attention: its indexer picks which tokens each token attends to, a choice '
            'patch-level training would change and that has not been verified', mcore_type='gpt'),
)
