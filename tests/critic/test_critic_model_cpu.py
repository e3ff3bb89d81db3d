"""The ``llama3_2_critic`` mcore-bridge model for real on CPU (tests/harness): per-token values against plain
transformers ``LlamaForTokenClassification(num_labels=1)`` on the same weights (fp32), at 1 rank, TP=2 and PP=2
(head only on the last stage, replicated under TP); initialisation from a causal LM (head zeroed with a warning) and
from a critic (head loaded bit-exact); bad checkpoints (a non-zero score.bias included) refused before any weight is
loaded; the HF export in the installed transformers' format (a zero score.bias on 4.57.x) loads in transformers with
the same values."""
import os

import pytest
import torch

from harness.dist import spawn
from harness.tiny import make_tiny_critic, make_tiny_llama
from swift_plt.compat.transformers import critic_head_has_bias

B, S, VOCAB = 2, 12, 512


def _critic_run(hf_dir, input_ids, fill_head=None, grad_weights=None):
    """In each spawned rank: build the critic (weights not yet loaded), optionally fill the head with a sentinel,
    load ``hf_dir`` through the critic bridge, run the batch; report what this rank owns and saw. Without pipeline
    parallel and with ``grad_weights`` [B, S], also the gradients of sum(values * grad_weights)."""
    from megatron.core import parallel_state as ps

    from harness.model import build_mcore_model, mcore_logits
    from swift_plt.critic import model as critic_model
    from swift_plt.plugin.register import register_critic_mcore
    assert register_critic_mcore()
    tp, pp = ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size()
    models = build_mcore_model(hf_dir, mcore_model_type='llama3_2_critic', tp=tp, pp=pp, load_weights=False)
    model = models[0]
    if fill_head is not None and model.post_process:
        model.value_head.weight.data.fill_(fill_head)
    warnings = []
    orig_warning = critic_model.logger.warning
    critic_model.logger.warning = lambda msg, *a, **k: (warnings.append(str(msg)), orig_warning(msg, *a, **k))
    try:
        model.config.bridge.load_weights(models, hf_dir)
    except ValueError as e:
        return {'error': str(e), 'loaded_any': bool(model.decoder.layers[0].mlp.linear_fc2.weight.abs().sum())}
    finally:
        critic_model.logger.warning = orig_warning
    out = mcore_logits(models, input_ids)
    head = model.value_head
    grads = None
    if grad_weights is not None and pp == 1:
        position_ids = torch.arange(input_ids.shape[1]).unsqueeze(0).expand_as(input_ids)
        values = model(input_ids=input_ids, position_ids=position_ids, attention_mask=None)
        (values[..., 0].float() * grad_weights).sum().backward()
        grads = {'head': head.weight.grad.clone(), 'final_norm': model.decoder.final_layernorm.weight.grad.clone()}
    return {
        'grads': grads,
        'out': out,
        'values': None if out is None else critic_model.values(out),
        'post_process': model.post_process,
        'head': None if head is None else head.weight.detach().clone(),
        'has_output_layer': hasattr(model, 'output_layer'),
        'warnings': warnings,
        'task_type': model.config.task_type,
        'untied': not model.share_embeddings_and_output_weights,
    }


def _hf_values(critic_dir, input_ids, grad_weights):
    """transformers' LlamaForTokenClassification: values, its head, and the gradients of sum(values * weights)."""
    from transformers import AutoModelForTokenClassification
    model = AutoModelForTokenClassification.from_pretrained(critic_dir, dtype=torch.float32)
    model.eval()
    assert type(model).__name__ == 'LlamaForTokenClassification'
    assert_format_bias(model)
    logits = model(input_ids=input_ids).logits
    (logits[..., 0] * grad_weights).sum().backward()
    grads = {'head': model.score.weight.grad.clone(), 'final_norm': model.model.norm.weight.grad.clone()}
    return logits.detach(), model.score.weight.detach().clone(), grads


def assert_format_bias(model):
    """The HF critic's head bias: none on transformers 5.x, a zero one on 4.57.x (whose head always has one)."""
    if critic_head_has_bias():
        assert model.score.bias is not None and torch.equal(model.score.bias.detach(), torch.zeros(1))
    else:
        assert model.score.bias is None


@pytest.fixture(scope='module')
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp('critic')
    lm = make_tiny_llama(str(root / 'lm'), vocab_size=VOCAB)
    return lm, make_tiny_critic(str(root / 'critic'), lm)


@pytest.fixture(scope='module')
def input_ids():
    return torch.randint(4, VOCAB, (B, S), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope='module')
def grad_weights():
    return torch.randn(B, S, generator=torch.Generator().manual_seed(4))


