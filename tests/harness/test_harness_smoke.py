"""Smoke tests of the CPU harness (tests/harness): the stack it patches must still compute the right thing.

(a) mcore-bridge's GPTModel built from a tiny HF Llama gives the HF logits at TP=1, TP=2 and PP=2 (real gloo ranks);
(b) the stand-ins are installed in a fresh process and leave nothing behind; spawn's ranks and the CLI environment.
The stock ``megatron pt`` CLI on the harness (3 steps, the loss falls; TP=2 and PP=2 equal 1 rank): the stock run of
tests/plugin/test_cli_cpu.py's K=1 test and its TP2 / PP2 test.
Every model is built in a fresh process (``harness.spawn``): the pytest process itself never calls ``install()`` or
imports mcore-bridge, so these tests do not change global state for other test modules.
"""
import pytest
import torch

from harness import make_tiny_llama, spawn

# fp32 on CPU with one thread: measured max |mcore - HF| = 0 (TP=1, PP=2) and 7.5e-7 (TP=2) for logits of size ~1.
LOGITS_TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope='module')
def tiny_llama(tmp_path_factory):
    return make_tiny_llama(str(tmp_path_factory.mktemp('tiny_llama')))


@pytest.fixture(scope='module')
def tiny_llama_tied(tmp_path_factory):
    return make_tiny_llama(str(tmp_path_factory.mktemp('tiny_llama_tied')), tie_word_embeddings=True, seed=1)


@pytest.fixture(scope='module')
def input_ids():
    return torch.randint(4, 512, (2, 24), generator=torch.Generator().manual_seed(0))


# ------------------------------------------------------------------------------------------------ workers
# Run inside spawned ranks (module level so that they pickle); they import upstream code only after install().


def _check_install():
    import sys

    import megatron.core.fp8_utils as fp8_utils
    import megatron.core.models.gpt.experimental_attention_variant_module_specs as eav_specs

    import mcore_bridge  # noqa: F401
    from mcore_bridge.model.modules import dsa_indexer

    from harness._imports import StandInModule
    from swift.megatron import megatron_pretrain_main  # noqa: F401
    out = {
        # stand-in modules only: a real triton (the test extra installs it for the fused-loss tests) may be imported
        # for real by code that is not an allowed importer, and stays like any module
        'standins_left': sorted(n for n, m in list(sys.modules.items()) if isinstance(m, StandInModule)),
        'megatron_have_te': (fp8_utils.HAVE_TE, eav_specs.HAVE_TE),
        'cuda_tensor_device': str(torch.zeros(2, device='cuda').device),
    }
    try:
        dsa_indexer.transformer_engine.pytorch.fp8_model_init
    except AttributeError as e:
        out['standin_error'] = str(e)
    try:
        import transformer_engine  # noqa: F401  (this module is not an allowed importer)
        out['te_importable'] = True
    except ImportError:
        out['te_importable'] = False
    return out


def _plugin_like_model(hf_dir):
    """A model type registered the way a plugin does it: ModelLoader subclass + ModelConfig subclass with a field."""
    from dataclasses import dataclass

    from harness import build_mcore_model
    from mcore_bridge import ModelConfig
    from mcore_bridge.model.register import ModelLoader, ModelMeta, register_model

    @dataclass
    class ToyConfig(ModelConfig):
        toy_field: int = 1

    class ToyLoader(ModelLoader):
        pass

    register_model(ModelMeta('toy_gpt', ['toy_gpt'], loader=ToyLoader, config_cls=ToyConfig), exist_ok=True)
    model = build_mcore_model(hf_dir, mcore_model_type='toy_gpt', extra_config={'toy_field': 7})[0]
    layer = model.decoder.layers[0]
    return {
        'config_cls': type(model.config).__name__,
        'toy_field': model.config.toy_field,
        'norm': type(layer.input_layernorm).__name__,
        'linear_qkv': type(layer.self_attention.linear_qkv).__name__,
    }


def _install_worker(hf_dir):
    return _check_install(), _plugin_like_model(hf_dir)


def _logits_worker(hf_dir, input_ids, tp, pp):
    from harness import build_mcore_model, hf_logits, mcore_logits
    ref = hf_logits(hf_dir, input_ids)
    models = build_mcore_model(hf_dir, tp=tp, pp=pp)
    out = mcore_logits(models, input_ids)
    return None if out is None else (out, ref)


# ------------------------------------------------------------------------------------------------ tests


