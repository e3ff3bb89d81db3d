"""The pipelined throughput launcher (tput_launch.py), its step probe's turn gate and core pinning
(step_probe/sitecustomize.py) and the per-MBS figures of throughput_summary.py.

The launcher runs a fake ``megatron`` (a script written here) whose ``swift.megatron.trainers.base`` is a stand-in
module: its ``BaseMegatronTrainer.__init__`` logs when the GPU phase starts (with the affinity of every thread) and
``train_step`` sleeps; a stand-in ``torch`` keeps each process to a few tens of milliseconds of start-up. The real
probe wraps them exactly as it wraps ms-swift's. Runs in a few seconds on 2 cores.
"""
import json
import os
import stat
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import throughput_summary  # noqa: E402
import tput_launch  # noqa: E402

FAKE_BASE = '''
import json, os, time

class _Args:
    patch_size = 1  # the installed plugin (activated in plt runs) wraps train_step and reads it


class BaseMegatronTrainer:
    def __init__(self, key):
        args = key
        self.args = _Args()
        tids = os.listdir('/proc/self/task')
        rec = {'key': args, 'ev': 'gpu_start', 't': time.time(), 'cpus': sorted(os.sched_getaffinity(0)),
               'thread_cpus': [sorted(os.sched_getaffinity(int(t))) for t in tids], 'threads': len(tids)}
        with open(os.environ['FAKE_GPU_LOG'], 'a') as f:
            f.write(json.dumps(rec) + '\\n')
        time.sleep(float(os.environ.get('FAKE_INIT', '0.2')))
        if args in os.environ.get('FAKE_CRASH_INIT', '').split():
            os._exit(5)

    def train_step(self, train_data_iterator):
        time.sleep(float(os.environ.get('FAKE_STEP', '0.03')))
        if self_hang():
            time.sleep(100)
        return [], None, None

def self_hang():
    import sys
    return os.path.basename(sys.argv[sys.argv.index('--output_dir') + 1]) in os.environ.get('FAKE_HANG', '').split()
'''

FAKE_TORCH = '''
class _Cuda:
    @staticmethod
    def is_available():
        return False

class _Dist:
    @staticmethod
    def is_initialized():
        return False

cuda = _Cuda()
distributed = _Dist()
_threads = [10]


def get_num_threads():
    return _threads[0]


def set_num_threads(n):
    _threads[0] = n
'''

FAKE_MEGATRON = '''#!{python}
import os, sys, threading, time
sys.path.insert(0, {py!r})  # the stand-in swift.megatron.trainers.base and torch
argv = sys.argv
key = os.path.basename(argv[argv.index('--output_dir') + 1])
iters = int(argv[argv.index('--train_iters') + 1])
time.sleep(float(os.environ.get('FAKE_STARTUP', '0.5')))  # start-up (CPU work) stand-in
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # a thread made before the turn
if key in os.environ.get('FAKE_CRASH_START', '').split():
    sys.exit(3)
from swift.megatron.trainers.base import BaseMegatronTrainer
t = BaseMegatronTrainer(key)
for _ in range(iters + 5):
    t.train_step(None)
sys.exit(7)  # not reached: the probe exits after STEP_PROBE_STOP
'''


def make_fake(d):
    pkg = os.path.join(d, 'py', 'swift', 'megatron', 'trainers')
    os.makedirs(pkg)
    for p in ('swift', 'swift/megatron', 'swift/megatron/trainers'):
        open(os.path.join(d, 'py', p, '__init__.py'), 'w').close()
    with open(os.path.join(pkg, 'base.py'), 'w') as f:
        f.write(FAKE_BASE)
    os.makedirs(os.path.join(d, 'py', 'torch'))
    with open(os.path.join(d, 'py', 'torch', '__init__.py'), 'w') as f:
        f.write(FAKE_TORCH)
    exe = os.path.join(d, 'megatron')
    with open(exe, 'w') as f:
        f.write(FAKE_MEGATRON.format(python=sys.executable, py=os.path.join(d, 'py')))
    os.chmod(exe, os.stat(exe).st_mode | stat.S_IEXEC)
    return exe


