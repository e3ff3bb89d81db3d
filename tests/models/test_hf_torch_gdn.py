"""swift_plt.tools.hf_gdn: a hybrid's transformers Gated DeltaNet back on its own torch code (the GPU checks' and the
quality eval's reference) where fla's kernels were bound: at import in the module (transformers 5) or per layer in
__init__ (4.57)."""
import functools
import inspect
import sys

import pytest
import torch

from swift_plt.tools.hf_gdn import LAYER_TORCH, TORCH_GDN_FUNCS, hf_torch_gdn


def _kernel(*a, **k):  # a stand-in for fla's kernels: never to be called once hf_torch_gdn ran
    raise AssertionError('a kernel stand-in ran')


@pytest.fixture(scope='module')
def qwen3_next(tmp_path_factory):
    import transformers

    from swift_plt.tools.tiny_families import make_tiny_family
    d = make_tiny_family('qwen3_next', str(tmp_path_factory.mktemp('q3n')))
    model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    return model, sys.modules[type(model).__module__]


def test_kernels_bound_in_the_module_or_the_layers_go_back_to_the_torch_functions(qwen3_next, monkeypatch):
    model, mod = qwen3_next
    layers = [m for m in model.modules() if type(m).__name__.endswith('GatedDeltaNet')]
    short = mod.__name__.rsplit('.', 1)[-1]
    ids = torch.randint(4, 300, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    own = {n: inspect.unwrap(getattr(mod, n)) for n in TORCH_GDN_FUNCS if getattr(mod, n, None) is not None}
    assert own['torch_chunk_gated_delta_rule'].__code__.co_filename == mod.__file__  # the module's torch code
    expected = set()
    for name, fn in own.items():  # what use_kernel_func_from_hub_with_fallback does where fla is installed (5.x)
        monkeypatch.setattr(mod, name, functools.wraps(fn)(lambda *a, **k: _kernel()))  # one wrapper per name
        expected.add(f'{short}.{name}')
    for m in layers:  # what __init__ does where fla is installed (4.57)
        for attr in LAYER_TORCH:
            if attr in vars(m):
                monkeypatch.setattr(m, attr, _kernel)
                expected.add(f'{short}.{type(m).__name__}.{attr}')
    assert hf_torch_gdn(model) == sorted(expected) and expected
    assert {n: getattr(mod, n) for n in own} == own
    for m in layers:
        for attr, torch_name in LAYER_TORCH.items():
            if attr in vars(m):
                assert getattr(m, attr) is (None if torch_name is None else inspect.unwrap(getattr(mod, torch_name)))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, ref)
    assert hf_torch_gdn(model) == []  # nothing left to change


def test_a_chunk_function_of_another_module_is_refused(qwen3_next, monkeypatch):
    model, mod = qwen3_next
    monkeypatch.setattr(mod, 'torch_chunk_gated_delta_rule', torch.nn.functional.relu)
    with pytest.raises(RuntimeError, match='torch_chunk_gated_delta_rule is not its own torch function'):
        hf_torch_gdn(model)
