"""Every model type mcore-bridge 1.6.5 registers (``mcore_bridge.model.register.MODEL_MAPPING``) that PLT does not
build, classified with why; ``check_mcore_types`` fails loudly when mcore-bridge adds or drops a type."""
from swift_plt.families.record import Refused

MCORE_BRIDGE_VERIFIED = 'mcore-bridge 1.6.5'

# language-model types of their own name, refused at K > 1
REFUSED = (
    Refused('bailing_hybrid', 'Ling/Ring 2.5 hybrid: lightning linear attention (a decayed recurrence over tokens, '
            'mcore-bridge\'s LinearAttention) in all but every layer_group_size-th layer (full attention); not yet '
            'verified at patch level. Needed: the recurrence restarted per document over patches (as for Gated '
            'DeltaNet), proven against the checkpoint\'s own modeling code (transformers has no class for it)'),
    Refused('nemotron_h', 'Nemotron-H: a Mamba-2 hybrid on megatron-core\'s models.hybrid (0.19; mcore-bridge 1.6.5 '
            'registers the type only with it). Its MambaMixer needs the mamba-ssm and causal-conv1d CUDA packages '
            '(megatron-core raises "MambaSSM is not installed" without them), so neither stock nor PLT builds it on a '
            'CPU; not yet verified at patch level. Needed: the SSM state and convolution restarted per document over '
            'patches (as for Gated DeltaNet), proven on GPU against transformers\' NemotronHForCausalLM',
            conditional=True),
    Refused('deepseek_v4', 'DeepSeek-V4: its compressed sparse attention pools fixed blocks of tokens and its indexer '
            '(CSAIndexer) chooses which of them each token attends to: choices patch-level training would change (as '
            'deepseek_v32); its own sliding-window layers (csa_window_size) are not converted to patches either'),
    Refused('glm_moe_dsa', 'GLM-MoE-DSA: DeepSeek sparse attention; its indexer chooses which tokens each token '
            'attends to, a choice patch-level training would change (as deepseek_v32)'),
)
# multimodal types (a vision or audio tower): refused, except the text-only families' (Family.text_only_multimodal)
MULTIMODAL_TYPES = ('deepseek_v41', 'gemma4', 'gemma4_unified', 'glm4v', 'glm4v_moe', 'glm5_next', 'internvl',
                    'internvl_chat', 'kimi_k25', 'kimi_vl', 'llama4', 'llava_onevision1_5', 'minicpmv4_6',
                    'muse_glimmer', 'ovis2_5', 'qwen2_5_omni', 'qwen2_5_vl', 'qwen2_vl', 'qwen3_5', 'qwen3_asr',
                    'qwen3_omni', 'qwen3_vl', 'qwen4_exp')
# registered only with megatron-core's models.hybrid: deepseek_v41 needs hyper-connection layers newer than 0.19.2
CONDITIONAL_MULTIMODAL = ('deepseek_v41', )
MULTIMODAL_REFUSAL = ('a multimodal model (mcore-bridge builds it with its vision or audio tower); PLT trains text '
                      'decoders ({text_only} on text only)')
# embedding types (no HF model type maps to them; ms-swift picks them for --task_type embedding)
EMBEDDING_TYPES = ('qwen3_emb', )
EMBEDDING_REFUSAL = 'an embedding model (pooled hidden states, no next-token loss); PLT trains causal LMs'
