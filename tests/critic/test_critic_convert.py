"""Critic checkpoints without Megatron (fast): key/shape checks (swift_plt.critic.keys), the value-head bias rule
(zero accepted, non-zero refused), the TRL / OpenRLHF / verl converters (swift_plt.critic.convert) against plain
transformers LlamaForTokenClassification in the installed version's format (a zero score.bias on 4.57.x), and the
refusal of patch-level training for the critic."""
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from harness.tiny import make_tiny_llama
from swift_plt.compat.transformers import critic_head_has_bias
from swift_plt.critic.convert import convert, main
from swift_plt.critic.keys import check_critic_keys, check_head_bias, llama_trunk_shapes, read_head_bias

H, VOCAB = 64, 512


@pytest.fixture(scope='module')
def lm(tmp_path_factory):
    d = make_tiny_llama(str(tmp_path_factory.mktemp('lm')), vocab_size=VOCAB)
    with open(os.path.join(d, 'config.json')) as f:
        return d, json.load(f), load_file(os.path.join(d, 'model.safetensors'))


def _shapes(sd):
    return {k: tuple(v.shape) for k, v in sd.items()}


def test_trunk_shapes_are_transformers_llama(lm):
    _, config, sd = lm
    assert llama_trunk_shapes(config) == {k: v for k, v in _shapes(sd).items() if k != 'lm_head.weight'}


def test_check_keys_classifies_causal_lm_and_critic(lm):
    _, config, sd = lm
    trunk = {k: v for k, v in _shapes(sd).items() if k != 'lm_head.weight'}
    assert check_critic_keys(_shapes(sd), config) == 'missing'  # causal LM: lm_head expected and dropped
    assert check_critic_keys(trunk, config) == 'missing'  # tied embeddings: no lm_head at all
    assert check_critic_keys({**trunk, 'score.weight': (1, H)}, config) == 'loaded'
    assert check_critic_keys({**trunk, 'score.weight': (1, H), 'score.bias': (1, )}, config) == 'loaded'  # 4.57.x
    assert check_critic_keys({**trunk, 'model.layers.0.self_attn.rotary_emb.inv_freq': (8, )}, config) == 'missing'


@pytest.mark.parametrize('change, message', [
    (lambda s: s.update({'score.weight': (2, H)}), 'score.weight [2, 64] (a value head is [1, hidden_size]'),
    (lambda s: s.update({'score.weight': (1, 32)}), 'score.weight [1, 32]'),
    (lambda s: s.update({'score.weight': (1, H), 'score.bias': (2, )}), "score.bias [2] (a value head's bias is [1]"),
    (lambda s: s.update({'score.bias': (1, )}), "score.bias [1] (a value head's bias is [1], beside score.weight"),
    (lambda s: s.update({'lm_head.weight': (1, H)}), 'lm_head.weight [1, 64]'),
    (lambda s: s.update({'v_head.summary.weight': (1, H), 'model.layers.2.mlp.up_proj.weight': (128, H)}),
     'unexpected keys: model.layers.2.mlp.up_proj.weight, v_head.summary.weight'),
    (lambda s: s.pop('model.norm.weight'), 'missing keys: model.norm.weight'),
    (lambda s: s.update({'model.embed_tokens.weight': (VOCAB, 32)}), 'model.embed_tokens.weight [512, 32] (expected'
     ' [512, 64])'),
])
def test_check_keys_errors_list_the_keys(lm, change, message):
    _, config, sd = lm
    shapes = _shapes(sd)
    change(shapes)
    with pytest.raises(ValueError) as e:
        check_critic_keys(shapes, config)
    assert message in str(e.value) and 'swift_plt.critic.convert' in str(e.value)


def _write(d, sd, config):
    os.makedirs(d)
    save_file(sd, os.path.join(d, 'model.safetensors'))
    with open(os.path.join(d, 'config.json'), 'w') as f:
        json.dump(config, f)
    return str(d)


def _source(fmt, lm, head, bias=None):
    """A critic as `fmt` saves it, on the tiny Llama trunk."""
    _, config, sd = lm
    trunk = {k: v for k, v in sd.items() if k != 'lm_head.weight'}
    config = dict(config)
    if fmt == 'trl':
        return {**sd, 'v_head.summary.weight': head, 'v_head.summary.bias': bias}, config
    if fmt == 'openrlhf':
        return {**trunk, 'value_head.weight': head}, config
    return {**trunk, 'lm_head.weight': head}, config


