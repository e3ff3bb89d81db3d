"""swift_plt/plugin/patches/swift_model.py (and the registration in swift_megatron_arguments.py) through the real
ms-swift / mcore-bridge code: the plugin's model types are registered when the plugin activates, without
--custom_register_path; a misspelt critic type fails with the critic types; other model types and the matching of a
checkpoint's architectures stay upstream's. (Registered at import in a fresh interpreter, and not with
SWIFT_PLT_DISABLE=1: test_patches_swift.py::test_startup_hook_patches_on_import_and_opt_out.)"""
import pytest

from harness.dist import spawn
from swift_plt.critic.families import CRITIC_FAMILIES
from swift_plt.plugin.register import plugin_model_types


@pytest.fixture(scope='module')
def moe_dir(tmp_path_factory):
    """A Qwen3-MoE checkpoint dir as far as ms-swift's model-type lookup reads it (config.json)."""
    from transformers import Qwen3MoeConfig
    d = tmp_path_factory.mktemp('qwen3_moe')
    Qwen3MoeConfig(vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=4,
                   num_experts_per_tok=2, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                   architectures=['Qwen3MoeForCausalLM']).save_pretrained(str(d))
    return str(d)


def test_critic_type_resolves_without_custom_register_path(moe_dir, monkeypatch):
    import swift.model
    from swift.arguments import ExportArguments
    from swift.model import MODEL_MAPPING

    from swift_plt.critic.hf import CriticHFLoader
    from swift_plt.plugin.patches import swift_model
    for t in plugin_model_types():  # as before activation: registered by nothing else
        monkeypatch.delitem(MODEL_MAPPING, t)
    swift_model.apply(swift.model)
    assert all(t in MODEL_MAPPING for t in plugin_model_types())
    args = ExportArguments(model=moe_dir, model_type='qwen3_moe_critic')
    assert not args.custom_register_path and not args.external_plugins
    assert args.model_type == args.model_meta.model_type == args.model_meta.mcore_model_type == 'qwen3_moe_critic'
    assert args.model_meta.loader is CriticHFLoader and args.model_meta.template == 'qwen3'


@pytest.mark.parametrize('name, meant', [('qwen3_critc', 'qwen3_critic'), ('qwen3-critic', 'qwen3_critic'),
                                         ('qwen3_moe_critic_', 'qwen3_moe_critic'), ('mistral_critic', None)])
def test_misspelt_critic_type_lists_the_critic_types(moe_dir, name, meant):
    import swift.model.model_meta as model_meta
    from swift.arguments import ExportArguments
    with pytest.raises(ValueError) as e:
        ExportArguments(model=moe_dir, model_type=name)
    msg = str(e.value)
    assert msg.startswith(f'--model_type {name} is unknown') and all(t in msg for t in CRITIC_FAMILIES)
    assert (f'did you mean {meant}?' in msg) if meant else 'did you mean' not in msg
    assert len(msg) < 500 and 'qwen2_vl' not in msg  # not upstream's list of every model type
    with pytest.raises(ValueError, match=f"model_type: '{name}' not in ") as upstream:  # without the plugin
        model_meta._get_model_info.__wrapped__(moe_dir, name, None)
    assert 'qwen2_vl' in str(upstream.value)


def test_qwen3_5_moe_critic_refused_with_the_reason(moe_dir):
    """Qwen3.5-MoE has no critic (no *ForTokenClassification in transformers): its critic type says so."""
    from swift.arguments import ExportArguments
    with pytest.raises(ValueError, match=r'--model_type qwen3_5_moe_critic: Qwen3.5-MoE \(`qwen3_5_moe`\) has no '
                       r'critic: transformers has no Qwen3_5MoeForTokenClassification'):
        ExportArguments(model=moe_dir, model_type='qwen3_5_moe_critic')


@pytest.mark.parametrize('name', ['qwen3_moe_x', 'qwen3_mo', 'llama4_x'])
def test_other_unknown_model_types_keep_upstreams_error(moe_dir, name):
    import swift.model.model_meta as model_meta
    from swift.arguments import ExportArguments
    with pytest.raises(ValueError) as got:
        ExportArguments(model=moe_dir, model_type=name)
    with pytest.raises(ValueError) as upstream:
        model_meta._get_model_info.__wrapped__(moe_dir, name, None)
    assert str(got.value) == str(upstream.value) and f"model_type: '{name}' not in " in str(got.value)


def test_architecture_matching_is_upstreams(monkeypatch):
    """A checkpoint without --model_type is matched by its architectures as without the plugin's types (a
    Qwen3ForTokenClassification checkpoint is no critic; LlamaForCausalLM does not gain llama3_2_plt)."""
    import swift.model.model_meta as model_meta
    patched = model_meta.get_matched_model_types
    archs = [None] + sorted(model_meta._get_arch_mapping())
    assert {'LlamaForCausalLM', 'Qwen3MoeForTokenClassification'} <= set(archs)
    got = {a: patched([a] if a else None) for a in archs}
    for t in plugin_model_types():
        monkeypatch.delitem(model_meta.MODEL_MAPPING, t)
    assert got == {a: patched.__wrapped__([a] if a else None) for a in archs}
    assert got['Qwen3MoeForTokenClassification'] == [] and len(got['LlamaForCausalLM']) > 1


def _mcore_registry():
    import swift.megatron.arguments.megatron_args  # noqa: F401 (ms-swift's only user of mcore-bridge's registry)
    from mcore_bridge.model.register import MODEL_MAPPING
    ours = plugin_model_types()
    upstream_hf_types = {t for k, meta in MODEL_MAPPING.items() if k not in ours for t in meta.model_types}
    return ({k: (MODEL_MAPPING[k].loader.__name__, MODEL_MAPPING[k].model_types) for k in ours if k in MODEL_MAPPING},
            upstream_hf_types)


def test_megatron_side_registered_on_activation():
    """Once ms-swift's Megatron arguments are imported, every type is in mcore-bridge's registry (no register call);
    their HF model types are their own names, none of upstream's: mcore-bridge's hf -> mcore map is unchanged for
    every other model type."""
    ((registered, upstream_hf_types), ) = spawn(_mcore_registry, 1)
    hybrid = {'qwen3_next_critic', 'qwen3_5_critic'}  # over mcore-bridge's hybrid loader (Qwen3NextLoader)
    assert registered == {t: ('PLTModelLoader' if t == 'llama3_2_plt' else 'CriticQwen3NextLoader' if t in hybrid else
                              'CriticModelLoader', [t]) for t in plugin_model_types()}
    assert 'qwen3_moe' in upstream_hf_types and not upstream_hf_types & set(plugin_model_types())
