"""transformers compatibility (swift_plt/compat/transformers.py), on whichever transformers this venv has (CI runs the suite on
5.19 and these tests again on 4.57.6): the supported range is checked at activation; ``hf_rope_guard`` makes HF Llama
builds correct after mcore-bridge's real ``get_rope_inv_freq`` ran in the process (end to end, `swift export --to_hf
--test_convert_precision` of ``llama3_2_plt``, an HF model loaded after the mcore one: the round trip of
tests/plugin/test_cli_cpu.py); examples import nothing from tests/."""
import glob
import os
import re

import pytest
import torch

from harness.dist import spawn
from harness.tiny import make_tiny_llama
from swift_plt.compat import transformers as hf_compat, versions

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')


# ----------------------------------------------------------------------------------------------- the range
@pytest.mark.parametrize('version, ok', [('4.56.2', False), ('4.57.0', True), ('4.57.6', True), ('5.0.0', True),
                                         ('5.12.1', True), ('5.19.0', True), ('5.19.9.dev0', True),
                                         ('5.20.0rc1', False), ('5.20.0', False), ('6.0.0', False)])
def test_supported_range_at_activation(monkeypatch, version, ok):
    installed = {'ms-swift': '4.6.0', 'mcore-bridge': '1.6.5', 'megatron-core': '0.16.1', 'transformers': version}
    monkeypatch.setattr(versions, 'installed_version', installed.get)
    if ok:
        versions.check_versions(('ms-swift', 'mcore-bridge', 'megatron-core'))
    else:
        with pytest.raises(RuntimeError, match=rf'transformers=={re.escape(version)} \(supported: 4.57.x or 5.x '
                           r'below 5.20\).*"transformers>=4.57,<5.20".*SWIFT_PLT_DISABLE=1'):
            versions.check_versions()


def test_installed_transformers_is_supported():
    assert versions.refusal('transformers', '.'.join(map(str, hf_compat.transformers_version()))) is None


# ----------------------------------------------------------------------------------------------- the critic on 4.x
@pytest.mark.parametrize('bias_free', [True, False])
def test_critic_hf_format_follows_the_head_probe(monkeypatch, bias_free):
    """The critic's HF format follows transformers: bias-free on 5.x (token_classification_bias=False), a zero
    score.bias on 4.57.x (token_classification_bias=True); critic runs start on both (nothing refused)."""
    from types import SimpleNamespace

    from transformers import LlamaConfig

    from swift_plt.critic import CRITIC_MODEL_TYPE
    from swift_plt.critic.arguments import resolve_critic_args
    from swift_plt.critic.convert import convert_state_dict
    from swift_plt.critic.keys import critic_hf_config, critic_hf_config_dict, llama_trunk_shapes
    monkeypatch.setattr(hf_compat, 'has_bias_free_token_classification', lambda: bias_free)
    assert hf_compat.critic_head_has_bias() is (not bias_free)
    config = dict(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=1,
                  num_key_value_heads=1)
    assert critic_hf_config(LlamaConfig(**config)).token_classification_bias is (not bias_free)
    assert critic_hf_config_dict(config)['token_classification_bias'] is (not bias_free)
    trunk = {k: torch.zeros(v) for k, v in llama_trunk_shapes(config).items()}
    out, _ = convert_state_dict({**trunk, 'value_head.weight': torch.ones(1, 8)}, 'openrlhf', config)
    assert set(out) - set(trunk) == ({'score.weight'} if bias_free else {'score.weight', 'score.bias'})
    assert bias_free or torch.equal(out['score.bias'], torch.zeros(1))
    args = SimpleNamespace(model_type=CRITIC_MODEL_TYPE, value_clip_range=None)
    resolve_critic_args(args)  # not refused on either
    assert args.strict is True


