"""The family records collected, and every table and rule derived from them: which HF model types train at K > 1,
through which mcore-bridge type, loader and bridge, which are refused and why. Imports no torch."""
import os
from typing import Dict, Optional

from swift_plt.families import dense, hybrid, mcore_types, mla, moe
from swift_plt.families.record import GPT_BRIDGE, GPT_LOADER, Family

MCORE_GPT_TYPE = 'gpt'  # mcore-bridge's model type of most families
FAMILIES: Dict[str, Family] = {f.hf_type: f for f in (*dense.FAMILIES, *moe.FAMILIES, *mla.FAMILIES,
                                                      *hybrid.FAMILIES)}
PLT_SUFFIX = '_plt'  # PLT registers ``<mcore type>_plt`` for each (``gpt_plt``, ``qwen3_next_plt``, ...)
PLT_GPT_MODEL_TYPE = MCORE_GPT_TYPE + PLT_SUFFIX

_REFUSED = (*mla.REFUSED, *mcore_types.REFUSED)
# families mcore-bridge builds as `gpt` that PLT refuses, and why
REFUSED = {r.model_type: r.reason for r in _REFUSED if r.mcore_type == MCORE_GPT_TYPE}
# mcore-bridge types of their own name that PLT refuses, and why
MCORE_REFUSED = {r.model_type: r.reason for r in _REFUSED if r.mcore_type != MCORE_GPT_TYPE}
MCORE_CONDITIONAL_TYPES = (*(r.model_type for r in _REFUSED if r.conditional),
                           *mcore_types.CONDITIONAL_MULTIMODAL)
MCORE_MULTIMODAL_TYPES = mcore_types.MULTIMODAL_TYPES
MCORE_EMBEDDING_TYPES = mcore_types.EMBEDDING_TYPES
MCORE_BRIDGE_VERIFIED = mcore_types.MCORE_BRIDGE_VERIFIED


def family(model_type: Optional[str]) -> Optional[Family]:
    """The record of HF model type ``model_type`` (None: not a family PLT trains)."""
    return FAMILIES.get(model_type)


def _types(**flags) -> tuple:
    return tuple(t for t, f in FAMILIES.items() if all(getattr(f, k) == v for k, v in flags.items()))


# every family not built as `gpt` -> its mcore-bridge type
FAMILY_MCORE_TYPES = {t: f.mcore_type for t, f in FAMILIES.items() if f.mcore_type != MCORE_GPT_TYPE}
HYBRID_MCORE_TYPES = {t: FAMILY_MCORE_TYPES[t] for t in _types(linear_attention=True)}
OWN_MCORE_TYPES = {t: m for t, m in FAMILY_MCORE_TYPES.items() if t not in HYBRID_MCORE_TYPES}
ATTENTION_SINK_TYPES = _types(attention_sinks=True)
TEXT_ONLY_MULTIMODAL = _types(text_only_multimodal=True)
HF_SIDE_REFUSED = {t: f.hf_side_refusal for t, f in FAMILIES.items() if f.hf_side_refusal}
# mcore-bridge's `gpt` list the records were written against (tests/models/test_family_table.py)
MCORE_GPT_TYPES_VERIFIED = (*(t for t, f in FAMILIES.items() if f.mcore_type == MCORE_GPT_TYPE), *REFUSED)
# language-model types: `gpt`, the families' own and the refused ones
MCORE_LLM_TYPES = tuple(dict.fromkeys((MCORE_GPT_TYPE, *(m for m in FAMILY_MCORE_TYPES.values()
                                                         if m not in MCORE_MULTIMODAL_TYPES), *MCORE_REFUSED)))


def is_linear_attention_mcore_type(mcore_type: Optional[str]) -> bool:
    """mcore-bridge type ``mcore_type`` builds a Gated-DeltaNet hybrid (``Family.linear_attention``)."""
    return mcore_type in HYBRID_MCORE_TYPES.values()


def plt_mcore_type(mcore_type: str) -> str:
    """The mcore-bridge model type PLT registers for mcore-bridge type ``mcore_type`` (``gpt`` -> ``gpt_plt``)."""
    return mcore_type + PLT_SUFFIX


def plt_mcore_types() -> tuple:
    """Every mcore-bridge model type PLT builds at K > 1 and the upstream ones it replaces."""
    upstream = (MCORE_GPT_TYPE, *sorted(set(FAMILY_MCORE_TYPES.values())))
    return upstream + tuple(plt_mcore_type(t) for t in upstream)


