"""families.sh's pieces on CPU: tput_launch.py --family (each family's own model type and dir, A B A B order, stock
with the plugin off) with a stand-in `megatron`, and families_summary.py's figures from synthetic probes and ms-swift
logging.jsonl files (seconds)."""
import json
import os
import stat
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import families_summary  # noqa: E402
import tput_launch  # noqa: E402

FAKE = '''#!{python}
import json, os, sys
argv = sys.argv[1:]
key = os.path.basename(argv[argv.index('--output_dir') + 1])
with open(os.path.join(os.environ['FAKE_ARGV_DIR'], key + '.json'), 'w') as f:
    json.dump(dict(argv=argv, disable=os.environ.get('SWIFT_PLT_DISABLE')), f)
'''


def model_dir(tmp_path, name, model_type):
    d = tmp_path / name
    d.mkdir()
    (d / 'config.json').write_text(json.dumps({'model_type': model_type}))
    return str(d)


def test_family_runs_commands_and_order(tmp_path, monkeypatch):
    exe = tmp_path / 'megatron'
    exe.write_text(FAKE.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    argv_dir = tmp_path / 'argv'
    argv_dir.mkdir()
    monkeypatch.setenv('FAKE_ARGV_DIR', str(argv_dir))
    dense, moe = model_dir(tmp_path, 'q3', 'qwen3'), model_dir(tmp_path, 'moe', 'qwen3_moe')
    work = tmp_path / 'work'
    mask = os.sched_getaffinity(0)
    try:
        tput_launch.main(['--work', str(work), '--family', f'dense={dense}', '--family', f'moe={moe}', '--template',
                          'default', '--data-k1', 'D1', '--data-k4', 'D4', '--rounds', '2', '--rounds-m8', '0',
                          '--mbs', '1', '--gbs', '8', '--megatron', str(exe), '--poll', '0.02', '--lookahead', '1',
                          '--extra-args=--foo 1'])
    finally:
        os.sched_setaffinity(0, mask)
    rec = json.load(open(work / 'probes' / 'launch.json'))
    order = [r['key'] for r in rec['runs']]
    assert order == ['dense_stock_r1', 'dense_plt4_r1', 'moe_stock_r1', 'moe_plt4_r1', 'dense_stock_r2',
                     'dense_plt4_r2', 'moe_stock_r2', 'moe_plt4_r2']
    assert all(r['state'] == 'done' for r in rec['runs'])

    def args(key):
        d = json.load(open(argv_dir / f'{key}.json'))
        a = d['argv']
        opt = {a[i]: a[i + 1] for i in range(1, len(a) - 1) if a[i].startswith('--')}
        return d['disable'], opt

    disable, o = args('moe_plt4_r2')
    assert disable == '0' and o['--model_type'] == 'qwen3_moe' and o['--patch_size'] == '4'
    assert o['--model'] == moe and o['--max_length'] == '8192' and o['--template'] == 'default' and o['--foo'] == '1'
    disable, o = args('dense_stock_r1')
    assert disable == '1' and o['--model_type'] == 'qwen3' and '--patch_size' not in o
    assert o['--model'] == dense and o['--max_length'] == '2048' and o['--micro_batch_size'] == '1'
    meta = json.load(open(work / 'probes' / 'moe_plt4_r1.meta.json'))
    assert (meta['name'], meta['k'], meta['max_length'], meta['gbs']) == ('moe_plt4', 4, 8192, 8)


def write_run(work, key, base, k, step_s, speeds, gbs=8, positions=2048):
    probes = work / 'probes'
    probes.mkdir(parents=True, exist_ok=True)
    with open(probes / f'{key}.meta.json', 'w') as f:
        json.dump(dict(name=base, round=int(key.rsplit('_r', 1)[1]), mbs=1, gbs=gbs, max_length=positions * k, k=k), f)
    with open(probes / f'{key}.jsonl', 'w') as f:
        for s in range(1, 9):
            f.write(json.dumps(dict(step=s, t_end=10.0 + s * step_s, wall=0.0, loss=12.0, grad_norm=1.0,
                                    max_mem_gib=30.0)) + '\n')
    d = work / 'runs' / key / 'v0-20260101'
    d.mkdir(parents=True)
    with open(d / 'logging.jsonl', 'w') as f:
        for s, sp in enumerate(speeds, 1):
            f.write(json.dumps({'loss': 12.0, 'iteration': f'{s}/8', 'train_speed(s/it)': sp}) + '\n')


def test_families_summary_ratios_noise_and_swift_figures(tmp_path, capsys):
    work = tmp_path / 'w'
    # ms-swift speed = elapsed / steps; elapsed_3 = 3.0 s, elapsed_7 = 5.0 s: 4 steps in 2.0 s after warm-up 3
    sp = [2.0, 1.2, 1.0, 0.95, 0.9, 0.8, 5.0 / 7]
    write_run(work, 'dense_stock_r1', 'dense_stock', 1, 0.50, sp)
    write_run(work, 'dense_plt4_r1', 'dense_plt4', 4, 0.52, sp)
    write_run(work, 'dense_stock_r2', 'dense_stock', 1, 0.55, sp)
    write_run(work, 'dense_plt4_r2', 'dense_plt4', 4, 0.50, sp)
    write_run(work, 'moe_stock_r1', 'moe_stock', 1, 1.0, sp)
    write_run(work, 'moe_plt4_r1', 'moe_plt4', 4, 1.1, sp)
    write_run(work, 'moe_stock_r0', 'moe_stock', 1, 3.0, sp)  # WARMUP's run: in no ratio, no noise floor
    assert families_summary.main([str(work), '--warm', '3', '--json', str(tmp_path / 'f.json')]) == 0
    out = capsys.readouterr().out
    s = json.load(open(tmp_path / 'f.json'))
    d = s['dense']
    assert d['ratio_per_round'] == pytest.approx([4 * 0.50 / 0.52, 4 * 0.55 / 0.50])
    assert d['ratio_median'] == pytest.approx((4 * 0.50 / 0.52 + 4 * 0.55 / 0.50) / 2)
    assert d['noise']['stock'] == pytest.approx(0.55 / 0.50 - 1) and d['noise']['plt4'] == pytest.approx(0.52 / 0.5 - 1)
    f = d['runs']['stock']['1']
    assert f['tokens_per_s'] == pytest.approx(8 * 2048 / 0.50)
    assert f['swift_tokens_per_s'] == pytest.approx(8 * 2048 * 4 / 2.0)
    assert d['swift_ratio_per_round'] == pytest.approx([4.0, 4.0])
    assert s['moe']['ratio_per_round'] == pytest.approx([4 / 1.1]) and s['moe']['noise']['stock'] is None
    assert 'TPUT ratio dense plt4/stock tokens/s: median' in out and 'TPUT ratio moe' in out
    assert 'n/a (one round)' in out


def test_families_summary_fails_without_pairs(tmp_path, capsys):
    work = tmp_path / 'w'
    write_run(work, 'moe_stock_r1', 'moe_stock', 1, 1.0, [1.0] * 7)
    assert families_summary.main([str(work)]) == 1
    assert families_summary.split_name('moe_plt4') == ('moe', 'plt4') and families_summary.split_name('x') is None


def test_families_summary_profiles_k4_against_stock_or_plt1(tmp_path, capsys):
    """PROFILE_STEP: each family's profiled K=4 step against its plt1 step if that ran, else its stock step."""
    work = tmp_path / 'w'
    sp = [1.0] * 7
    for key, name, k in (('moe_stock_r1', 'moe_stock', 1), ('moe_plt4_r1', 'moe_plt4', 4),
                         ('dense_stock_r1', 'dense_stock', 1), ('dense_plt1_r1', 'dense_plt1', 1),
                         ('dense_plt4_r1', 'dense_plt4', 4)):
        write_run(work, key, name, k, 1.0, sp)
    prof = {'moe_stock': 5.0, 'moe_plt4': 7.0, 'dense_stock': 1.0, 'dense_plt1': 2.0, 'dense_plt4': 2.5}
    for name, ms in prof.items():
        rows = [{'name': 'router', 'self_device_us': ms * 1e3, 'self_cpu_us': 10.0, 'count': 4}]
        (work / 'probes' / f'{name}_r1.jsonl.prof.json').write_text(json.dumps({'rows': rows}))
    families_summary.main([str(work), '--warm', '3', '--json', str(tmp_path / 'f.json')])
    s = json.load(open(tmp_path / 'f.json'))
    assert s['moe']['profile']['self_device_us']['top'][0]['diff_ms'] == pytest.approx(2.0)  # against stock
    assert s['dense']['profile']['self_device_us']['top'][0]['diff_ms'] == pytest.approx(0.5)  # against plt1
    assert 'TPUT profile moe self_device_us: K=4 step total 7.0 ms' in capsys.readouterr().out
    # a real profile lists each op and, again, the kernels it launched (no CPU time): the GPU total counts them once
    for name, ms in prof.items():
        rows = [{'name': 'aten::mm', 'self_device_us': ms * 1e3, 'self_cpu_us': 10.0, 'count': 4},
                {'name': 'gemm_kernel', 'self_device_us': ms * 1e3, 'self_cpu_us': 0.0, 'count': 4},
                {'name': 'cudaLaunchKernel', 'self_device_us': 0.0, 'self_cpu_us': 3.0, 'count': 4}]
        (work / 'probes' / f'{name}_r1.jsonl.prof.json').write_text(json.dumps({'rows': rows}))
    families_summary.main([str(work), '--warm', '3', '--json', str(tmp_path / 'f.json')])
    d = json.load(open(tmp_path / 'f.json'))['moe']['profile']
    assert (d['self_device_us']['total_k4_ms'], d['self_device_us']['total_k1_ms']) == pytest.approx((7.0, 5.0))
    assert d['self_cpu_us']['total_k4_ms'] == pytest.approx(0.013)