def test_bias_free_head_probe():
    """The probe behind the critic's HF format, on this venv's transformers (CI: 5.19 yes, 4.57.6 no)."""
    from transformers import LlamaConfig, LlamaForTokenClassification
    config = LlamaConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=1,
                         num_key_value_heads=1, num_labels=1, token_classification_bias=False)
    with hf_compat.hf_rope_guard():
        keys = set(LlamaForTokenClassification(config).state_dict())
    assert hf_compat.has_bias_free_token_classification() == ('score.bias' not in keys)
    if hf_compat.transformers_version()[:2] in {(4, 57), (5, 19)}:  # the two versions CI runs
        assert hf_compat.has_bias_free_token_classification() == hf_compat.is_transformers_5()


# ----------------------------------------------------------------------------------------------- the RoPE guard
def _rope_hazard_worker(hf_dir, input_ids):
    """In a fresh process: logits of the HF Llama before mcore-bridge ran, then after its real get_rope_inv_freq,
    without and with hf_rope_guard; the ROPE_INIT_FUNCTIONS['default'] entry at each point."""
    from types import SimpleNamespace

    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from harness import install
    from swift_plt.compat.transformers import hf_rope_guard, own_default_rope_fn

    def logits():
        model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation='eager')
        with torch.no_grad():
            return model.eval()(input_ids=input_ids).logits

    def entry():
        fn = ROPE_INIT_FUNCTIONS.get('default')
        return None if fn is None else f'{fn.__module__}.{fn.__name__}'

    out = {'transformers': transformers.__version__, 'own': entry() if own_default_rope_fn() else None}
    out['clean'] = logits()
    install()
    from mcore_bridge.model.rope import get_rope_inv_freq  # what every mcore model build calls
    mcore_config = SimpleNamespace(multi_latent_attention=False, partial_rotary_factor=None, kv_channels=16,
                                   rope_scaling=None, rotary_base=10000.0, max_position_embeddings=512,
                                   hidden_size=64, num_attention_heads=4, original_max_position_embeddings=None)
    out['mcore_inv_freq'] = get_rope_inv_freq(mcore_config)[0]
    out['after_mcore'] = entry()
    try:
        logits()
        out['unguarded'] = 'ok'
    except Exception as e:  # the hazard (transformers 5.x)
        out['unguarded'] = f'{type(e).__name__}: {e}'
    with hf_rope_guard():
        out['inside'] = entry()
        out['guarded'] = logits()
    out['restored'] = entry()
    return out


