"""The family table (swift_plt/families/) against the installed mcore-bridge, and its upstream guard."""
import pytest

from harness.dist import spawn
from swift_plt import families


def _gpt_types():
    from mcore_bridge.model import get_model_meta
    return list(get_model_meta('gpt').model_types)


def test_table_matches_installed_mcore_bridge():
    (types, ) = spawn(_gpt_types, 1)
    assert sorted(types) == sorted(families.MCORE_GPT_TYPES_VERIFIED)
    assert set(families.FAMILIES) - set(families.FAMILY_MCORE_TYPES) | set(families.REFUSED) == set(types)
    families.check_mcore_family_types('gpt', types)


def _hybrid_types():
    from mcore_bridge.model import get_model_meta
    return {t: list(get_model_meta(t).model_types) for t in set(families.HYBRID_MCORE_TYPES.values())}


def test_hybrid_table_matches_installed_mcore_bridge():
    """Each hybrid family is built by the mcore-bridge type the table names, with the loader PLT wraps."""
    (types, ) = spawn(_hybrid_types, 1)
    for mcore_type, hf_types in types.items():
        families.check_mcore_family_types(mcore_type, hf_types)
    assert {t for hf in types.values() for t in hf} >= set(families.HYBRID_MCORE_TYPES)
    with pytest.raises(RuntimeError, match=r"no longer builds \['qwen3_5_moe'\] as `qwen3_5`"):
        families.check_mcore_family_types('qwen3_5', ['qwen3_5'])


def _plt_hybrid_metas():
    from swift_plt.plugin.register import plt_model_meta
    return {t: (plt_model_meta(t).model_type, plt_model_meta(t).loader.__mro__[2].__module__,
                plt_model_meta(t).visual_cls is not None, plt_model_meta(t).bridge_cls.__name__)
            for t in ('qwen3_next', 'qwen3_5', 'olmoe', 'glm4', 'minimax_m2', 'hy_v3', 'bailing_moe')}


def test_hybrid_plt_metas_wrap_the_verified_loader():
    """Each own-type family's PLT meta wraps its verified loader and keeps its bridge (hy_v3, bailing_moe: the `gpt`
    loader, their own bridges)."""
    (metas, ) = spawn(_plt_hybrid_metas, 1)
    assert metas == {'qwen3_next': ('qwen3_next_plt', 'mcore_bridge.model.gpts.qwen3_next_gdn', False,
                                    'Qwen3NextGDNBridge'),
                     'qwen3_5': ('qwen3_5_plt', 'mcore_bridge.model.gpts.qwen3_next_gdn', True, 'Qwen3_5Bridge'),
                     'olmoe': ('olmoe_plt', 'mcore_bridge.model.gpts.olmoe', False, 'OLMoEBridge'),
                     'glm4': ('glm4_plt', 'mcore_bridge.model.gpts.glm4', False, 'Glm4Bridge'),
                     'minimax_m2': ('minimax_m2_plt', 'mcore_bridge.model.gpts.minimax_m2', False, 'MinimaxM2Bridge'),
                     'hy_v3': ('hy_v3_plt', 'mcore_bridge.model.register', False, 'HyV3Bridge'),
                     'bailing_moe': ('bailing_moe_plt', 'mcore_bridge.model.register', False, 'BailingMoeBridge')}


def test_guard_fails_when_a_family_moves():
    types = [t for t in families.MCORE_GPT_TYPES_VERIFIED if t != 'qwen3_moe']
    with pytest.raises(RuntimeError, match=r"no longer builds \['qwen3_moe'\] as `gpt` \(swift-plt was verified"):
        families.check_mcore_family_types('gpt', types)


def _registered_types():
    """Every model type the installed mcore-bridge registers: HF model types and whether it has a vision tower."""
    import mcore_bridge.model  # noqa: F401 (registers them)
    from mcore_bridge.model.register import MODEL_MAPPING

    from swift_plt.critic.families import CRITIC_FAMILIES
    return {t: (list(m.model_types), m.visual_cls is not None) for t, m in MODEL_MAPPING.items()
            if not t.endswith(families.PLT_SUFFIX) and t not in CRITIC_FAMILIES}