def test_install_in_fresh_process(tiny_llama):
    checks, plugin = spawn(_install_worker, 1, tiny_llama, fresh=True)[0]
    assert checks['standins_left'] == []  # stand-ins never stay in sys.modules
    assert checks['megatron_have_te'] == (False, False)  # megatron-core still sees TE as absent
    assert checks['te_importable'] is False
    assert 'stand-in' in checks['standin_error']  # using TE fails loudly
    assert checks['cuda_tensor_device'] == 'cpu'
    # ModelLoader subclasses get the local spec (class-level patch); config_cls + extra_config are honoured
    assert plugin == {'config_cls': 'ToyConfig', 'toy_field': 7, 'norm': 'RMSNorm', 'linear_qkv':
                      'ColumnParallelLinear'}


def _preloaded():
    import sys
    return 'mcore_bridge' in sys.modules and 'swift.megatron' in sys.modules


def test_ranks_fork_from_the_preloaded_server_unless_fresh():
    """spawn's ranks start with the stack imported (forked from harness._preload's server, any cwd); fresh=True
    starts a new interpreter."""
    assert spawn(_preloaded, 2) == [True, True]
    assert spawn(_preloaded, 1, fresh=True) == [False]


def test_spawn_starts_ranks_again_only_when_they_could_not_join(monkeypatch):
    from harness import dist
    calls = []

    def failing(error):
        def _spawn(*args, **kwargs):
            calls.append(error)
            if len(calls) == 1:
                raise RuntimeError(f'rank 2 failed:\nTraceback (most recent call last):\n  ...\n{error}\n')
            return ['ok']
        return _spawn

    monkeypatch.setattr(dist, '_spawn', failing('torch.distributed.DistNetworkError: Broken pipe'))
    assert dist.spawn(None, 2) == ['ok'] and len(calls) == 2
    calls.clear()
    monkeypatch.setattr(dist, '_spawn', failing('AssertionError: loss differs'))
    with pytest.raises(RuntimeError, match='loss differs'):
        dist.spawn(None, 2)
    calls.clear()
    monkeypatch.setattr(dist, '_spawn', failing('torch.distributed.DistNetworkError: Broken pipe'))
    with pytest.raises(RuntimeError, match='Broken pipe'):
        dist.spawn(None, 2, retry=False)


@pytest.mark.parametrize('tp,pp,tied', [(1, 1, False)] + [pytest.param(*p, marks=pytest.mark.slow) for p in
                                                             ((2, 1, False), (1, 2, False), (1, 2, True))],
                         ids=['tp1', 'tp2', 'pp2', 'pp2-tied'])
def test_gpt_logits_match_hf(tiny_llama, tiny_llama_tied, input_ids, tp, pp, tied):
    hf_dir = tiny_llama_tied if tied else tiny_llama
    results = spawn(_logits_worker, tp * pp, hf_dir, input_ids, tp, pp, tp=tp, pp=pp)
    outputs = [r for r in results if r is not None]
    assert len(outputs) == (tp if pp == 1 else 1)  # every TP rank / only the last PP stage returns logits
    for out, ref in outputs:
        assert out.shape == ref.shape == (*input_ids.shape, 512)
        torch.testing.assert_close(out, ref, **LOGITS_TOL)


# ------------------------------------------------------------------------------------------------ CLI


def test_cli_env_passes_threads_and_runs_this_interpreter(monkeypatch):
    """OMP_NUM_THREADS given from outside reaches every process the harness starts (else 1), so that a run of the
    suite under OMP_NUM_THREADS=2 tests 2 threads; `swift` / `megatron` run under this interpreter (in a
    --system-site-packages venv the ones on PATH would run the base python, without this venv's swift-plt)."""
    import os
    import shutil
    import sys

    from harness.cli import CONSOLE_SCRIPTS, harness_env
    monkeypatch.setenv('OMP_NUM_THREADS', '2')
    env = harness_env(nproc=2)
    assert env['OMP_NUM_THREADS'] == env['MKL_NUM_THREADS'] == '2' and env['NPROC_PER_NODE'] == '2'
    monkeypatch.delenv('OMP_NUM_THREADS')
    env = harness_env()
    assert env['OMP_NUM_THREADS'] == '1'
    for name in CONSOLE_SCRIPTS:
        exe = shutil.which(name, path=env['PATH'])
        assert exe, name
        with open(exe) as f:
            shebang = f.readline()
        assert shebang.strip() == '#!' + sys.executable or os.path.dirname(exe) == os.path.dirname(sys.executable)