@pytest.mark.slow
def test_rope_guard_after_mcore_bridge(tmp_path):
    """After mcore-bridge's real get_rope_inv_freq: inside the guard 'default' is transformers' own (none on 5.x,
    transformers' function on 4.x) and the HF Llama gives the logits of a clean process bit for bit (same code run
    twice); afterwards mcore-bridge's entry is back. On 5.x the unguarded build fails (the hazard the guard is for,
    so the test exercises it), on 4.x it works."""
    hf_dir = make_tiny_llama(str(tmp_path / 'hf'))
    ids = torch.randint(4, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    (out, ) = spawn(_rope_hazard_worker, 1, hf_dir, ids)
    print({k: v for k, v in out.items() if not torch.is_tensor(v)})
    assert out['transformers'].startswith('5.') == hf_compat.is_transformers_5()
    theta, dim = 10000.0, 16
    ref_inv_freq = 1.0 / theta**(torch.arange(0, dim, 2, dtype=torch.float32) / dim)  # the RoPE formula, by hand
    torch.testing.assert_close(out['mcore_inv_freq'], ref_inv_freq, rtol=0, atol=0)
    assert torch.equal(out['guarded'], out['clean'])
    if hf_compat.is_transformers_5():
        assert out['own'] is None and out['inside'] is None
        assert out['after_mcore'] == out['restored'] == 'mcore_bridge.model.rope._compute_default_rope_parameters'
        assert 'rope_theta' in out['unguarded'], out['unguarded']
    else:
        own = 'transformers.modeling_rope_utils._compute_default_rope_parameters'
        assert out['own'] == out['after_mcore'] == out['inside'] == out['restored'] == own
        assert out['unguarded'] == 'ok'


def test_rope_guard_restores_on_error():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    def foreign(*a, **k):
        raise AssertionError('not transformers')

    saved = ROPE_INIT_FUNCTIONS.get('default')
    ROPE_INIT_FUNCTIONS['default'] = foreign
    try:
        with pytest.raises(KeyError):
            with hf_compat.hf_rope_guard():
                assert ROPE_INIT_FUNCTIONS.get('default') is hf_compat.own_default_rope_fn()
                raise KeyError('x')
        assert ROPE_INIT_FUNCTIONS['default'] is foreign
    finally:
        if saved is None:
            ROPE_INIT_FUNCTIONS.pop('default', None)
        else:
            ROPE_INIT_FUNCTIONS['default'] = saved


def test_rope_guard_fails_loudly_if_transformers_moved(monkeypatch):
    """Review #8: the touch is guarded (swift_plt/compat/transformers_rope.py): if transformers moved the table
    or (4.x) its default function, or changed that function's parameters, the guard raises with the verified
    versions and what to do (not an ImportError / AttributeError at model load), and the table is left alone."""
    from transformers import modeling_rope_utils

    from swift_plt.compat import transformers_rope as touch
    table = modeling_rope_utils.ROPE_INIT_FUNCTIONS
    before = dict(table)

    def own(config=None, device=None, seq_len=None):
        pass

    monkeypatch.setattr(hf_compat, 'is_transformers_5', lambda version=None: False)  # the 4.x path, on any major
    monkeypatch.setattr(modeling_rope_utils, '_compute_default_rope_parameters', own, raising=False)
    with hf_compat.hf_rope_guard():
        assert table['default'] is own and hf_compat.own_default_rope_fn() is own
    assert table == before
    monkeypatch.setattr(modeling_rope_utils, '_compute_default_rope_parameters', lambda cfg, dev: None)
    with pytest.raises(RuntimeError, match=r'upstream changed: .*verified against transformers 4.57.6 and 5.19'):
        with hf_compat.hf_rope_guard():
            pass
    monkeypatch.delattr(modeling_rope_utils, '_compute_default_rope_parameters')
    with pytest.raises(RuntimeError, match=r'upstream moved: `_compute_default_rope_parameters` not found.*'
                       r'SWIFT_PLT_DISABLE=1'):
        with hf_compat.hf_rope_guard():
            pass
    monkeypatch.delattr(modeling_rope_utils, 'ROPE_INIT_FUNCTIONS')
    for transformers_5 in (False, True):
        monkeypatch.setattr(hf_compat, 'is_transformers_5', lambda version=None, v=transformers_5: v)
        with pytest.raises(RuntimeError, match=r'upstream moved: `ROPE_INIT_FUNCTIONS` not found.*transformers '
                           r'4.57.6 and 5.19'):
            with hf_compat.hf_rope_guard():
                pass
    monkeypatch.setattr(modeling_rope_utils, 'ROPE_INIT_FUNCTIONS', tuple(before.items()), raising=False)
    with pytest.raises(RuntimeError, match=r'ROPE_INIT_FUNCTIONS is a tuple, not a dict'):
        with touch.own_default_rope(True):
            pass
    monkeypatch.undo()
    assert modeling_rope_utils.ROPE_INIT_FUNCTIONS is table and table == before


# ----------------------------------------------------------------------------------------------- examples
def test_examples_import_nothing_from_tests():
    """Examples are product: they use the installed package (swift_plt.tools.tiny), never tests/ (no sys.path edits)."""
    offenders = []
    for path in glob.glob(os.path.join(REPO, 'examples', '*')):
        with open(path, encoding='utf-8') as f:
            text = f.read()
        if re.search(r'\bharness\b|tests/|sys\.path', text):
            offenders.append(os.path.basename(path))
    assert offenders == []