def launch(tmp_path, monkeypatch, args, **env):
    exe = make_fake(str(tmp_path / 'fake'))
    work = tmp_path / 'work'
    monkeypatch.setenv('FAKE_GPU_LOG', str(tmp_path / 'gpu.jsonl'))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    mask = os.sched_getaffinity(0)
    try:  # main() pins its own process to the start cores: this one, here
        tput_launch.main(['--work', str(work), '--model', 'M', '--data-k1', 'D1', '--data-k4', 'D4', '--megatron',
                          exe, '--iters', '4', '--poll', '0.02', *args])
    finally:
        os.sched_setaffinity(0, mask)
    gpu = [json.loads(x) for x in open(tmp_path / 'gpu.jsonl')] if (tmp_path / 'gpu.jsonl').exists() else []
    return work, json.load(open(work / 'probes' / 'launch.json')), gpu


def max_overlap(intervals):
    ev = sorted([(s, 1) for s, e in intervals] + [(e, -1) for s, e in intervals])
    n = m = 0
    for _, d in ev:
        n += d
        m = max(m, n)
    return m


def test_turns_interleaved_order_lookahead_crashes_hang_and_pinning(tmp_path, monkeypatch, capsys):
    cpus = sorted(os.sched_getaffinity(0))
    pin = ['--train-cpus', str(cpus[0]), '--start-cpus', str(cpus[1])] if len(cpus) >= 2 else []
    work, launch_rec, gpu = launch(
        tmp_path, monkeypatch, ['--rounds', '2', '--rounds-m8', '1', '--lookahead', '3', '--run-timeout', '3', *pin],
        FAKE_CRASH_START='plt1_r1', FAKE_CRASH_INIT='plt4_r1', FAKE_HANG='plt1_r2')
    runs = {r['key']: r for r in launch_rec['runs']}
    order = [r['key'] for r in launch_rec['runs']]
    assert order == ['stock_r1', 'plt1_r1', 'plt4_r1', 'stock_r2', 'plt1_r2', 'plt4_r2', 'stock_m8_r1', 'plt1_m8_r1',
                     'plt4_m8_r1']
    # the GPU phase (the trainer's __init__) is entered in the interleaved order, never by the run that crashed
    # during its start-up; a crash after the turn and a hang (killed after --run-timeout) do not stall the rest
    assert [g['key'] for g in gpu] == [k for k in order if k != 'plt1_r1']
    assert runs['plt1_r1']['state'] == 'failed' and runs['plt1_r1']['rc'] == 3
    assert runs['plt4_r1']['state'] == 'failed' and runs['plt4_r1']['rc'] == 5
    assert runs['plt1_r2']['state'] == 'killed'
    assert all(runs[k]['state'] == 'done' and runs[k]['rc'] == 0 for k in order
               if k not in ('plt1_r1', 'plt4_r1', 'plt1_r2'))
    # one run at a time in its GPU phase: each GPU phase starts after the previous run's process exited
    for a, b in zip(gpu, gpu[1:]):
        assert b['t'] >= launch_rec['t0'] + runs[a['key']]['exit'] - 0.05
    # at most `lookahead` processes alive, and start-ups overlapped (the pipeline did pipeline)
    iv = [(r['start'], r['exit']) for r in launch_rec['runs']]
    assert launch_rec['max_alive_seen'] <= 3 and max_overlap(iv) <= 3
    assert max_overlap(iv) >= 2
    # every process ran on the start cores until its turn, then all its threads on the training cores
    if pin:
        for g in gpu:
            assert g['cpus'] == [cpus[0]] and g['threads'] >= 2
            assert all(c == [cpus[0]] for c in g['thread_cpus']), g
        t = json.load(open(work / 'probes' / 'stock_r1.jsonl.turn.json'))
        assert t['cpus_before'] == [cpus[1]] and t['cpus_after'] == [cpus[0]]
        assert t["torch_threads"] == [10, 1]  # the intra-op pool fits the one training core (fit_torch_threads)
    # per-run records for the summary: meta (MBS, K, max_length), turn times, steps with wall time
    meta = json.load(open(work / 'probes' / 'plt4_m8_r1.meta.json'))
    assert (meta['mbs'], meta['k'], meta['max_length'], meta['gbs']) == (8, 4, 8192, 16)
    rows = [json.loads(x) for x in open(work / 'probes' / 'plt4_m8_r1.jsonl')]
    assert [r['step'] for r in rows] == [1, 2, 3, 4]
    capsys.readouterr()
    figs, summary = throughput_summary.main([str(work / 'probes'), '--warm', '1'])
    out = capsys.readouterr().out
    assert 'TPUT launcher: lookahead 3' in out and 'failed: plt1_r1 plt4_r1' in out and 'killed: plt1_r2' in out
    assert figs[('plt4_m8', 1)]['wait_s'] >= 0 and figs[('plt4_m8', 1)]['turn_to_step1_s'] > 0
    assert set(summary) >= {'mbs4 plt4/stock', 'mbs8 plt4/stock', 'mbs8 plt1/stock'}
    assert len(summary['mbs4 plt4/stock']['per_round']) == 1  # round 1's plt4 failed


