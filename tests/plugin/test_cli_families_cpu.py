"""The stock CLIs with a family's own model type plus ``--patch_size`` on CPU (tests/harness): K=1 is ms-swift
without the plugin bit for bit (`megatron pt`), `swift pt` trains the family's PLT class and saves the plain family
model. `megatron pt --model_type <family> --patch_size 4` builds ``PLTGPTModel`` and trains at K=4: stage 1 of
tests/recipe/test_two_stage_families.py (the recipe runs that command, qwen3_moe and qwen3_next); the refusal before step 1
of a bad --max_length: tests/plugin/test_cli_cpu.py (the argument check does not depend on the model type)."""
import json
import math
import os

import pytest

from harness.cli import CPU_MEGATRON_ARGS, CPU_SWIFT_ARGS, hf_train_logs, parse_logs, run_cli
from harness.tiny import make_jsonl
from swift_plt.tools.tiny_families import make_tiny_family

pytestmark = pytest.mark.slow


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    return make_jsonl(str(tmp_path_factory.mktemp('data') / 'train.jsonl'), rows=64)


@pytest.fixture(scope='module')
def models(tmp_path_factory):
    return {}


def model_dir(models, tmp_path_factory, family):
    if family not in models:
        models[family] = make_tiny_family(family, str(tmp_path_factory.mktemp(family)))
    return models[family]


def megatron_pt(model, family, data, out_dir, *extra, env=None):
    return run_cli(['megatron', 'pt', '--model', model, '--model_type', family, '--template', 'default',
                    '--dataset', data, '--max_length', '64', '--train_iters', '3', '--micro_batch_size', '2',
                    '--global_batch_size', '4', '--lr', '1e-3', '--lr_warmup_iters', '0', '--logging_steps', '1',
                    '--seed', '7', '--torch_dtype', 'float32', '--fp16', 'false', '--bf16', 'false',
                    '--save_steps', '1000', '--no_save_optim', 'true', '--no_save_rng', 'true',
                    '--dataset_num_proc', '1', '--dataloader_num_workers', '0', '--output_dir', str(out_dir),
                    *CPU_MEGATRON_ARGS, *extra], env_extra=env, timeout=900)


@pytest.mark.parametrize('family', ['qwen3', 'qwen3_next'])
def test_megatron_pt_family_k1_is_stock_without_plugin(family, models, tmp_path_factory, data, tmp_path):
    model = model_dir(models, tmp_path_factory, family)
    plt1 = megatron_pt(model, family, data, tmp_path / 'plt', '--patch_size', '1')
    stock = megatron_pt(model, family, data, tmp_path / 'stock', env={'SWIFT_PLT_DISABLE': '1'})
    assert plt1.returncode == 0 and stock.returncode == 0, (plt1.stdout[-3000:], stock.stdout[-3000:])
    assert 'PLTGPTModel' not in plt1.stdout
    keys = ('loss', 'grad_norm')
    got = [{k: d[k] for k in keys} for d in parse_logs(plt1.stdout) if 'loss' in d]
    ref = [{k: d[k] for k in keys} for d in parse_logs(stock.stdout) if 'loss' in d]
    assert len(ref) == 3 and got == ref


@pytest.mark.parametrize('family, cls', [('qwen3_moe', 'Qwen3MoeForCausalLM'), ('qwen3_next', 'Qwen3NextForCausalLM')])
def test_swift_pt_moe_family_patch_size_4_trains_and_saves_plain_model(family, cls, models, tmp_path_factory, data,
                                                                       tmp_path):
    """MoE and the hybrid Gated-DeltaNet decoder (MoE) on the HF backend: the family's PLT class trains at K=4 (the
    router aux loss over patches), the checkpoint is the plain family class."""
    model = model_dir(models, tmp_path_factory, family)
    proc = run_cli(['swift', 'pt', '--model', model, '--model_type', family, '--template', 'default',
                    '--patch_size', '4', '--dataset', data, '--max_length', '64', '--tuner_type', 'full',
                    '--torch_dtype', 'float32', '--fp16', 'false', '--bf16', 'false', '--router_aux_loss_coef',
                    '0.01', '--per_device_train_batch_size', '2', '--learning_rate', '1e-3', '--max_steps', '3',
                    '--logging_steps', '1', '--save_steps', '3', '--seed', '7', '--split_dataset_ratio', '0',
                    '--dataset_num_proc', '1', '--dataloader_num_workers', '0', '--report_to', 'none',
                    '--output_dir', str(tmp_path), *CPU_SWIFT_ARGS], timeout=900)
    assert proc.returncode == 0, proc.stdout[-5000:]
    assert 'PLT' + cls in proc.stdout
    losses = [d['loss'] for d in hf_train_logs(str(tmp_path))]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    (ckpt, ) = [os.path.join(r, 'config.json') for r, _, fs in os.walk(tmp_path) if 'model.safetensors' in fs]
    with open(ckpt) as f:
        config = json.load(f)
    assert config['architectures'] == [cls] and 'patch_size' not in config


def test_megatron_pt_qwen3_next_patch_size_4_trains_packed(models, tmp_path_factory, data, tmp_path):
    """The hybrid Gated-DeltaNet decoder through the stock CLI at K=4, padding-free (THD: the GDN kernels get the
    patch-level document boundaries): built as PLTGPTModel, a finite loss at every step."""
    model = model_dir(models, tmp_path_factory, 'qwen3_next')
    proc = megatron_pt(model, 'qwen3_next', data, tmp_path, '--patch_size', '4', '--padding_free', 'true')
    assert proc.returncode == 0, proc.stdout[-5000:]
    assert 'PLTGPTModel' in proc.stdout
    losses = [d['loss'] for d in parse_logs(proc.stdout) if 'loss' in d]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
