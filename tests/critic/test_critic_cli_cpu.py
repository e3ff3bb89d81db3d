"""The stock `swift export` CLI with the critic on CPU (tests/harness): HF LlamaForTokenClassification critic dir
--to_mcore (ms-swift's --test_convert_precision passes) and the mcore checkpoint --to_hf back: the value head goes
through the distributed checkpoint, the export is bit-identical and plain transformers loads it (in the installed
version's format: a zero score.bias on transformers 4.57.x)."""
import json
import os
import re

import pytest
import torch

from harness.cli import run_cli
from harness.tiny import make_tiny_critic, make_tiny_llama
from swift_plt.compat.transformers import critic_head_has_bias

pytestmark = pytest.mark.slow
CUSTOM_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'custom_model', 'llama.py')


def _bf16_copy(src, dst):
    """The critic in bf16 (the dtype of the export), so that the round trip can be compared bit for bit."""
    import shutil

    from safetensors.torch import load_file, save_file
    shutil.copytree(src, dst)
    sd = {k: v.to(torch.bfloat16) for k, v in load_file(os.path.join(src, 'model.safetensors')).items()}
    save_file(sd, os.path.join(dst, 'model.safetensors'), metadata={'format': 'pt'})
    with open(os.path.join(dst, 'config.json')) as f:
        config = json.load(f)
    config['dtype'] = 'bfloat16'
    with open(os.path.join(dst, 'config.json'), 'w') as f:
        json.dump(config, f)
    return dst


def _export(*args):
    proc = run_cli(['swift', 'export', '--model_type', 'llama3_2_critic', '--custom_register_path', CUSTOM_MODEL,
                    '--torch_dtype', 'bfloat16', *args], timeout=900)
    assert proc.returncode == 0, proc.stdout[-5000:]
    return proc.stdout


def test_swift_export_critic_to_mcore_and_back_to_hf(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForTokenClassification

    lm = make_tiny_llama(str(tmp_path / 'lm'))
    critic = _bf16_copy(make_tiny_critic(str(tmp_path / 'critic32'), lm), str(tmp_path / 'critic'))
    out = _export('--model', critic, '--to_mcore', 'true', '--test_convert_precision', 'true', '--output_dir',
                  str(tmp_path / 'mcore'))
    mean_diff = float(re.search(r'mean_diff \(with loss\): ([0-9.e-]+)', out).group(1))
    assert mean_diff < 1e-2, mean_diff  # per-token values, HF LlamaForTokenClassification vs mcore (bf16)
    assert 'no value head' not in out  # a critic: the head is loaded, not initialised
    # --to_hf from the distributed checkpoint alone (the HF dir is only used for config/tokenizer): a head that
    # was missing from the checkpoint would come back as zeros, not as the original weights.
    _export('--mcore_model', str(tmp_path / 'mcore'), '--to_hf', 'true', '--output_dir', str(tmp_path / 'hf'))
    ref, got = load_file(os.path.join(critic, 'model.safetensors')), load_file(str(tmp_path / 'hf' /
                                                                                  'model.safetensors'))
    assert set(got) == set(ref) and all(torch.equal(got[k], ref[k]) for k in ref)
    assert got['score.weight'].abs().sum() > 0
    config = json.load(open(tmp_path / 'hf' / 'config.json'))
    assert config['architectures'] == ['LlamaForTokenClassification'] and config['id2label'] == {'0': 'LABEL_0'}
    assert config['token_classification_bias'] is critic_head_has_bias() and config['tie_word_embeddings'] is False
    assert ('score.bias' in got) is critic_head_has_bias()
    model, info = AutoModelForTokenClassification.from_pretrained(str(tmp_path / 'hf'), output_loading_info=True)
    assert type(model).__name__ == 'LlamaForTokenClassification' and not any(info.values()), info


def test_critic_from_causal_lm_mcore_checkpoint(tmp_path):
    """A causal-LM mcore checkpoint (stock llama): as a critic everything but the head loads and the head is
    initialised (zeros) with a warning, not mis-loaded from the LM head (upstream loads the [V, H] LM head into the
    [1, H] head without an error). A model that is not a critic loads as upstream (the load patch passes through):
    the bit-exact `swift export` round trip of tests/plugin/test_cli_cpu.py and the recipe's vanilla exports
    (tests/recipe/test_two_stage_cli.py) go through the same patched loader."""
    from safetensors.torch import load_file
    lm = make_tiny_llama(str(tmp_path / 'lm'))
    proc = run_cli(['swift', 'export', '--model', lm, '--model_type', 'llama', '--template', 'llama', '--to_mcore',
                    'true', '--torch_dtype', 'bfloat16', '--output_dir', str(tmp_path / 'mcore')], timeout=900)
    assert proc.returncode == 0, proc.stdout[-5000:]
    ref = {k: v.to(torch.bfloat16) for k, v in load_file(os.path.join(lm, 'model.safetensors')).items()}
    out = _export('--mcore_model', str(tmp_path / 'mcore'), '--to_hf', 'true', '--output_dir', str(tmp_path / 'hf'))
    assert 'is a causal LM (no value head): initialised the value head with zeros' in out
    got = load_file(str(tmp_path / 'hf' / 'model.safetensors'))
    bias = {'score.bias'} if critic_head_has_bias() else set()  # 4.57.x: the format's zero bias
    assert set(got) == set(ref) - {'lm_head.weight'} | {'score.weight'} | bias
    assert all(torch.equal(got[k], ref[k]) for k in ref if k != 'lm_head.weight')
    assert torch.equal(got['score.weight'], torch.zeros(1, 64, dtype=torch.bfloat16))
    assert not bias or torch.equal(got['score.bias'], torch.zeros(1, dtype=torch.bfloat16))