def verified_classes(mcore_type: str) -> tuple:
    """``(loader, bridge)`` as ``module:Class`` names that mcore-bridge type ``mcore_type`` was verified with;
    KeyError for a type swift-plt does not build."""
    if mcore_type == MCORE_GPT_TYPE:
        return GPT_LOADER, GPT_BRIDGE
    pairs = {(f.loader, f.bridge) for f in FAMILIES.values() if f.mcore_type == mcore_type}
    if len(pairs) != 1:
        raise KeyError(mcore_type)
    return pairs.pop()


def mcore_refusal(mcore_type: Optional[str]) -> Optional[str]:
    """Why PLT refuses mcore-bridge model type ``mcore_type`` (None: unknown here, or one PLT builds)."""
    if mcore_type in MCORE_REFUSED:
        return MCORE_REFUSED[mcore_type]
    if mcore_type in MCORE_MULTIMODAL_TYPES and mcore_type not in FAMILY_MCORE_TYPES.values():
        return mcore_types.MULTIMODAL_REFUSAL.format(text_only=', '.join(TEXT_ONLY_MULTIMODAL))
    if mcore_type in MCORE_EMBEDDING_TYPES:
        return mcore_types.EMBEDDING_REFUSAL
    return None


def check_mcore_types(registered) -> None:
    """Fail loudly when mcore-bridge registers a model type the records do not classify, or drops one they do
    (``registered``: the keys of MODEL_MAPPING, without PLT's own ``*_plt`` and critic types)."""
    known = set(MCORE_LLM_TYPES) | set(MCORE_MULTIMODAL_TYPES) | set(MCORE_EMBEDDING_TYPES)
    added = sorted(set(registered) - known)
    dropped = sorted(known - set(MCORE_CONDITIONAL_TYPES) - set(registered))
    if added or dropped:
        raise RuntimeError(f'mcore-bridge registers model types swift-plt does not classify ({added}) or no longer '
                           f'registers {dropped} (swift-plt was verified against {MCORE_BRIDGE_VERIFIED}): update '
                           f'swift_plt/families/ and docs/model-families.md.')


def check_mcore_family_types(mcore_type: str, hf_types) -> None:
    """Fail loudly when mcore-bridge's model type ``mcore_type`` no longer builds every family the records map to it
    (``hf_types``: its meta's model_types; upstream moved)."""
    moved = sorted(t for t, f in FAMILIES.items() if f.mcore_type == mcore_type and t not in hf_types)
    if moved:
        raise RuntimeError(f'mcore-bridge no longer builds {moved} as `{mcore_type}` (swift-plt was verified against '
                           f'{MCORE_BRIDGE_VERIFIED}): update swift-plt\'s family records (swift_plt/families/).')


def supported_list() -> str:
    return ', '.join(sorted(FAMILIES))


def structure(model_type: Optional[str]) -> str:
    """'dense', 'moe', 'mla+moe', 'hybrid' or 'hybrid+moe' for a supported family ('' otherwise)."""
    f = family(model_type)
    return f.structure if f else ''


def plt_refusal(model_type: Optional[str], is_multimodal: bool = False,
                advice: str = 'Use --patch_size 1.') -> Optional[str]:
    """None where HF model type ``model_type`` supports K > 1, else why not, then ``advice`` (what to do)."""
    if is_multimodal and model_type not in TEXT_ONLY_MULTIMODAL:
        return (f'`{model_type}` is a multimodal model; PLT trains text-only decoders ({supported_list()}). '
                f'{advice}')
    if model_type in FAMILIES:
        return None
    reason = REFUSED.get(model_type) or MCORE_REFUSED.get(model_type)  # the HF model_type is the mcore type's name
    if reason:
        return f'`{model_type}` is not supported: {reason}. {advice}'
    return (f'model type `{model_type}` (config.json) has no patch-level training; supported: {supported_list()}. '
            f'{advice}')


def linear_attention_problems(context_parallel_size) -> list:
    """What a Gated-DeltaNet hybrid (``Family.linear_attention``) cannot do at K > 1 under context parallel: the
    installed megatron-core's Gated DeltaNet needs CP (>= 0.18: its all-to-all over patches), and mcore-bridge's
    transformers-module path (``USE_MCORE_GDN=0``) asserts CP == 1 at any K. The CLI and the model config both ask."""
    from swift_plt.compat.versions import gdn_context_parallel_problem
    if (context_parallel_size or 1) <= 1:
        return []
    problem = gdn_context_parallel_problem()
    if problem:
        return [problem]
    if os.environ.get('USE_MCORE_GDN', '1').strip().lower() in ('0', 'false', 'no', 'off', 'n', 'f'):
        return ['--context_parallel_size > 1 with USE_MCORE_GDN=0 (mcore-bridge\'s transformers-based Gated '
                'DeltaNet: "currently does not support context parallel", at any K; unset USE_MCORE_GDN)']
    return []
