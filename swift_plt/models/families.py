"""Which model families take ``--patch_size K > 1``: the decoders mcore-bridge builds as its ``gpt`` type, OLMoE,
GLM-4-0414, MiniMax-M2, Hunyuan-V3, Ling/Ring 2.0 and the hybrid Gated-DeltaNet decoders it builds with their own
types, keyed by the HF ``model_type`` of config.json; and every other model type of mcore-bridge 1.6.5, with why PLT
refuses it. PLT only wraps the decoder (pooling, positions, masks, loss), so one ``PLTGPTModel`` serves them all
(docs/model-families.md). Imports no torch."""
from typing import Optional

from swift_plt.compat.mcore_bridge_types import MCORE_BRIDGE_VERIFIED

# HF model_type -> the structure PLT has to get right (what the CPU tests cover per structure)
FAMILIES = {
    'llama': 'dense',
    'qwen2': 'dense',  # qkv bias
    'qwen3': 'dense',  # QK-norm
    'internlm3': 'dense',
    'mimo': 'dense',  # its MTP layers are used only with --mtp_num_layers, refused at K > 1
    'ernie4_5': 'dense',
    'qwen2_moe': 'moe',  # shared expert with a sigmoid gate
    'qwen3_moe': 'moe',
    'deepseek': 'moe',
    'dots1': 'moe',
    'ernie4_5_moe': 'moe',
    'glm4_moe': 'moe',
    'deepseek_v2': 'mla+moe',
    'deepseek_v3': 'mla+moe',
    'kimi_k2': 'mla+moe',
    'glm4_moe_lite': 'mla+moe',
    # sliding-window layers (a window of W tokens is ceil(W / K) patches at K > 1: swift_plt.models.window) and
    # attention sinks, biased experts and router
    'gpt_oss': 'moe',
    'olmoe': 'moe',  # mcore-bridge type `olmoe`: QK-norm over all heads' channels, softmax top-k not renormalised
    'glm4': 'dense',  # mcore-bridge type `glm4` (GLM-4-0414): RMSNorms after attention and after the MLP
    # mcore-bridge type `minimax_m2`: QK-norm over all heads' channels, partial rotary, sigmoid routing + expert bias
    'minimax_m2': 'moe',
    # mcore-bridge type `hy_v3` (`gpt` layer spec, its own bridge names): per-head QK-norm, sigmoid routing with
    # expert bias, top-k renormalised and scaled, a shared MLP, dense first layer(s)
    'hy_v3': 'moe',
    # Ling/Ring 2.0 (BailingMoeV2), mcore-bridge type `bailing_moe` (`gpt` layer spec, its own bridge: fused QKV
    # layout): per-head QK-norm, partial rotary, sigmoid group-limited routing with expert bias, renormalised and
    # scaled, a shared expert, dense first layer(s); Megatron side only (transformers has no class for it)
    'bailing_moe': 'moe',
    # hybrids: 3 of 4 layers Gated DeltaNet (causal conv + gated delta rule), the 4th gated attention
    'qwen3_next': 'hybrid+moe',
    'qwen3_5': 'hybrid',  # Qwen3_5ForConditionalGeneration: text-only at K > 1
    'qwen3_5_moe': 'hybrid+moe',
}

# hybrid families -> the mcore-bridge model type that builds them (not `gpt`); PLT registers `<type>_plt` for each
HYBRID_MCORE_TYPES = {'qwen3_next': 'qwen3_next', 'qwen3_5': 'qwen3_5', 'qwen3_5_moe': 'qwen3_5'}
# families mcore-bridge builds with their own (non-hybrid) type (layer spec or bridge); PLT registers `<type>_plt`
OWN_MCORE_TYPES = {'olmoe': 'olmoe', 'glm4': 'glm4', 'minimax_m2': 'minimax_m2', 'hy_v3': 'hy_v3',
                   'bailing_moe': 'bailing_moe'}
# HF model types with attention sinks (learned per-head logits in the softmax)
ATTENTION_SINK_TYPES = ('gpt_oss', )
# every family not built as `gpt` -> its mcore-bridge type
FAMILY_MCORE_TYPES = {**HYBRID_MCORE_TYPES, **OWN_MCORE_TYPES}
# supported families the HF backend (`swift pt/sft`) refuses at K > 1, and why: its PLT model wraps transformers' own
# class of the family
HF_SIDE_REFUSED = {
    'bailing_moe': ('transformers has no class for Ling/Ring 2.0 (its checkpoints bring their own modeling code), and '
                    'the HF-side PLT model wraps transformers\' own class of the family; train it at K > 1 with '
                    '`megatron pt/sft`'),
}
# multimodal checkpoints whose language model PLT trains on text-only data (a sample with images is refused)
TEXT_ONLY_MULTIMODAL = ('qwen3_5', 'qwen3_5_moe')

