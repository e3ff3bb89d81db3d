"""The Gated-DeltaNet hybrids: 3 of 4 layers Gated DeltaNet (causal convolution + gated delta rule), the 4th gated
attention. mcore-bridge builds them with their own types, on its default (``USE_MCORE_GDN=1``) path: megatron-core's
Gated DeltaNet. At K > 1 the convolution and the recurrence run over patches and restart per document."""
from swift_plt.families.record import TINY_HYBRID, TINY_MOE, TINY_VISION, Critic, Family, Tiny

_LOADER = 'mcore_bridge.model.gpts.qwen3_next_gdn:Qwen3NextLoader'
_QWEN3_5_BRIDGE = 'mcore_bridge.model.mm_gpts.qwen3_5_gdn:Qwen3_5Bridge'
_MOE = {k: v for k, v in TINY_MOE.items() if k != 'decoder_sparse_step'}

FAMILIES = (
    Family('qwen3_next', moe=True, linear_attention=True, mcore_type='qwen3_next', loader=_LOADER,
           bridge='mcore_bridge.model.gpts.qwen3_next_gdn:Qwen3NextGDNBridge',
           critic=Critic('qwen3_next_critic', 'qwen3_nothinking', None),  # ms-swift's first template of it
           tiny=Tiny('Qwen3NextConfig', 'Qwen3NextForCausalLM',
                     dict(TINY_HYBRID, shared_expert_intermediate_size=64, norm_topk_prob=True, **TINY_MOE))),
    # Qwen3_5ForConditionalGeneration: the language model at K > 1 on text only; the critic keeps the vision tower as
    # it came (HF format Qwen3_5ForTokenClassification over the whole config)
    Family('qwen3_5', linear_attention=True, text_only_multimodal=True, hf_packed_rows_with_fla=True,
           mcore_type='qwen3_5', loader=_LOADER,
           bridge=_QWEN3_5_BRIDGE, critic=Critic('qwen3_5_critic', 'qwen3_5', 'qwen2_vl'),
           tiny=Tiny('Qwen3_5Config', 'Qwen3_5ForConditionalGeneration', dict(TINY_HYBRID), vision=TINY_VISION)),
    Family('qwen3_5_moe', moe=True, linear_attention=True, text_only_multimodal=True, hf_packed_rows_with_fla=True,
           mcore_type='qwen3_5',
           loader=_LOADER, bridge=_QWEN3_5_BRIDGE,
           no_critic=('Qwen3.5-MoE (`qwen3_5_moe`) has no critic: transformers has no '
                      'Qwen3_5MoeForTokenClassification (5.19), so a value model of it has no HF format to load or '
                      'export. Use a dense Qwen3.5 critic (--model_type qwen3_5_critic on a `qwen3_5` checkpoint) or '
                      'qwen3_next_critic / qwen3_moe_critic.'),
           tiny=Tiny('Qwen3_5MoeConfig', 'Qwen3_5MoeForConditionalGeneration',
                     dict(TINY_HYBRID, shared_expert_intermediate_size=64, **_MOE), vision=TINY_VISION)),
)
