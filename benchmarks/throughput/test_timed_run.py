"""timed_run.py on a stand-in run: its wall clock by ms-swift milestone and the training loop from logging.jsonl."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

FAKE = r'''
import json, os, sys, time
out = sys.argv[1]
print("[INFO:swift] args: MegatronPretrainArguments(model='m')", flush=True)
time.sleep(0.3)
print('[INFO:swift] Dataset Token Length: 10.0', flush=True)
print('[INFO:swift] [rank0] model_parameter_info: GPTModel: 1M Params', flush=True)
print('[INFO:swift] The training of Epoch 0 starts...', flush=True)
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, 'logging.jsonl'), 'w') as f:
    for i in (1, 2, 3):
        print({'loss': 5.0, 'iteration': f'{i}/3'}, flush=True)
        f.write(json.dumps({'loss': 5.0, 'iteration': f'{i}/3', 'train_speed(s/it)': 0.5}) + '\n')
'''


def test_timed_run_prints_phases_and_the_training_loop(tmp_path):
    out = tmp_path / 'run'
    proc = subprocess.run([sys.executable, os.path.join(HERE, 'timed_run.py'), str(tmp_path / 'run.log'), str(out),
                           '--', sys.executable, '-c', FAKE, str(out)], capture_output=True, text=True, timeout=120)
    line = [x for x in proc.stdout.splitlines() if x.startswith('TIMED')]
    assert proc.returncode == 0 and line, proc.stdout + proc.stderr
    assert 'training 1.5 s (3 logged steps); start-up ' in line[0]  # 0.5 s/it x 3 steps
    names = [p.split(' ')[0] for p in line[0].split('; ', 1)[1].split(', ')]
    assert names == ['start-up', 'data', 'model', 'load', 'first', 'steps', 'save']
    assert float(line[0].split('data ')[1].split(' s')[0]) >= 0.3
    assert (tmp_path / 'run.log').read_text().startswith('$ ')