@pytest.fixture(scope='module')
def hf_reference(dirs, input_ids, grad_weights):
    return _hf_values(dirs[1], input_ids, grad_weights)


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize('world, tp, pp', [(1, 1, 1), pytest.param(2, 2, 1, marks=pytest.mark.slow),
                                           pytest.param(2, 1, 2, marks=pytest.mark.slow)])
def test_values_match_hf_token_classification(dirs, input_ids, grad_weights, hf_reference, world, tp, pp):
    ref_out, ref_head, ref_grads = hf_reference
    results = spawn(_critic_run, world, dirs[1], input_ids, 7.0, grad_weights, tp=tp, pp=pp)
    for r in results:
        assert r['task_type'] == 'seq_cls' and r['untied']
        if r['post_process']:  # the head: loaded bit-exact (the sentinel 7.0 is gone), never re-initialised
            assert r['head'].shape == (1, 64) and torch.equal(r['head'], ref_head)
            assert r['out'].shape == (B, S, 1) and r['values'].shape == (B, S - 1)
            assert _rel(r['out'], ref_out) <= 1e-5, _rel(r['out'], ref_out)
            assert torch.equal(r['values'], r['out'][:, :-1, 0])
            assert not r['warnings']
            if pp == 1:  # TP: every rank sees every token, so the replicated head's gradient is the full one
                for name, ref in ref_grads.items():
                    assert _rel(r['grads'][name], ref) <= 1e-5, (name, _rel(r['grads'][name], ref))
        else:  # PP: only the last stage owns a head
            assert r['head'] is None and r['out'] is None and not r['has_output_layer']
    owners = [r for r in results if r['post_process']]
    assert len(owners) == (tp if pp == 1 else 1)  # TP: replicated on every rank of the last stage


