"""critic_engine_bench.py's CPU smoke path (toy shape, fp32, tests/harness): the model builds ms-swift's way, the
CHECK lines pass (packed = padded on the same weights), every variant is timed, the table and the JSON come out."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_cpu_smoke_run_checks_and_times_every_variant(tmp_path):
    out = tmp_path / 'bench.json'
    proc = subprocess.run([sys.executable, os.path.join(HERE, 'critic_engine_bench.py'), '--device', 'cpu',
                           '--rounds', '1', '--warmup', '0', '--model-dir', str(tmp_path / 'model'),
                           '--json', str(out)], cwd=str(tmp_path), capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS='1'))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count('-> OK') == 2 and 'BENCH packed/padded tokens/s:' in proc.stdout
    rec = json.loads(out.read_text())
    assert rec['check_ok'] and set(rec['results']) == {'padded', 'packed', 'packed_tokens'}
    assert all(r['tokens_per_s'] > 0 for r in rec['results'].values())
    assert rec['batch']['real_tokens'] < rec['batch']['padded_tokens'] and rec['shape'] == 'toy'