def test_head_bias_zero_accepted_nonzero_refused(tmp_path):
    """A score.bias is accepted only when exactly zero (the critic's head has no bias to hold it)."""
    for bias in (None, torch.zeros(1), torch.tensor([-0.0]), torch.zeros(1, dtype=torch.bfloat16)):
        check_head_bias(bias, 'ckpt')
    for bias, shown in ((torch.tensor([0.5]), '0.5'), (torch.tensor([-1e-30]), '-1e-30')):
        with pytest.raises(ValueError) as e:
            check_head_bias(bias, 'ckpt')
        assert f'ckpt has a non-zero value-head bias score.bias = [{shown}]' in str(e.value)
        assert 'cannot represent it' in str(e.value) and '--from verl SRC DST --drop_bias' in str(e.value)
    save_file({'score.weight': torch.ones(1, H), 'score.bias': torch.tensor([0.25])}, str(tmp_path / 'a.safetensors'))
    assert torch.equal(read_head_bias(str(tmp_path)), torch.tensor([0.25]))
    save_file({'score.weight': torch.ones(1, H)}, str(tmp_path / 'a.safetensors'))
    assert read_head_bias(str(tmp_path)) is None


def _values(model_dir, input_ids):
    from transformers import AutoModelForTokenClassification
    model, info = AutoModelForTokenClassification.from_pretrained(model_dir, dtype=torch.float32,
                                                                  output_loading_info=True)
    assert type(model).__name__ == 'LlamaForTokenClassification'
    if critic_head_has_bias():  # transformers 4.57.x: the format's zero bias, loaded from the file
        assert torch.equal(model.score.bias, torch.zeros(1))
    else:
        assert model.score.bias is None
    assert not any(info.values()), info  # no missing / unexpected / mismatched key
    with torch.no_grad():
        return model.eval()(input_ids=input_ids).logits


def _reference_values(lm, head, bias, input_ids):
    """Brute force: the causal LM's final hidden states times the head, plus the bias (TRL's ValueHead)."""
    from transformers import LlamaModel
    trunk = LlamaModel.from_pretrained(lm[0], dtype=torch.float32).eval()
    with torch.no_grad():
        return trunk(input_ids=input_ids).last_hidden_state @ head.T + bias


@pytest.mark.parametrize('fmt', ['trl', 'openrlhf', 'verl'])
def test_convert_to_llama_token_classification(lm, tmp_path, fmt):
    g = torch.Generator().manual_seed(1)
    head = torch.randn(1, H, generator=g)
    sd, config = _source(fmt, lm, head, torch.zeros(1))
    out = tmp_path / 'critic'
    assert convert(fmt, _write(tmp_path / 'src', sd, config), str(out)) is None
    got = load_file(str(out / 'model.safetensors'))
    trunk = {k: v for k, v in lm[2].items() if k != 'lm_head.weight'}
    bias = {'score.bias'} if critic_head_has_bias() else set()  # the installed transformers' format
    assert set(got) == set(trunk) | {'score.weight'} | bias
    assert all(torch.equal(got[k], v) for k, v in trunk.items()) and torch.equal(got['score.weight'], head)
    assert not bias or torch.equal(got['score.bias'], torch.zeros(1))
    saved = json.load(open(out / 'config.json'))
    assert saved['architectures'] == ['LlamaForTokenClassification'] and saved['id2label'] == {'0': 'LABEL_0'}
    assert saved['token_classification_bias'] is critic_head_has_bias()
    ids = torch.randint(4, VOCAB, (2, 10), generator=g)
    ref = _reference_values(lm, head, 0.0, ids)
    assert float((_values(str(out), ids) - ref).abs().max() / ref.abs().max()) <= 1e-6