def _trunk_values(lm_dir, head, input_ids):
    """Brute force: the causal LM's final hidden states (plain transformers) times the head."""
    from transformers import LlamaModel
    trunk = LlamaModel.from_pretrained(lm_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return trunk(input_ids=input_ids).last_hidden_state @ head.T


@pytest.fixture(scope='module')
def tied_lm(tmp_path_factory):
    return make_tiny_llama(str(tmp_path_factory.mktemp('tied')), vocab_size=VOCAB, tie_word_embeddings=True)


def test_init_from_causal_lm_zeroes_head_with_warning_and_refuses_bad_checkpoints(dirs, tied_lm, input_ids, tmp_path):
    lm, critic = dirs
    head = torch.randn(1, 64, generator=torch.Generator().manual_seed(5))
    bad = _bad_checkpoints(lm, critic, tmp_path)
    results = spawn(_causal_and_bad, 1, {'untied': lm, 'tied': tied_lm}, input_ids, head, bad)[0]
    for name, lm_dir in (('untied', lm), ('tied', tied_lm)):
        r = results[name]
        assert torch.equal(r['head'], torch.zeros(1, 64))  # the 7.0 sentinel was replaced by the documented zeros
        assert torch.equal(r['out'], torch.zeros(B, S, 1))
        assert len(r['warnings']) == 1 and 'no value head (score.weight)' in r['warnings'][0]
        assert 'initialised the value head with zeros' in r['warnings'][0]
        ref = _trunk_values(lm_dir, head, input_ids)  # the trunk was loaded: with a head set, values = hidden @ head
        assert _rel(r['out_with_head'], ref) <= 1e-5, (name, _rel(r['out_with_head'], ref))
    for name, message in BAD_MESSAGES.items():
        err = results[name]
        assert 'error' in err and message in err['error'], (name, err)
        assert not err['loaded_any'], name  # refused before any weight was loaded
    for name, message in UNSUPPORTED.items():
        assert message in results[name], (name, results[name])


UNSUPPORTED = {
    'mtp_num_layers': 'llama3_2_critic does not support: mtp_num_layers',
    'num_labels': 'llama3_2_critic does not support: num_labels=2 (a critic has one value per token)',
}


def _causal_and_bad(lms, input_ids, head, bad):
    from harness.model import build_mcore_model, mcore_logits
    out = {}
    for name, lm in lms.items():
        out[name] = _critic_run(lm, input_ids, 7.0)
        models = build_mcore_model(lm, mcore_model_type='llama3_2_critic')
        models[0].value_head.weight.data.copy_(head)
        out[name]['out_with_head'] = mcore_logits(models, input_ids)
    for name, path in bad.items():
        out[name] = _critic_run_zeroed(path, input_ids)
    for key, value in (('mtp_num_layers', 1), ('num_labels', 2)):
        try:
            build_mcore_model(lms['untied'], mcore_model_type='llama3_2_critic', extra_config={key: value},
                              load_weights=False)
            out[key] = 'built'
        except ValueError as e:
            out[key] = str(e)
    return out


def _critic_run_zeroed(path, input_ids):
    """Like _critic_run, with every weight zeroed first so that 'loaded_any' tells whether loading began."""
    from megatron.core import parallel_state as ps

    from harness.model import build_mcore_model
    models = build_mcore_model(path, mcore_model_type='llama3_2_critic', tp=ps.get_tensor_model_parallel_world_size(),
                               pp=ps.get_pipeline_model_parallel_world_size(), load_weights=False)
    for p in models[0].parameters():
        p.data.zero_()
    try:
        models[0].config.bridge.load_weights(models, path)
    except ValueError as e:
        return {'error': str(e), 'loaded_any': any(bool(p.abs().sum()) for p in models[0].parameters())}
    return {'loaded_any': True}


BAD_MESSAGES = {
    'head_2xH': 'score.weight [2, 64] (a value head is [1, hidden_size] = [1, 64]',
    'extra_key': 'unexpected keys: v_head.summary.weight',
    'missing_key': 'missing keys: model.layers.1.mlp.up_proj.weight',
    'verl_head': 'lm_head.weight [1, 64]',
    'nonzero_bias': 'has a non-zero value-head bias score.bias = [0.5]; the critic\'s value head has no bias',
}


def _bad_checkpoints(lm, critic, root):
    from safetensors.torch import load_file, save_file
    sd = load_file(os.path.join(critic, 'model.safetensors'))
    variants = {
        'nonzero_bias': {**sd, 'score.bias': torch.tensor([0.5])},
        'head_2xH': {**sd, 'score.weight': torch.randn(2, 64)},
        'extra_key': {**sd, 'v_head.summary.weight': torch.randn(1, 64)},
        'missing_key': {k: v for k, v in sd.items() if k != 'model.layers.1.mlp.up_proj.weight'},
        'verl_head': {**{k: v for k, v in sd.items() if k != 'score.weight'}, 'lm_head.weight': torch.randn(1, 64)},
    }
    out = {}
    for name, tensors in variants.items():
        d = root / name
        d.mkdir()
        save_file(tensors, str(d / 'model.safetensors'))
        for f in ('config.json', 'tokenizer.json', 'tokenizer_config.json'):
            (d / f).write_bytes((open(os.path.join(critic, f), 'rb')).read())
        out[name] = str(d)
    return out


def _load_patch_bindings():
    import swift.megatron.convert as convert
    import swift.megatron.trainers.base as trainer_base
    import swift.megatron.utils as utils
    from swift.megatron.utils import megatron_lm_utils
    patched = megatron_lm_utils.load_mcore_checkpoint
    return (getattr(patched, '_swift_plt', False), patched.__wrapped__.__module__, utils.load_mcore_checkpoint is patched,
            trainer_base.load_mcore_checkpoint is patched, convert.load_mcore_checkpoint is patched)


def test_load_patch_is_what_ms_swift_calls():
    """The critic's mcore-checkpoint load patch is the function the trainer and `swift export` call (the wrapped
    original is upstream's; other models pass straight through to it, see test_critic_cli_cpu)."""
    (out, ) = spawn(_load_patch_bindings, 1)
    assert out == (True, 'swift.megatron.utils.megatron_lm_utils', True, True, True)


def _hf_side(lm, critic):
    from swift.model import get_model_processor

    from swift_plt.plugin.register import register_critic_swift
    register_critic_swift()
    out = {}
    for name, d in (('lm', lm), ('critic', critic)):
        model, _ = get_model_processor(d, model_type='llama3_2_critic', torch_dtype=torch.float32)
        ids = torch.tensor([[5, 6, 7]])
        bias = model.score.bias
        out[name] = (type(model).__name__, model.score.weight.detach().clone(), model.config.num_labels,
                     model(input_ids=ids, labels=ids).logits.shape, None if bias is None else bias.detach().clone())
    return out


def test_hf_side_loader(dirs):
    """ms-swift's HF-side model for llama3_2_critic: LlamaForTokenClassification(num_labels=1); from a causal LM the
    head is zeros like on the Megatron side (not transformers' random init); token-id labels are ignored."""
    from safetensors.torch import load_file
    (out, ) = spawn(_hf_side, 1, *dirs)
    ref = load_file(os.path.join(dirs[1], 'model.safetensors'))['score.weight']
    assert out['lm'][0] == out['critic'][0] == 'LlamaForTokenClassification'
    assert torch.equal(out['lm'][1], torch.zeros(1, 64)) and torch.equal(out['critic'][1], ref)
    assert out['lm'][2:4] == out['critic'][2:4] == (1, (1, 3, 1))
    for name in ('lm', 'critic'):  # 4.57.x: the bias is zero, also where the dir has none (not transformers' init)
        assert out[name][4] is None if not critic_head_has_bias() else torch.equal(out[name][4], torch.zeros(1))


def _export_run(critic_dir, input_ids, out_dir):
    """Load the critic, compute its values, write it with the bridge's HF export (as `swift export --to_hf`)."""
    from harness.model import build_mcore_model, mcore_logits
    from swift_plt.plugin.register import register_critic_mcore
    assert register_critic_mcore()
    from megatron.core import parallel_state as ps
    models = build_mcore_model(critic_dir, mcore_model_type='llama3_2_critic',
                               tp=ps.get_tensor_model_parallel_world_size(),
                               pp=ps.get_pipeline_model_parallel_world_size())
    out = mcore_logits(models, input_ids)
    models[0].config.bridge.save_weights(models, out_dir)
    if torch.distributed.get_rank() == 0:
        models[0].config.hf_config.save_pretrained(out_dir)
    return out


@pytest.mark.parametrize('world, tp, pp', [(1, 1, 1), pytest.param(2, 1, 2, marks=pytest.mark.slow)])
def test_export_loads_in_transformers_with_same_values(dirs, input_ids, tmp_path, world, tp, pp):
    """Megatron -> HF export in the installed transformers' format: plain LlamaForTokenClassification loads it
    with no missing / unexpected key (4.57.x: the zero score.bias is in the file) and gives the Megatron values."""
    from safetensors.torch import load_file
    from transformers import AutoModelForTokenClassification
    out_dir = str(tmp_path / 'hf')
    results = spawn(_export_run, world, dirs[1], input_ids, out_dir, tp=tp, pp=pp)
    mcore_out = results[-1]  # the last stage holds the values
    got = load_file(os.path.join(out_dir, 'model.safetensors'))
    ref = load_file(os.path.join(dirs[1], 'model.safetensors'))
    assert set(got) == set(ref) and all(torch.equal(got[k], ref[k]) for k in ref)
    assert ('score.bias' in got) is critic_head_has_bias()
    model, info = AutoModelForTokenClassification.from_pretrained(out_dir, dtype=torch.float32,
                                                                  output_loading_info=True)
    assert not any(info.values()), info
    assert model.config.token_classification_bias is critic_head_has_bias()
    assert_format_bias(model)
    with torch.no_grad():
        hf_out = model.eval()(input_ids=input_ids).logits
    assert _rel(hf_out, mcore_out) <= 1e-5, _rel(hf_out, mcore_out)


def _bias_both_sides(dirs, input_ids):
    """A critic dir with a zero / a non-zero score.bias through the Megatron bridge and ms-swift's HF-side loader."""
    from swift.model import get_model_processor

    from swift_plt.plugin.register import register_critic_swift
    register_critic_swift()
    out = {}
    for name, d in dirs.items():
        mcore = _critic_run(d, input_ids) if name == 'zero' else _critic_run_zeroed(d, input_ids)
        try:
            model, _ = get_model_processor(d, model_type='llama3_2_critic', torch_dtype=torch.float32)
            with torch.no_grad():
                hf = model.eval()(input_ids=input_ids).logits
        except ValueError as e:
            hf = str(e)
        out[name] = (mcore, hf)
    return out


def test_head_bias_zero_loads_nonzero_refused_on_both_sides(dirs, input_ids, hf_reference, tmp_path):
    """score.bias exactly zero (the 4.57.x format, on any transformers): loads, same values as the reference;
    non-zero: refused by the Megatron bridge (before any weight) and by the HF-side loader, with the message."""
    from safetensors.torch import load_file, save_file
    sd = {k: v for k, v in load_file(os.path.join(dirs[1], 'model.safetensors')).items() if k != 'score.bias'}
    variants = {}
    for name, bias in (('zero', 0.0), ('nonzero', -0.125)):
        d = tmp_path / name
        d.mkdir()
        save_file({**sd, 'score.bias': torch.tensor([bias])}, str(d / 'model.safetensors'))
        for f in ('config.json', 'tokenizer.json', 'tokenizer_config.json'):
            (d / f).write_bytes(open(os.path.join(dirs[1], f), 'rb').read())
        variants[name] = str(d)
    (out, ) = spawn(_bias_both_sides, 1, variants, input_ids)
    assert _rel(out['zero'][0]['out'], hf_reference[0]) <= 1e-5, _rel(out['zero'][0]['out'], hf_reference[0])
    assert _rel(out['zero'][1], hf_reference[0]) <= 1e-6, _rel(out['zero'][1], hf_reference[0])
    message = 'has a non-zero value-head bias score.bias = [-0.125]; the critic\'s value head has no bias'
    assert message in out['nonzero'][0].get('error', 'loaded'), out['nonzero'][0]
    assert not out['nonzero'][0]['loaded_any']
    assert isinstance(out['nonzero'][1], str) and message in out['nonzero'][1], out['nonzero'][1]
