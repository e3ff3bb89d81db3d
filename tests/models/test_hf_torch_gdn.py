"""swift_plt.tools.hf_gdn: a hybrid's transformers Gated DeltaNet back on its own torch code (the GPU checks' and the
quality eval's reference) where fla's kernels were bound at import."""
import functools
import inspect
import sys

import pytest
import torch

from swift_plt.tools.hf_gdn import TORCH_GDN_FUNCS, hf_torch_gdn


@pytest.fixture(scope='module')
def qwen3_next(tmp_path_factory):
    import transformers

    from swift_plt.tools.tiny_families import make_tiny_family
    d = make_tiny_family('qwen3_next', str(tmp_path_factory.mktemp('q3n')))
    model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    return model, sys.modules[type(model).__module__]


def test_kernels_bound_at_import_go_back_to_the_torch_functions(qwen3_next, monkeypatch):
    model, mod = qwen3_next
    own = {n: inspect.unwrap(getattr(mod, n)) for n in TORCH_GDN_FUNCS}  # the module's torch code
    assert all(f.__code__.co_filename == mod.__file__ for f in own.values())
    ids = torch.randint(4, 300, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    for name, fn in own.items():  # what use_kernel_func_from_hub_with_fallback does where fla is installed
        monkeypatch.setattr(mod, name, functools.wraps(fn)(lambda *a, **k: (_ for _ in ()).throw(AssertionError)))
    short = mod.__name__.rsplit('.', 1)[-1]
    assert hf_torch_gdn(model) == sorted(f'{short}.{n}' for n in TORCH_GDN_FUNCS)
    assert {n: getattr(mod, n) for n in TORCH_GDN_FUNCS} == own
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, ref)
    assert hf_torch_gdn(model) == []  # nothing left to rebind


def test_a_chunk_function_of_another_module_is_refused(qwen3_next, monkeypatch):
    model, mod = qwen3_next
    monkeypatch.setattr(mod, 'torch_chunk_gated_delta_rule', torch.nn.functional.relu)
    with pytest.raises(RuntimeError, match='torch_chunk_gated_delta_rule is not its own torch function'):
        hf_torch_gdn(model)