def test_budget_cut(tmp_path, monkeypatch):
    """No turn with less than --turn-secs left; every process is killed at the deadline; launch.json is written."""
    stale = tmp_path / 'work' / 'probes' / 'plt4_m8_r1.jsonl'  # from an earlier call on the same machine
    stale.parent.mkdir(parents=True)
    stale.write_text('{"step": 1, "t_end": 0.0}\n')
    other = stale.parent / 'plt4_m4_r9.meta.json'  # a round this call does not run
    other.write_text('{}')
    old_out = tmp_path / 'work' / 'runs' / 'plt4_m8_r1' / 'v0-old'  # ms-swift's output dir of the earlier call
    old_out.mkdir(parents=True)
    t = time.time()
    work, rec, gpu = launch(tmp_path, monkeypatch, ['--rounds', '3', '--rounds-m8', '1', '--lookahead', '2',
                                                   '--deadline', str(t + 4.0), '--turn-secs', '1.5',
                                                   '--min-start-secs', '0'],
                            FAKE_STEP='0.3')
    took = time.time() - t
    states = [r['state'] for r in rec['runs']]
    assert took < 4.0 + 8  # the deadline plus the kills' grace periods
    assert states[0] == 'done' and 'skipped' in states and states[-1] == 'skipped'
    assert all(s in ('done', 'skipped', 'killed') for s in states)
    # every run that got the GPU got it with at least --turn-secs left
    for g in gpu:
        assert g['t'] <= t + 4.0 - 1.5 + 0.5
    for r in rec['runs']:  # nothing left running
        assert r['state'] in ('done', 'skipped', 'killed')
    assert rec['max_alive_seen'] <= 2
    assert not stale.exists() and not other.exists() and not old_out.exists()


def test_wait_file_gates_the_first_turn(tmp_path, monkeypatch):
    """The first turn waits for --wait-file (the weights, made while the first runs start up)."""
    wf = tmp_path / 'weights'
    import threading
    threading.Timer(1.5, lambda: wf.write_text('x')).start()
    t = time.time()
    work, rec, gpu = launch(tmp_path, monkeypatch, ['--rounds', '1', '--rounds-m8', '0', '--names', 'stock plt4',
                                                   '--wait-file', str(wf)], FAKE_STARTUP='0.1')
    assert [g['key'] for g in gpu] == ['stock_r1', 'plt4_r1']
    assert gpu[0]['t'] >= t + 1.5


