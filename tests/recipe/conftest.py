"""Fixtures of the two-stage recipe tests."""
import json

import pytest


@pytest.fixture(autouse=True)
def no_gpu_memory(monkeypatch):
    """The recipe sizes stage 1's micro batch from the GPU's memory: none here, unless a test gives one."""
    monkeypatch.setattr('swift_plt.recipe.stages.gpu_memory', lambda: None)


@pytest.fixture
def model_dir(tmp_path):
    """A model folder with the config.json the recipe's dry run reads."""
    d = tmp_path / 'model'
    d.mkdir()
    (d / 'config.json').write_text('{"model_type": "llama"}')
    return str(d)


@pytest.fixture
def family_model_dir(tmp_path):
    """model_type -> a model folder whose config.json has that model_type (all the recipe reads before it runs)."""
    def make(model_type):
        d = tmp_path / f'model_{model_type}'
        d.mkdir(exist_ok=True)
        (d / 'config.json').write_text(json.dumps({'model_type': model_type}))
        return str(d)
    return make
