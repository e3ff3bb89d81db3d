"""plt_loss_bench.py's CPU smoke path: every row runs, the ratios and the JSON come out."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_cpu_smoke_run_writes_rows_and_ratios(tmp_path):
    out = tmp_path / 'bench.json'
    proc = subprocess.run([sys.executable, os.path.join(HERE, 'plt_loss_bench.py'), '--device', 'cpu', '--P', '16',
                           '--V', '101', '--iters', '1', '--warmup', '0', '--json', str(out)],
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert 'BENCH PLT/CE time (fwd+bwd):' in proc.stdout
    rec = json.loads(out.read_text())
    assert set(rec['results']) == {'plt', 'plt_torch', 'ce', 'ce_xK'}  # ce_fused, plt_inplace: CUDA rows
    assert all('error' not in r for r in rec['results'].values())
    assert rec['ratios']['plt_over_ce_time'] > 0 and rec['shape'] == {'P': 16, 'B': 1, 'V': 101, 'K': 4,
                                                                        'dtype': 'bfloat16'}
