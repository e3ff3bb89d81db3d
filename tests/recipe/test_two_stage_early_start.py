"""Stage 2 started beside stage 1 (early_start.py), with real processes: a stand-in `megatron` prints ms-swift's
milestone lines, passes the plugin's gate (the real ``wait_for_gate``) and writes its checkpoint. The gate opens only
after stage 1 has exited; a failed stage 1 stops stage 2 at its gate; a gate whose recipe is gone stops too."""
import json
import os
import subprocess
import sys
import time

import pytest

from swift_plt.recipe import cli, early_start, stages
from swift_plt.recipe.early_start import GATE_ENV, PARENT_ENV, wait_for_gate, write_gate
from test_two_stage_launch import recipe_argv

# `megatron pt ...`: milestones, the gate (stage 2), a step log, the final checkpoint; times to <output_dir>/times.json
FAKE_MEGATRON = r'''
import json, os, sys, time
argv = sys.argv[2:]
flag = lambda name: argv[argv.index('--' + name) + 1]
out, iters, k = flag('output_dir'), int(flag('train_iters')), int(flag('patch_size'))
print("[INFO:swift] args: MegatronPretrainArguments(model='m')")
print('[INFO:swift] Dataset Token Length: 10.0±0.0, min=1, max=1, size=1')
from swift_plt.recipe.early_start import wait_for_gate
wait_for_gate()
passed = time.time()
print('[INFO:swift] [rank0] model_parameter_info: PLTGPTModel: 1M Params')
print('[INFO:swift] The training of Epoch 0 starts...')
if k > 1:
    time.sleep(float(os.environ.get('FAKE_STAGE1_SECONDS', '1')))
    if os.environ.get('FAKE_STAGE1_FAILS'):
        sys.exit(7)
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, 'logging.jsonl'), 'a') as f:
    for i in range(1, iters + 1):
        print({'loss': 5.0, 'iteration': f'{i}/{iters}'})
        f.write(json.dumps({'loss': 5.0, 'iteration': f'{i}/{iters}', 'train_speed(s/it)': 0.01}) + '\n')
ckpt = os.path.join(out, f'checkpoint-{iters}')
os.makedirs(os.path.join(ckpt, f'iter_{iters:07d}'), exist_ok=True)
open(os.path.join(ckpt, 'latest_checkpointed_iteration.txt'), 'w').write(str(iters))
json.dump({'passed_gate': passed, 'exit': time.time(), 'env': {k: os.environ.get(k) for k in
           ('SWIFT_PLT_STAGE2_GATE', 'MASTER_PORT')}}, open(os.path.join(out, 'times.json'), 'w'))
'''


@pytest.fixture
def fake_megatron(tmp_path, monkeypatch):
    exe = tmp_path / 'megatron'
    exe.write_text(f'#!{sys.executable}\n{FAKE_MEGATRON}')
    exe.chmod(0o755)
    monkeypatch.setattr(stages, 'cli_executable', lambda name: str(exe))
    monkeypatch.setattr(cli, 'export_vanilla', lambda *a, **k: None)
    monkeypatch.setattr(early_start, 'POLL_S', 0.05)
    monkeypatch.setenv('PYTHONPATH', os.pathsep.join(sys.path))
    for k in ('NPROC_PER_NODE', 'NNODES', 'MASTER_PORT'):
        monkeypatch.delenv(k, raising=False)
    return exe


def _times(out, stage):
    return json.load(open(os.path.join(out, stages.STAGE_DIRS[stage], 'times.json')))


def test_stage2_builds_its_model_only_after_stage1_exited(model_dir, tmp_path, fake_megatron, monkeypatch, capsys):
    monkeypatch.setenv('FAKE_STAGE1_SECONDS', '1.5')
    out = str(tmp_path / 'out')
    assert cli.main(recipe_argv(model_dir, out)) == 0
    t1, t2 = _times(out, 1), _times(out, 2)
    assert t1['env']['SWIFT_PLT_STAGE2_GATE'] is None and t2['passed_gate'] > t1['exit']
    assert t2['env']['MASTER_PORT'] not in (None, '29500')  # its own torchrun port beside stage 1's
    text = capsys.readouterr().out
    assert '[stage2] starts now, beside stage 1' in text and 'waiting for stage 1 to finish' in text
    # stage 2's wall clock counts from stage 1's end; its phases show the wait; the recipe is done
    [inv2] = [json.loads(line) for line in open(os.path.join(out, 'logs', 'stage2.time.jsonl'))]
    assert inv2['beside_earlier_stage_seconds'] > 1.0 and inv2['seconds'] < 3.0
    assert 'gate' in inv2['milestones'] and '[done]' in text
    rows = json.load(open(os.path.join(out, 'summary.json')))
    assert rows[1]['phases']['wait'] > 1.0 and rows[1]['beside_seconds'] == inv2['beside_earlier_stage_seconds']


def test_after_runs_stage2_when_stage1_is_done(model_dir, tmp_path, fake_megatron):
    out = str(tmp_path / 'out')
    assert cli.main(recipe_argv(model_dir, out, '--stage2_start', 'after')) == 0
    t1, t2 = _times(out, 1), _times(out, 2)
    assert t2['env']['SWIFT_PLT_STAGE2_GATE'] is None and t2['passed_gate'] > t1['exit']


def test_failed_stage1_stops_stage2_at_its_gate(model_dir, tmp_path, fake_megatron, monkeypatch, capsys):
    monkeypatch.setenv('FAKE_STAGE1_FAILS', '1')
    out = str(tmp_path / 'out')
    t = time.time()
    assert cli.main(recipe_argv(model_dir, out)) == 7
    assert time.time() - t < 30
    assert not os.path.exists(os.path.join(out, 'stage2_token', 'times.json'))  # never past its gate
    log2 = open(os.path.join(out, 'logs', 'stage2.log')).read()
    assert f'stage 1 did not finish: stage 1 failed (exit code 7; log: {out}/logs/stage1.log); stage 2 stops' in log2


def test_gate_stops_when_the_recipe_is_gone(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(early_start, 'POLL_S', 0.01)
    dead = subprocess.Popen([sys.executable, '-c', 'pass'])
    dead.wait()
    with pytest.raises(SystemExit):
        wait_for_gate({GATE_ENV: str(tmp_path / 'gate'), PARENT_ENV: str(dead.pid)})
    assert f'the recipe (pid {dead.pid}) that started this stage early is gone' in capsys.readouterr().err
    write_gate(str(tmp_path / 'gate'), True)
    wait_for_gate({GATE_ENV: str(tmp_path / 'gate'), PARENT_ENV: str(dead.pid)})  # open: goes on
    wait_for_gate({})  # not started early: nothing
