"""Fixtures of the two-stage recipe tests."""
import pytest


@pytest.fixture
def model_dir(tmp_path):
    """A model folder with the config.json the recipe's dry run reads."""
    d = tmp_path / 'model'
    d.mkdir()
    (d / 'config.json').write_text('{"model_type": "llama"}')
    return str(d)