# families mcore-bridge builds as `gpt` that PLT refuses, and why
REFUSED = {
    'deepseek_v32': ('DeepSeek sparse attention: its indexer picks which tokens each token attends to, a choice '
                     'patch-level training would change and that has not been verified'),
}

MCORE_GPT_TYPE = 'gpt'  # mcore-bridge's model type of these families
PLT_GPT_MODEL_TYPE = 'gpt_plt'  # the mcore-bridge model type PLT registers for them (PLTGPTModel), used at K > 1
PLT_SUFFIX = '_plt'


def plt_mcore_type(mcore_type: str) -> str:
    """The mcore-bridge model type PLT registers for mcore-bridge type ``mcore_type`` (``gpt`` -> ``gpt_plt``)."""
    return mcore_type + PLT_SUFFIX


def plt_mcore_types() -> tuple:
    """Every mcore-bridge model type PLT builds at K > 1 and the upstream ones it replaces."""
    upstream = (MCORE_GPT_TYPE, *sorted(set(FAMILY_MCORE_TYPES.values())))
    return upstream + tuple(plt_mcore_type(t) for t in upstream)

# mcore-bridge's `gpt` list this table was written against (tests/models/test_family_table.py)
MCORE_GPT_TYPES_VERIFIED = ('qwen2', 'llama', 'qwen3', 'qwen2_moe', 'qwen3_moe', 'internlm3', 'mimo', 'deepseek',
                            'deepseek_v2', 'deepseek_v3', 'deepseek_v32', 'kimi_k2', 'dots1', 'ernie4_5',
                            'ernie4_5_moe', 'glm4_moe', 'glm4_moe_lite', 'gpt_oss')

# Every model type mcore-bridge 1.6.5 registers (mcore_bridge.model.register.MODEL_MAPPING; megatron-core 0.16.1),
# classified. `gpt` and the hybrids' types are above; each other language-model type -> why PLT refuses it (its HF
# model_type is the same name). check_mcore_types fails loudly when mcore-bridge adds or drops a type.
_OWN_SPEC = 'mcore-bridge builds it with its own {what}; not yet verified at patch level (no CPU structure test ' \
            'against its HF model, no GPU parity)'
MCORE_REFUSED = {
    'bailing_hybrid': ('Ling/Ring 2.5 hybrid: lightning linear attention (a decayed recurrence over tokens, '
                       'mcore-bridge\'s LinearAttention) in all but every layer_group_size-th layer (full '
                       'attention); not yet verified at patch level. Needed: the recurrence restarted per document '
                       'over patches (as for Gated DeltaNet), proven against the checkpoint\'s own modeling code '
                       '(transformers has no class for it)'),
    'nemotron_h': ('Nemotron-H: a Mamba-2 hybrid on megatron-core\'s models.hybrid (0.19; mcore-bridge 1.6.5 '
                   'registers the type only with it). Its MambaMixer needs the mamba-ssm and causal-conv1d CUDA '
                   'packages (megatron-core raises "MambaSSM is not installed" without them), so neither stock nor '
                   'PLT builds it on a CPU; not yet verified at patch level. Needed: the SSM state and convolution '
                   'restarted per document over patches (as for Gated DeltaNet), proven on GPU against transformers\' '
                   'NemotronHForCausalLM'),
    'deepseek_v4': ('DeepSeek-V4: its compressed sparse attention pools fixed blocks of tokens and its indexer '
                    '(CSAIndexer) chooses which of them each token attends to: choices patch-level training would '
                    'change (as deepseek_v32); its own sliding-window layers (csa_window_size) are not converted to '
                    'patches either'),
    'glm_moe_dsa': ('GLM-MoE-DSA: DeepSeek sparse attention; its indexer chooses which tokens each token attends to, '
                    'a choice patch-level training would change (as deepseek_v32)'),
}
# registered by mcore-bridge 1.6.5 only with megatron-core's models.hybrid: nemotron_h from 0.19, deepseek_v41 with
# its hyper-connection layers (newer than 0.19.2); 0.16.1 has neither
MCORE_CONDITIONAL_TYPES = ('nemotron_h', 'deepseek_v41')
# multimodal types (a vision or audio tower): refused, except qwen3_5 (text-only, HYBRID_MCORE_TYPES)
MCORE_MULTIMODAL_TYPES = ('deepseek_v41', 'gemma4', 'gemma4_unified', 'glm4v', 'glm4v_moe', 'glm5_next', 'internvl',
                          'internvl_chat', 'kimi_k25', 'kimi_vl', 'llama4', 'llava_onevision1_5', 'minicpmv4_6',
                          'muse_glimmer', 'ovis2_5', 'qwen2_5_omni', 'qwen2_5_vl', 'qwen2_vl', 'qwen3_5', 'qwen3_asr',
                          'qwen3_omni', 'qwen3_vl', 'qwen4_exp')
