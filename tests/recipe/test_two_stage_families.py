"""The two-stage recipe end to end on CPU (tests/harness) for a non-Llama family, the hybrid Qwen3-Next (Gated
DeltaNet + gated attention, MoE: one run covers both paths): both stages with the family's own model type, then the
export as its plain transformers class (loaded with swift-plt disabled, same logits)."""
import json
import math
import os
import shlex
import subprocess
import sys

import pytest
from test_two_stage_cli import _logits_worker, recipe_argv

from harness import spawn
from harness.cli import parse_logs, run_cli
from harness.dist import cpu_threads
from harness.tiny import make_jsonl

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group('two_stage_families')]

CLASSES = {
    # the hybrid: Gated DeltaNet + gated attention, MoE
    'qwen3_next': 'transformers.models.qwen3_next.modeling_qwen3_next.Qwen3NextForCausalLM',
}


def tiny_family(family, out_dir):
    """The package's tiny model of ``family``; skips (with why) where it cannot make one."""
    try:
        from swift_plt.tools.tiny_families import make_tiny_family
    except ImportError as e:
        pytest.skip(f'no tiny {family} model: {e}')
    try:
        return make_tiny_family(family, out_dir)
    except ValueError as e:
        pytest.skip(f'no tiny {family} model: {e}')


@pytest.fixture(scope='module', params=list(CLASSES))
def run(request, tmp_path_factory):
    family = request.param
    root = tmp_path_factory.mktemp(f'two_stage_{family}')
    model = tiny_family(family, str(root / 'model'))
    data = make_jsonl(str(root / 'train.jsonl'), rows=64)
    out = str(root / 'out')
    # --template: ms-swift picks none itself for a local dir of these types (several candidates)
    proc = run_cli(recipe_argv(model, data, out, template='qwen3'), timeout=900)
    return {'family': family, 'out': out, 'model': model, 'proc': proc}


def stage_log(run, stage):
    with open(os.path.join(run['out'], 'logs', f'stage{stage}.log')) as f:
        text = f.read()
    return shlex.split(text.split('\n', 1)[0][2:]), text  # the command (first line), the log


def test_stages_run_with_the_family_model_type(run):
    proc, family = run['proc'], run['family']
    assert proc.returncode == 0, proc.stdout[-5000:]
    for stage, k in ((1, '4'), (2, '1')):
        cmd, log = stage_log(run, stage)
        assert cmd[cmd.index('--model_type') + 1] == family and '--custom_register_path' not in cmd
        assert cmd[cmd.index('--patch_size') + 1] == k
        assert ('model: PLTGPTModel(' in log) == (stage == 1), f'stage {stage}'
        losses = [d['loss'] for d in parse_logs(log) if 'loss' in d]
        print(f'{family} stage {stage} losses: {losses}')
        assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    s1 = os.path.join(run['out'], 'stage1_patch', 'checkpoint-3')
    assert f'Successfully loaded Megatron model weights from: {s1}' in stage_log(run, 2)[1]
    assert f"vanilla HF model: {os.path.join(run['out'], 'hf')}" in proc.stdout


def test_export_is_the_family_class_for_plain_transformers(run):
    assert run['proc'].returncode == 0, run['proc'].stdout[-5000:]
    hf = os.path.join(run['out'], 'hf')
    with open(os.path.join(hf, 'config.json')) as f:
        config = json.load(f)
    cls = CLASSES[run['family']]
    assert config['model_type'] == run['family'] and config['architectures'] == [cls.rsplit('.', 1)[1]]
    assert 'patch_size' not in config and 'auto_map' not in config
    assert not os.path.exists(os.path.join(hf, 'args.json'))
    with open(os.path.join(hf, 'swift_plt_export.json')) as f:
        cmd = json.load(f)['command']
    assert cmd[cmd.index('--model_type') + 1] == run['family'] and cmd[cmd.index('--patch_size') + 1] == '1'
    # a fresh interpreter without swift-plt (startup hook off): plain transformers, no remote code
    env = dict(os.environ, SWIFT_PLT_DISABLE='1', HF_HUB_OFFLINE='1', TRANSFORMERS_OFFLINE='1',
               OMP_NUM_THREADS=cpu_threads())
    proc = subprocess.run([sys.executable, '-m', 'swift_plt.recipe.export', '--check', hf], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)['class'] == cls


def test_export_logits_equal_the_stage2_checkpoint(run):
    import torch
    assert run['proc'].returncode == 0, run['proc'].stdout[-5000:]
    ck2 = os.path.join(run['out'], 'stage2_token', 'checkpoint-3')
    ids = torch.randint(4, 512, (2, 24), generator=torch.Generator().manual_seed(0))
    from swift_plt.families import FAMILY_MCORE_TYPES
    mcore_type = FAMILY_MCORE_TYPES.get(run['family'], 'gpt')
    ((mg, hf), ) = spawn(_logits_worker, 1, run['model'], [(ck2, os.path.join(run['out'], 'hf'))], ids,
                         mcore_type)[0]
    diff = (mg - hf).abs().max().item()
    rel = diff / hf.abs().max().item()
    print(f"{run['family']}: max abs diff {diff:.3g}, rel {rel:.3g}")
    assert diff < 1e-4 and rel < 1e-5
