"""One record per decoder family (``record.Family``), grouped by structure (``dense``, ``moe``, ``mla``, ``hybrid``),
and the tables and rules derived from them (``registry``); ``mcore_types`` classifies mcore-bridge's other types and
``upstream`` checks a config.json for known differences between stock Megatron and transformers. Adding a family:
docs/adding-a-family.md. Imports no torch."""
from swift_plt.families.registry import (ATTENTION_SINK_TYPES, FAMILIES, FAMILY_MCORE_TYPES, HF_SIDE_REFUSED,
                                         HYBRID_MCORE_TYPES, MCORE_BRIDGE_VERIFIED, MCORE_CONDITIONAL_TYPES,
                                         MCORE_EMBEDDING_TYPES, MCORE_GPT_TYPE, MCORE_GPT_TYPES_VERIFIED,
                                         MCORE_LLM_TYPES, MCORE_MULTIMODAL_TYPES, MCORE_REFUSED, OWN_MCORE_TYPES,
                                         PLT_GPT_MODEL_TYPE, PLT_SUFFIX, REFUSED, TEXT_ONLY_MULTIMODAL,
                                         check_mcore_family_types, check_mcore_types, family,
                                         is_linear_attention_mcore_type, linear_attention_problems,
                                         mcore_refusal, plt_mcore_type,
                                         plt_mcore_types, plt_refusal, structure, supported_list, verified_classes)

__all__ = ['ATTENTION_SINK_TYPES', 'FAMILIES', 'FAMILY_MCORE_TYPES', 'HF_SIDE_REFUSED', 'HYBRID_MCORE_TYPES',
           'MCORE_BRIDGE_VERIFIED', 'MCORE_CONDITIONAL_TYPES', 'MCORE_EMBEDDING_TYPES', 'MCORE_GPT_TYPE',
           'MCORE_GPT_TYPES_VERIFIED', 'MCORE_LLM_TYPES', 'MCORE_MULTIMODAL_TYPES', 'MCORE_REFUSED', 'OWN_MCORE_TYPES',
           'PLT_GPT_MODEL_TYPE', 'PLT_SUFFIX', 'REFUSED', 'TEXT_ONLY_MULTIMODAL', 'check_mcore_family_types',
           'check_mcore_types', 'family', 'is_linear_attention_mcore_type', 'linear_attention_problems',
           'mcore_refusal', 'plt_mcore_type',
           'plt_mcore_types', 'plt_refusal', 'structure', 'supported_list', 'verified_classes']
