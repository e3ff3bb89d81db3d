"""The family table (swift_plt/models/families.py) against the installed mcore-bridge, and its upstream guard."""
import pytest

from harness.dist import spawn
from swift_plt.models import families


def _gpt_types():
    from mcore_bridge.model import get_model_meta
    return list(get_model_meta('gpt').model_types)


def test_table_matches_installed_mcore_bridge():
    (types, ) = spawn(_gpt_types, 1)
    assert sorted(types) == sorted(families.MCORE_GPT_TYPES_VERIFIED)
    assert set(families.FAMILIES) - set(families.HYBRID_MCORE_TYPES) | set(families.REFUSED) == set(types)
    families.check_mcore_gpt_types(types)


def _hybrid_types():
    from mcore_bridge.model import get_model_meta
    return {t: list(get_model_meta(t).model_types) for t in set(families.HYBRID_MCORE_TYPES.values())}


def test_hybrid_table_matches_installed_mcore_bridge():
    """Each hybrid family is built by the mcore-bridge type the table names, with the loader PLT wraps."""
    (types, ) = spawn(_hybrid_types, 1)
    for mcore_type, hf_types in types.items():
        families.check_mcore_hybrid_types(mcore_type, hf_types)
    assert {t for hf in types.values() for t in hf} >= set(families.HYBRID_MCORE_TYPES)
    with pytest.raises(RuntimeError, match=r"no longer builds \['qwen3_5_moe'\] as `qwen3_5`"):
        families.check_mcore_hybrid_types('qwen3_5', ['qwen3_5'])


def _plt_hybrid_metas():
    from swift_plt.plugin.register import plt_model_meta
    return {t: (plt_model_meta(t).model_type, plt_model_meta(t).loader.__mro__[2].__module__,
                plt_model_meta(t).visual_cls is not None) for t in ('qwen3_next', 'qwen3_5')}


def test_hybrid_plt_metas_wrap_the_verified_loader():
    (metas, ) = spawn(_plt_hybrid_metas, 1)
    assert metas == {'qwen3_next': ('qwen3_next_plt', 'mcore_bridge.model.gpts.qwen3_next_gdn', False),
                     'qwen3_5': ('qwen3_5_plt', 'mcore_bridge.model.gpts.qwen3_next_gdn', True)}


def test_guard_fails_when_a_family_moves():
    types = [t for t in families.MCORE_GPT_TYPES_VERIFIED if t != 'qwen3_moe']
    with pytest.raises(RuntimeError, match=r"no longer builds \['qwen3_moe'\] as its `gpt` model"):
        families.check_mcore_gpt_types(types)
