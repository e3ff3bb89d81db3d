"""Which model families take ``--patch_size K > 1``: the decoders mcore-bridge builds as its ``gpt`` type and the
hybrid Gated-DeltaNet decoders it builds with their own type, keyed by the HF ``model_type`` of config.json. PLT only
wraps the decoder (pooling, positions, masks, loss), so one ``PLTGPTModel`` serves them all
(docs/model-families.md). Imports no torch."""
from typing import Optional

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
    # hybrids: 3 of 4 layers Gated DeltaNet (causal conv + gated delta rule), the 4th gated attention
    'qwen3_next': 'hybrid+moe',
    'qwen3_5': 'hybrid',  # Qwen3_5ForConditionalGeneration: text-only at K > 1
    'qwen3_5_moe': 'hybrid+moe',
}

# hybrid families -> the mcore-bridge model type that builds them (not `gpt`); PLT registers `<type>_plt` for each
HYBRID_MCORE_TYPES = {'qwen3_next': 'qwen3_next', 'qwen3_5': 'qwen3_5', 'qwen3_5_moe': 'qwen3_5'}
# multimodal checkpoints whose language model PLT trains on text-only data (a sample with images is refused)
TEXT_ONLY_MULTIMODAL = ('qwen3_5', 'qwen3_5_moe')

# families mcore-bridge builds as `gpt` that PLT refuses, and why
REFUSED = {
    'gpt_oss': ('its sliding-window attention and attention sinks count tokens: at patch level a window of W would '
                'span W*K tokens, which is a different model'),
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
    upstream = (MCORE_GPT_TYPE, *sorted(set(HYBRID_MCORE_TYPES.values())))
    return upstream + tuple(plt_mcore_type(t) for t in upstream)

# mcore-bridge's `gpt` list this table was written against (check_mcore_gpt_types)
MCORE_GPT_TYPES_VERIFIED = ('qwen2', 'llama', 'qwen3', 'qwen2_moe', 'qwen3_moe', 'internlm3', 'mimo', 'deepseek',
                            'deepseek_v2', 'deepseek_v3', 'deepseek_v32', 'kimi_k2', 'dots1', 'ernie4_5',
                            'ernie4_5_moe', 'glm4_moe', 'glm4_moe_lite', 'gpt_oss')
MCORE_BRIDGE_VERIFIED = 'mcore-bridge 1.6.5'


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
    return (f'model type `{model_type}` (config.json) has no patch-level training; supported: {supported_list()}. '
            f'{advice}')


def structure(model_type: Optional[str]) -> str:
    """'dense', 'moe', 'mla+moe', 'hybrid' or 'hybrid+moe' for a supported family ('' otherwise)."""
    return FAMILIES.get(model_type, '')


def check_mcore_gpt_types(mcore_gpt_types) -> None:
    """Fail loudly when mcore-bridge no longer builds a supported family as `gpt` (upstream moved)."""
    moved = sorted(set(FAMILIES) - set(HYBRID_MCORE_TYPES) - set(mcore_gpt_types))
    if moved:
        raise RuntimeError(f'mcore-bridge no longer builds {moved} as its `gpt` model (swift-plt was verified against '
                           f'{MCORE_BRIDGE_VERIFIED}): update swift-plt\'s family table.')


def check_mcore_hybrid_types(mcore_type: str, hf_types) -> None:
    """Fail loudly when mcore-bridge's ``mcore_type`` no longer builds the hybrid families mapped to it."""
    moved = sorted(t for t, m in HYBRID_MCORE_TYPES.items() if m == mcore_type and t not in hf_types)
    if moved:
        raise RuntimeError(f'mcore-bridge no longer builds {moved} as `{mcore_type}` (swift-plt was verified against '
                           f'{MCORE_BRIDGE_VERIFIED}): update swift-plt\'s family table.')