def test_cpu_split():
    assert tput_launch.cpu_split(range(16), 3) == (list(range(6)), list(range(6, 16)))
    assert tput_launch.cpu_split(range(8), 3) == ([0, 1, 2, 3], [4, 5, 6, 7])
    assert tput_launch.cpu_split(range(2), 3) == ([0, 1], [0, 1])  # no pinning on small machines
    assert tput_launch.cpu_split(range(16), 1) == (list(range(16)), list(range(16)))  # serial
    assert tput_launch.fmt_cpus([0, 1, 2, 5, 7, 8]) == '0-2,5,7-8'
    assert tput_launch.expand('0-2,5,7-8') == [0, 1, 2, 5, 7, 8]


def test_probe_turn_helpers(tmp_path):
    sys.path.insert(0, os.path.join(HERE, 'step_probe'))
    try:
        import importlib
        sc = importlib.import_module('sitecustomize')
        if not hasattr(sc, 'wait_for_turn'):  # an installed sitecustomize was imported first
            spec = importlib.util.spec_from_file_location(
                '_probe', os.path.join(HERE, 'step_probe', 'sitecustomize.py'))
            sc = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(sc)
    finally:
        sys.path.pop(0)
    assert sc.parse_cpus('0-2,5') == {0, 1, 2, 5} and sc.parse_cpus('') == set()
    f = tmp_path / 'turn'
    f.write_text('3')
    with pytest.raises(TimeoutError):
        sc.wait_for_turn(str(f), 2, poll=0.01, timeout=0.1)
    assert sc.wait_for_turn(str(f), 3, poll=0.01, timeout=0.1) < 0.1
    mine = os.sched_getaffinity(0)
    assert sc.move_all_threads(mine) >= 1 and os.sched_getaffinity(0) == mine


def _probe_dir(tmp_path, spec):
    """spec: {(name, round): (base, mbs, step_s)} -> synthetic probe files (8 steps at constant step_s)."""
    d = tmp_path / 'probes'
    d.mkdir()
    for (name, r), (base, mbs, dt) in spec.items():
        k = 4 if base == 'plt4' else 1
        with open(d / f'{name}_r{r}.meta.json', 'w') as f:
            json.dump(dict(name=base, round=r, mbs=mbs, gbs=16, max_length=2048 * k, k=k), f)
        with open(d / f'{name}_r{r}.jsonl', 'w') as f:
            for s in range(1, 9):
                t = 100.0 + (20.0 if s == 1 else 20.0 + (s - 1) * dt)
                f.write(json.dumps(dict(step=s, t_end=t, wall=t, loss=12.0 + (base == 'plt4'), grad_norm=1.0,
                                        max_mem_gib=10.0 * mbs)) + '\n')
    return d


def test_summary_ratios_per_mbs_and_round(tmp_path, capsys):
    spec = {('stock', 1): ('stock', 4, 0.50), ('plt1', 1): ('plt1', 4, 0.51), ('plt4', 1): ('plt4', 4, 0.52),
            ('stock', 2): ('stock', 4, 0.60), ('plt1', 2): ('plt1', 4, 0.60), ('plt4', 2): ('plt4', 4, 0.50),
            ('stock', 3): ('stock', 4, 0.50), ('plt1', 3): ('plt1', 4, 0.55), ('plt4', 3): ('plt4', 4, 0.50),
            ('stock_m8', 1): ('stock', 8, 1.00), ('plt1_m8', 1): ('plt1', 8, 1.01), ('plt4_m8', 1): ('plt4', 8, 1.10)}
    d = _probe_dir(tmp_path, spec)
    figs, summary = throughput_summary.main([str(d), '--warm', '3', '--json', str(tmp_path / 't.json')])
    out = capsys.readouterr().out
    f = figs[('plt4_m8', 1)]
    assert f['steps_timed'] == 5 and f['step_s_median'] == pytest.approx(1.10)
    assert f['tokens_per_s'] == pytest.approx(16 * 8192 / 1.10)
    assert f['mfu'] == pytest.approx(16 * 8192 / 1.10 / 4 * throughput_summary.FLOPS_PER_POSITION / 989e12)
    assert figs[('stock', 2)]['tokens_per_s'] == pytest.approx(16 * 2048 / 0.60)
    # ratios of runs of the same MBS and round only
    r4 = [4 * 0.50 / 0.52, 4 * 0.60 / 0.50, 4 * 0.50 / 0.50]
    assert summary['mbs4 plt4/stock']['per_round'] == pytest.approx(r4)
    assert summary['mbs4 plt4/stock']['median'] == pytest.approx(sorted(r4)[1])
    assert summary['mbs4 plt4/stock']['min'] == pytest.approx(min(r4))
    assert summary['mbs4 plt1/stock step time']['per_round'] == pytest.approx([0.51 / 0.50, 1.0, 0.55 / 0.50])
    assert summary['mbs8 plt4/stock']['per_round'] == pytest.approx([4 / 1.10])
    assert summary['mbs8 plt1/stock']['per_round'] == pytest.approx([1 / 1.01])
    assert 'TPUT ratio mbs 8 plt4/stock: median 3.636' in out
    assert json.load(open(tmp_path / 't.json'))['ratios']['mbs4 plt4/stock']['per_round'] == pytest.approx(r4)