MCORE_MULTIMODAL_REFUSAL = ('a multimodal model (mcore-bridge builds it with its vision or audio tower); PLT trains '
                            'text decoders (Qwen3.5 on text only)')
# embedding types (no HF model type maps to them; ms-swift picks them for --task_type embedding)
MCORE_EMBEDDING_TYPES = ('qwen3_emb', )
MCORE_EMBEDDING_REFUSAL = 'an embedding model (pooled hidden states, no next-token loss); PLT trains causal LMs'
# language-model types: `gpt`, the hybrids' and the refused ones
MCORE_LLM_TYPES = (MCORE_GPT_TYPE, 'qwen3_next', *OWN_MCORE_TYPES.values(), *MCORE_REFUSED)


def mcore_refusal(mcore_type: Optional[str]) -> Optional[str]:
    """Why PLT refuses mcore-bridge model type ``mcore_type`` (None: unknown here, or one PLT builds)."""
    if mcore_type in MCORE_REFUSED:
        return MCORE_REFUSED[mcore_type]
    if mcore_type in MCORE_MULTIMODAL_TYPES and mcore_type not in HYBRID_MCORE_TYPES.values():
        return MCORE_MULTIMODAL_REFUSAL
    if mcore_type in MCORE_EMBEDDING_TYPES:
        return MCORE_EMBEDDING_REFUSAL
    return None


def check_mcore_types(registered) -> None:
    """Fail loudly when mcore-bridge registers a model type this table does not classify, or drops one it does
    (``registered``: the keys of MODEL_MAPPING, without PLT's own ``*_plt`` and critic types)."""
    known = set(MCORE_LLM_TYPES) | set(MCORE_MULTIMODAL_TYPES) | set(MCORE_EMBEDDING_TYPES)
    added = sorted(set(registered) - known)
    dropped = sorted(known - set(MCORE_CONDITIONAL_TYPES) - set(registered))
    if added or dropped:
        raise RuntimeError(f'mcore-bridge registers model types swift-plt does not classify ({added}) or no longer '
                           f'registers {dropped} (swift-plt was verified against {MCORE_BRIDGE_VERIFIED}): update '
                           f'swift_plt/models/families.py and docs/model-families.md.')


def supported_list() -> str:
    return ', '.join(sorted(FAMILIES))


def plt_refusal(model_type: Optional[str], is_multimodal: bool = False,
                advice: str = 'Use --patch_size 1.') -> Optional[str]:
    """None where HF model type ``model_type`` supports K > 1, else why not, then ``advice`` (what to do)."""
    if is_multimodal and model_type not in TEXT_ONLY_MULTIMODAL:
        return (f'`{model_type}` is a multimodal model; PLT trains text-only decoders ({supported_list()}). '
                f'{advice}')
    if model_type in FAMILIES:
        return None
    if model_type in REFUSED:
        return f'`{model_type}` is not supported: {REFUSED[model_type]}. {advice}'
    if model_type in MCORE_REFUSED:  # the HF model_type of each is its mcore-bridge type's name
        return f'`{model_type}` is not supported: {MCORE_REFUSED[model_type]}. {advice}'
    return (f'model type `{model_type}` (config.json) has no patch-level training; supported: {supported_list()}. '
            f'{advice}')


def structure(model_type: Optional[str]) -> str:
    """'dense', 'moe', 'mla+moe', 'hybrid' or 'hybrid+moe' for a supported family ('' otherwise)."""
    return FAMILIES.get(model_type, '')


def check_mcore_family_types(mcore_type: str, hf_types) -> None:
    """Fail loudly when mcore-bridge's model type ``mcore_type`` (``gpt``, a hybrid's, an own type) no longer builds
    every supported family this table maps to it (``hf_types``: its meta's model_types; upstream moved)."""
    moved = sorted(t for t in FAMILIES
                   if FAMILY_MCORE_TYPES.get(t, MCORE_GPT_TYPE) == mcore_type and t not in hf_types)
    if moved:
        raise RuntimeError(f'mcore-bridge no longer builds {moved} as `{mcore_type}` (swift-plt was verified against '
                           f'{MCORE_BRIDGE_VERIFIED}): update swift-plt\'s family table.')
