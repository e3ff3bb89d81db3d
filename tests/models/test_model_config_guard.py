"""``PLTModelConfig``'s guard (swift_plt.models.megatron_gpt): at patch_size > 1 the config refuses, naming it, each
thing PLT cannot train (MTP, a multimodal model other than the text-only ones, a task other than causal LM, hash
routing, an attention variant other than Gated DeltaNet, Gated DeltaNet under context parallel on a megatron-core
without CP for it); K=1 accepts each. Real configs: tiny HF configs through mcore-bridge's ``hf_to_mcore_config``,
built in one spawned rank (harness); an older megatron-core is simulated by the version it reports."""
import sys

import pytest

from harness.dist import spawn

pytestmark = pytest.mark.xdist_group('model_config_guard')  # one spawned rank builds every case (module fixture)
K = 4
_COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               max_position_embeddings=512, vocab_size=512, bos_token_id=1, eos_token_id=2, pad_token_id=3)
_HYBRID = dict(num_hidden_layers=4, full_attention_interval=4, head_dim=32, partial_rotary_factor=0.25,
               linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
               linear_num_value_heads=4)
_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4)
_MM_IDS = dict(image_token_id=508, video_token_id=509, vision_start_token_id=510, vision_end_token_id=511)

# name -> (HF config, config overrides, simulated megatron-core or None, words the refusal must name)
REFUSED = {
    'mtp': ('llama', dict(mtp_num_layers=1), None, ('mtp_num_layers', )),
    'multimodal': ('qwen2_5_vl', {}, None, ('is_multimodal', )),
    'task_type': ('llama', dict(task_type='seq_cls'), None, ('task_type', )),
    'hash_routing': ('llama', dict(moe_n_hash_layers=1), None, ('moe_n_hash_layers', )),
    'attention_variant': ('llama', dict(experimental_attention_variant='dsa'), None,
                          ('experimental_attention_variant', )),
    'gdn_cp_old_mcore': ('qwen3_next', dict(context_parallel_size=2), '0.16.1',
                         ('context_parallel_size', 'Gated DeltaNet')),
}
# accepted at K > 1 (the refusals' neighbours)
ACCEPTED = {
    'llama': ('llama', {}, None),
    'text_only_multimodal': ('qwen3_5', {}, None),  # is_multimodal, trained on text (families' text_only_multimodal)
    'gated_delta_net': ('qwen3_next', {}, '0.16.1'),  # the hybrids' linear attention, without CP: any megatron-core
    'gdn_cp_new_mcore': ('qwen3_next', dict(context_parallel_size=2), '0.19.2'),  # megatron-core >= 0.18 has its CP
}
_ALL_WORDS = {w for *_, words in REFUSED.values() for w in words} - {'context_parallel_size'}


def _hf_config(kind):
    import transformers
    if kind == 'llama':
        return transformers.LlamaConfig(**_COMMON)
    if kind == 'qwen3_next':
        return transformers.Qwen3NextConfig(**dict(_COMMON, **_HYBRID), num_experts=4, num_experts_per_tok=2,
                                            moe_intermediate_size=32, shared_expert_intermediate_size=64)
    if kind == 'qwen3_5':  # transformers >= 5
        if not hasattr(transformers, 'Qwen3_5Config'):
            return None
        return transformers.Qwen3_5Config(text_config=dict(_COMMON, **_HYBRID), vision_config=_VISION, **_MM_IDS)
    if kind == 'qwen2_5_vl':
        return transformers.Qwen2_5_VLConfig(text_config=_COMMON, vision_config=_VISION, **_MM_IDS)
    raise ValueError(kind)