def test_openrlhf_normalize_reward_scale_is_folded(lm, tmp_path):
    head = torch.randn(1, H, generator=torch.Generator().manual_seed(2))
    sd, config = _source('openrlhf', lm, head)
    config.update(normalize_reward=True, mean=0.0, std=4.0)
    convert('openrlhf', _write(tmp_path / 'src', sd, config), str(tmp_path / 'out'))
    torch.testing.assert_close(load_file(str(tmp_path / 'out' / 'model.safetensors'))['score.weight'], head / 4.0)
    assert 'normalize_reward' not in json.load(open(tmp_path / 'out' / 'config.json'))
    config.update(mean=1.0)
    with pytest.raises(ValueError, match=r'non-zero bias \(-0.25\)'):
        convert('openrlhf', _write(tmp_path / 'src2', sd, config), str(tmp_path / 'out2'))


def test_trl_nonzero_bias_refused_unless_dropped(lm, tmp_path):
    head = torch.randn(1, H, generator=torch.Generator().manual_seed(3))
    src = _write(tmp_path / 'src', *_source('trl', lm, head, torch.tensor([0.5])))
    with pytest.raises(ValueError, match=r'non-zero bias \(0.5\).*--drop_bias'):
        convert('trl', src, str(tmp_path / 'out'))
    assert not os.path.exists(tmp_path / 'out')  # nothing written
    warning = convert('trl', src, str(tmp_path / 'out'), drop_bias=True)
    assert warning == 'dropped value-head bias 0.5: every value shifts by -0.5'


def test_verl_token_classification_critic_bias(lm, tmp_path):
    """verl's score.weight + score.bias: a zero bias converts exactly, a non-zero one is refused unless dropped."""
    _, config, sd = lm
    trunk = {k: v for k, v in sd.items() if k != 'lm_head.weight'}
    head = torch.randn(1, H, generator=torch.Generator().manual_seed(6))
    for name, bias in (('zero', 0.0), ('half', 0.5)):
        src = _write(tmp_path / f'src_{name}', {**trunk, 'score.weight': head, 'score.bias': torch.tensor([bias])},
                     config)
        if bias:
            with pytest.raises(ValueError, match=r'non-zero bias \(0.5\).*--drop_bias'):
                convert('verl', src, str(tmp_path / f'out_{name}'))
            assert convert('verl', src, str(tmp_path / f'out_{name}'), drop_bias=True).startswith('dropped')
        else:
            assert convert('verl', src, str(tmp_path / f'out_{name}')) is None
        got = load_file(str(tmp_path / f'out_{name}' / 'model.safetensors'))
        assert torch.equal(got['score.weight'], head)
        assert torch.equal(got['score.bias'], torch.zeros(1)) if critic_head_has_bias() else 'score.bias' not in got


def test_convert_refuses_wrong_head_shape_and_format(lm, tmp_path, capsys):
    src = _write(tmp_path / 'src', *_source('verl', lm, torch.zeros(2, H)))
    assert main(['--from', 'verl', src, str(tmp_path / 'out')]) == 2
    assert 'lm_head.weight has shape [2, 64]; a value head is [1, hidden_size] = [1, 64]' in capsys.readouterr().err
    assert main(['--from', 'openrlhf', src, str(tmp_path / 'out')]) == 2
    assert "expected exactly one value head among ['value_head.weight'], found none" in capsys.readouterr().err


def test_cli_entry_point(lm, tmp_path):
    src = _write(tmp_path / 'src', *_source('openrlhf', lm, torch.ones(1, H)))
    proc = subprocess.run([sys.executable, '-m', 'swift_plt.critic.convert', '--from', 'openrlhf', src,
                           str(tmp_path / 'out')], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert 'wrote' in proc.stdout and os.path.exists(tmp_path / 'out' / 'model.safetensors')


def test_classify_mcore_checkpoint_head():
    from swift_plt.critic.keys import classify_mcore_checkpoint
    assert classify_mcore_checkpoint((1, H), H, 'ckpt') == 'critic'
    assert classify_mcore_checkpoint((VOCAB, H), H, 'ckpt') == 'causal_lm'
    assert classify_mcore_checkpoint(None, H, 'ckpt') == 'causal_lm'  # tied embeddings: no output_layer
    for shape in ((1, 32), (2, 32), (H, )):
        with pytest.raises(ValueError, match=rf'ckpt has output_layer.weight \[.*\]; a critic head is \[1, '
                           rf'hidden_size\] = \[1, {H}\]'):
            classify_mcore_checkpoint(shape, H, 'ckpt')
