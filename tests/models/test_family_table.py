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
    assert set(families.FAMILIES) | set(families.REFUSED) == set(types)
    families.check_mcore_gpt_types(types)


def test_guard_fails_when_a_family_moves():
    types = [t for t in families.MCORE_GPT_TYPES_VERIFIED if t != 'qwen3_moe']
    with pytest.raises(RuntimeError, match=r"no longer builds \['qwen3_moe'\] as its `gpt` model"):
        families.check_mcore_gpt_types(types)