def _simulated_megatron_core(version):
    """Make swift_plt see megatron-core ``version`` (``installed_version`` / ``megatron_core_at_least``, wherever a
    module bound them); returns the undo."""
    from swift_plt.compat import versions
    real_installed, real_at_least = versions.installed_version, versions.megatron_core_at_least

    def installed(dist):
        return version if dist == 'megatron-core' else real_installed(dist)

    def at_least(release):
        from packaging.version import Version
        return Version(version).release[:len(release)] >= tuple(release)

    swaps = [(m, name, real, new) for m in list(sys.modules.values()) if getattr(m, '__name__', '').startswith('swift_plt')
             for name, real, new in (('installed_version', real_installed, installed),
                                     ('megatron_core_at_least', real_at_least, at_least))
             if getattr(m, name, None) is real]
    for m, name, _, new in swaps:
        setattr(m, name, new)
    return lambda: [setattr(m, name, real) for m, name, real, _ in swaps]


def _outcomes(cases):
    """``{(name, patch_size): None (accepted) | refusal message | 'skip: why' | 'other: error'}`` (one rank)."""
    import os

    import torch
    from mcore_bridge.config.parser import hf_to_mcore_config

    from swift_plt.models.megatron_gpt import PLTModelConfig
    os.environ.pop('USE_MCORE_GDN', None)  # mcore-bridge's default Gated DeltaNet (megatron-core's)
    out = {}
    for name, (kind, overrides, mcore, patch_size) in cases.items():
        hf = _hf_config(kind)
        if hf is None:
            out[name] = f'skip: transformers has no config class for {kind}'
            continue
        kwargs = dict(hf_to_mcore_config(hf), hf_config=hf, params_dtype=torch.float32, patch_size=patch_size)
        undo = _simulated_megatron_core(mcore) if mcore else (lambda: None)
        try:
            config = PLTModelConfig(**{**kwargs, **overrides})
            out[name] = None
            assert config.patch_size == patch_size
            if name[0] == 'text_only_multimodal':  # the control is one: a multimodal config, accepted
                assert config.is_multimodal, 'qwen3_5 is not multimodal in mcore-bridge'
            if kind == 'qwen3_next':
                assert config.experimental_attention_variant == 'gated_delta_net'
        except ValueError as e:
            out[name] = str(e)
        except TypeError as e:  # e.g. an mcore-bridge without moe_n_hash_layers
            out[name] = f'skip: {e}'
        except AssertionError as e:  # megatron-core < 0.18 itself: its Gated DeltaNet has no CP, at any K
            if 'Gated delta net does not support context parallel' not in str(e):
                raise
            out[name] = f'skip: the installed megatron-core refuses it before the guard, at any K ({e})'
        finally:
            undo()
    return out


@pytest.fixture(scope='module')
def outcomes():
    cases = {}
    for name, (kind, overrides, mcore, _) in REFUSED.items():
        for k in (1, K):
            cases[(name, k)] = (kind, overrides, mcore, k)
    for name, (kind, overrides, mcore) in ACCEPTED.items():
        cases[(name, K)] = (kind, overrides, mcore, K)
    (out, ) = spawn(_outcomes, 1, cases)
    return out


def _get(outcomes, key):
    got = outcomes[key]
    if isinstance(got, str) and got.startswith('skip: '):
        pytest.skip(got[len('skip: '):])
    return got


@pytest.mark.parametrize('name', list(REFUSED))
def test_refused_at_patch_size_above_one(outcomes, name):
    words = REFUSED[name][3]
    msg = _get(outcomes, (name, K))
    assert msg is not None, f'{name}: accepted at patch_size={K}'
    assert f'patch_size={K} (PLT) does not support' in msg, msg
    for word in words:
        assert word in msg, (word, msg)
    for other in _ALL_WORDS - set(words):  # names only what it refuses
        assert other not in msg, (other, msg)


@pytest.mark.parametrize('name', list(REFUSED))
def test_accepted_at_patch_size_one(outcomes, name):
    assert _get(outcomes, (name, 1)) is None


@pytest.mark.parametrize('name', list(ACCEPTED))
def test_neighbours_accepted_at_patch_size_above_one(outcomes, name):
    assert _get(outcomes, (name, K)) is None