def test_every_mcore_bridge_type_is_classified():
    """mcore-bridge 1.6.5 registers 33 model types on megatron-core 0.16.1 and 34 on 0.19.2 (nemotron_h, on its
    models.hybrid; deepseek_v41 needs hyper-connection layers 0.19.2 lacks); each is a language model PLT builds or
    refuses with its reason, a multimodal model (vision/audio tower) or an embedding model."""
    from swift_plt.compat.versions import megatron_core_at_least
    (registered, ) = spawn(_registered_types, 1)
    families.check_mcore_types(registered)
    conditional = ['nemotron_h'] if megatron_core_at_least((0, 19)) else []
    assert len(registered) == 33 + len(conditional)
    assert [t for t in families.MCORE_CONDITIONAL_TYPES if t in registered] == conditional
    for t, (hf_types, has_tower) in registered.items():
        assert has_tower == (t in families.MCORE_MULTIMODAL_TYPES), t
        if t in families.MCORE_REFUSED:  # the HF model_type is the type's name (plt_refusal keys on either)
            assert hf_types == [t]
        if t in families.MCORE_LLM_TYPES or t in families.MCORE_MULTIMODAL_TYPES:
            assert (families.mcore_refusal(t) is None) == (t in families.plt_mcore_types()), t
    assert registered['qwen3_emb'][0] == [] and families.mcore_refusal('qwen3_emb')
    # every HF model type of a language-model type is supported or refused with a reason of its own
    llm_hf = {h for t in families.MCORE_LLM_TYPES if t in registered for h in registered[t][0]}
    assert llm_hf == (set(families.FAMILIES) - set(families.TEXT_ONLY_MULTIMODAL)) | set(families.REFUSED) | (
        set(families.MCORE_REFUSED) - (set(families.MCORE_CONDITIONAL_TYPES) - set(registered)))


def test_guard_fails_when_mcore_bridge_adds_or_drops_a_type():
    known = [*families.MCORE_LLM_TYPES, *families.MCORE_MULTIMODAL_TYPES, *families.MCORE_EMBEDDING_TYPES]
    registered = [t for t in known if t not in families.MCORE_CONDITIONAL_TYPES]
    families.check_mcore_types(registered)
    families.check_mcore_types(known)  # a megatron-core with models.hybrid: nemotron_h, deepseek_v41 too
    with pytest.raises(RuntimeError, match=r"does not classify \(\['mamba3'\]\)"):
        families.check_mcore_types(registered + ['mamba3'])
    with pytest.raises(RuntimeError, match=r"no longer registers \['olmoe'\]"):
        families.check_mcore_types([t for t in registered if t != 'olmoe'])


def _plt_loader_refusal():
    from types import SimpleNamespace

    from mcore_bridge.model.register import ModelLoader, get_model_meta

    from swift_plt.models.megatron_gpt import plt_loader
    upstream = get_model_meta('qwen3_next')
    moved = SimpleNamespace(loader=ModelLoader, bridge_cls=upstream.bridge_cls)  # e.g. another mcore-bridge
    try:
        plt_loader('qwen3_next', moved)
    except RuntimeError as e:
        return str(e), plt_loader('qwen3_next', upstream).__name__
    return None, None


def test_plt_loader_refuses_an_upstream_it_was_not_verified_with():
    """The hybrid's PLT loader wraps mcore-bridge 1.6.5's Qwen3NextLoader; any other loader (USE_MCORE_GDN=0,
    another mcore-bridge) fails loudly, naming both."""
    ((message, name), ) = spawn(_plt_loader_refusal, 1)
    assert name == 'PLTQwen3NextLoader'
    assert message and 'its loader is mcore_bridge.model.register.ModelLoader, not the ' \
        'mcore_bridge.model.gpts.qwen3_next_gdn.Qwen3NextLoader' in message and 'mcore-bridge 1.6.5' in message
