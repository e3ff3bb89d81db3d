"""Dense decoders: mcore-bridge's `gpt` type, and GLM-4-0414 (its own layer spec)."""
from typing import List

from swift_plt import PLT_MODEL_TYPE
from swift_plt.families.record import TINY_VISION, Critic, Family, Tiny
from swift_plt.families.upstream_keys import TAIL, dropped_sliding_window

LLAMA_CRITIC = 'llama3_2_critic'  # the first critic type (swift_plt.critic.CRITIC_MODEL_TYPE)


def glm4_gate_up_export(config, model_type) -> List[str]:
    """transformers' Glm4ForCausalLM holds the MLP's first projection fused (``gate_up_proj``); mcore-bridge's export
    (``GPTBridge._set_mlp_state``) writes ``gate_proj`` / ``up_proj``, so transformers loads it freshly initialised."""
    return [f'[swift-plt] {model_type}: Megatron saves the MLP as mlp.gate_proj / mlp.up_proj, transformers\' '
            f'{model_type} loads mlp.gate_up_proj only: a checkpoint saved from Megatron (--save_safetensors, swift '
            'export --to_hf) loads into transformers with its MLP freshly initialised; concatenate gate_proj and '
            'up_proj (dim 0) into gate_up_proj before loading it' + TAIL]


FAMILIES = (
    # the design type llama3_2_plt: its config.json may carry patch_size
    Family('llama', swift_type=PLT_MODEL_TYPE, critic=Critic(LLAMA_CRITIC, 'llama3_2', 'llama'),
           tiny=Tiny('LlamaConfig', 'LlamaForCausalLM', core=True)),
    # q/k/v projections with bias
    Family('qwen2', critic=Critic('qwen2_critic', 'qwen', 'llama'), upstream_checks=(dropped_sliding_window, ),
           tiny=Tiny('Qwen2Config', 'Qwen2ForCausalLM', core=True)),
    # QK-norm; head_dim != hidden / heads
    Family('qwen3', critic=Critic('qwen3_critic', 'qwen3', 'llama'), upstream_checks=(dropped_sliding_window, ),
           tiny=Tiny('Qwen3Config', 'Qwen3ForCausalLM', dict(head_dim=32), core=True)),
    Family('internlm3'),
    Family('mimo', note='its MTP layers are used only with --mtp_num_layers, refused at K > 1'),
    # ERNIE-4.5: interleaved rotary, head_dim != hidden / heads, tied embeddings
    Family('ernie4_5', tiny=Tiny('Ernie4_5Config', 'Ernie4_5ForCausalLM', dict(head_dim=32, tie_word_embeddings=True))),
    # GLM-4-0414 (its own layer spec: Glm4SelfAttention / Glm4MLP): RMSNorms after attention and after the MLP,
    # interleaved rotary over half of head_dim, qkv bias, GQA, untied embeddings (GLM-4-9B/32B-0414's config.json)
    Family('glm4', mcore_type='glm4', loader='mcore_bridge.model.gpts.glm4:Glm4Loader',
           bridge='mcore_bridge.model.gpts.glm4:Glm4Bridge', upstream_checks=(glm4_gate_up_export, ),
           tiny=Tiny('Glm4Config', 'Glm4ForCausalLM', dict(head_dim=32, partial_rotary_factor=0.5,
                                                           attention_bias=True, tie_word_embeddings=False),
                     norm_scale=0.3, random_biases=True)),
    # Qwen3-VL (Qwen3VLForConditionalGeneration): the Qwen3 decoder (QK-norm, interleaved multimodal RoPE) under a
    # vision tower whose deepstack features are added to the first layers' image tokens; at K > 1 on text only
    Family('qwen3_vl', mcore_type='qwen3_vl', loader='mcore_bridge.model.mm_gpts.qwen3_vl:Qwen3VLLoader',
           bridge='mcore_bridge.bridge:MultimodalGPTBridge', text_only_multimodal=True,
           tiny=Tiny('Qwen3VLConfig', 'Qwen3VLForConditionalGeneration',
                     dict(head_dim=32, rope_theta=5e6,  # rope_scaling: read by transformers 4.57 and 5.x
                          rope_scaling=dict(rope_type='default', mrope_section=[4, 6, 6], mrope_interleaved=True)),
                     vision=dict(TINY_VISION, deepstack_visual_indexes=[0]))),
)