def test_summary_reads_probe_dirs_without_meta(tmp_path):
    """Probe dirs without .meta.json (written before tput_launch.py): S and K from the name, GBS from --gbs."""
    d = _probe_dir(tmp_path, {('stock', 1): ('stock', 4, 0.50), ('plt4', 1): ('plt4', 4, 0.52)})
    for f in d.glob('*.meta.json'):
        f.unlink()
    figs, summary = throughput_summary.main([str(d), '--warm', '3', '--gbs', '16'])
    assert figs[('stock', 1)]['tokens_per_s'] == pytest.approx(16 * 2048 / figs[('stock', 1)]['step_s_median'])
    assert figs[('plt4', 1)]['k'] == 4 and 'mbs4 plt4/stock' in summary


def test_plan_order():
    keys = lambda p: [k for k, *_ in p]  # noqa: E731
    assert keys(tput_launch.plan(['a', 'b'], 2, 1, 4)) == ['a_r1', 'b_r1', 'a_r2', 'b_r2', 'a_m8_r1', 'b_m8_r1']
    assert keys(tput_launch.plan(['a', 'b'], 3, 1, 4, m8_after=2)) == [
        'a_r1', 'b_r1', 'a_r2', 'b_r2', 'a_m8_r1', 'b_m8_r1', 'a_r3', 'b_r3']
    assert [m for *_, m in tput_launch.plan(['a'], 2, 1, 4, m8_after=1)] == [4, 8, 4]
    # rotated: every name takes every place once over len(names) rounds, MBS 8 rounds rotated on their own
    p = tput_launch.plan(['a', 'b', 'c'], 3, 2, 4, m8_after=2, rotate=True, warmup=True)
    assert keys(p) == ['a_r0', 'a_r1', 'b_r1', 'c_r1', 'b_r2', 'c_r2', 'a_r2', 'a_m8_r1', 'b_m8_r1', 'c_m8_r1',
                       'b_m8_r2', 'c_m8_r2', 'a_m8_r2', 'c_r3', 'a_r3', 'b_r3']
    assert p[0] == ('a_r0', 'a', 0, 4)
    rounds = [[b for _, b, r, m in p if r == i and m == 4] for i in (1, 2, 3)]
    assert all(sorted(rnd) == ['a', 'b', 'c'] for rnd in rounds)
    assert all(sorted(rnd[place] for rnd in rounds) == ['a', 'b', 'c'] for place in range(3))


def test_ratios_by_mbs_pairs_runs_of_one_round_and_mbs_with_the_stock2_control():
    f = lambda name, mbs, tps, step: dict(name=name, mbs=mbs, tokens_per_s=tps, step_s_median=step)  # noqa: E731
    figs = {('stock', 1): f('stock', 4, 100.0, 0.50), ('plt1', 1): f('plt1', 4, 95.0, 0.55),
            ('plt4', 1): f('plt4', 4, 390.0, 0.52), ('stock2', 1): f('stock2', 4, 98.0, 0.51),
            ('stock', 0): f('stock', 4, 90.0, 0.60),  # the warm-up round: alone, in no ratio
            ('stock_m8', 1): f('stock', 8, 200.0, 0.40), ('plt4_m8', 1): f('plt4', 8, 700.0, 0.46),
            ('plt1', 2): None}
    r = throughput_summary.ratios_by_mbs(figs)
    assert r[4]['plt4/stock'] == [3.9] and r[4]['plt1/stock'] == [0.95]
    assert r[4]['plt1/stock step time'] == [pytest.approx(1.1)] and r[4]['stock2/stock step time'] == [
        pytest.approx(1.02)]
    assert r[8]['plt4/stock'] == [3.5] and r[8]['stock2/stock step time'] == [] and r[8]['plt1/stock'] == []


def test_plan_runs_a_name_at_its_own_micro_batch_size():
    p = tput_launch.plan(['stock@8', 'plt4@16', 'stock2@8'], 2, 0, 4, rotate=True, warmup=True)
    assert p[0] == ('stock_mb8_r0', 'stock', 0, 8)
    assert [k for k, *_ in p[1:4]] == ['stock_mb8_r1', 'plt4_mb16_r1', 'stock2_mb8_r1']
    assert {(b, m) for _, b, _, m in p} == {('stock', 8), ('plt4', 16), ('stock2', 8)}


def test_best_setting_ratio_takes_each_runs_fastest_micro_batch_size():
    f = lambda name, mbs, tps: dict(name=name, mbs=mbs, tokens_per_s=tps, step_s_median=1.0)  # noqa: E731
    figs = {('stock_mb8', 1): f('stock', 8, 100.0), ('stock2_mb8', 1): f('stock2', 8, 96.0),
            ('plt4_mb16', 1): f('plt4', 16, 450.0), ('plt4_mb8', 1): f('plt4', 8, 420.0),
            ('stock_mb8', 0): f('stock', 8, 50.0),  # warm-up: in no ratio
            ('stock_mb8', 2): f('stock', 8, 100.0), ('plt4_mb8', 2): f('plt4', 8, 430.0),
            ('plt4_mb16', 2): f('plt4', 16, 410.0)}
    r = throughput_summary.best_setting_ratios(figs)
    assert r['plt4/stock'] == [(4.5, 16, 8), (4.3, 8, 8)] and r['stock2/stock'] == [(0.96, 8, 8)]
    assert throughput_summary.best_setting_ratios({('stock', 1): f('stock', 4, 1.0)}) is None


def test_wait_gpu_free_waits_until_a_killed_run_has_released_its_memory(tmp_path, monkeypatch):
    """After a kill the launcher polls nvidia-smi until every visible GPU is below the limit (a fake nvidia-smi
    reports 76 GiB twice, then 600 MiB); it gives up after the timeout, and waits not at all without nvidia-smi."""
    calls = tmp_path / 'calls'
    fake = tmp_path / 'nvidia-smi'
    fake.write_text('#!/bin/sh\necho x >> "%s"\nn=$(wc -l < "%s")\n'
                    'if [ "$n" -le 2 ]; then echo 77980; echo 600; else echo 600; echo 600; fi\n' % (calls, calls))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv('PATH', f'{tmp_path}{os.pathsep}{os.environ["PATH"]}')
    waited, used = tput_launch.wait_gpu_free(poll=0.01)
    assert used == [600, 600] and len(calls.read_text().split()) == 3
    calls.unlink()
    fake.write_text('#!/bin/sh\necho 77980\n')
    waited, used = tput_launch.wait_gpu_free(timeout=0.2, poll=0.01)
    assert used == [77980] and 0.2 <= waited < 5
    monkeypatch.setenv('PATH', str(tmp_path / 'none'))
    assert tput_launch.wait_gpu_free() == (pytest.approx(0, abs=1), [])
