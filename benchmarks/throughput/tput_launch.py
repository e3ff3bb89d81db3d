#!/usr/bin/env python3
"""Pipelined launcher of throughput_1b.sh: `megatron pt` runs start up concurrently, the GPU is used by one
run at a time, in the interleaved order.

    python3 benchmarks/throughput/tput_launch.py --work W --model M --data-k1 D1 --data-k4 D4 [options]

The run list is ``--rounds`` rounds of ``--names`` at MBS ``--mbs`` (stock plt1 plt4 stock plt1 plt4 ...), then
``--rounds-m8`` rounds of the same names at MBS 8 (``stock_m8`` ...), all at the same GBS: a budget cut drops the
MBS 8 runs first, then the last MBS 4 rounds. ``--m8-after N`` puts the MBS 8 rounds after the first N MBS-4 rounds
instead (e.g. 2: A B C A B C A8 B8 C8 A B C; a cut then drops the third MBS-4 round first). Per run:
  * the process is started (``megatron pt``, its own session) pinned to the start cores (``--start-cpus``) when at most
    ``--lookahead`` - 1 other runs are alive; it does its start-up (imports, megatron init, tokenisation, packing) at
    once, then waits in ``BaseMegatronTrainer.__init__`` for its turn (step_probe/sitecustomize.py);
  * the turn file ``W/turn`` gets the run's index once every earlier run's process (and all its descendants) has
    exited, or was skipped; the probe then moves all its threads to the training cores (``--train-cpus``);
  * a run gets no turn if less than ``max(--turn-secs, longest turn-to-exit seen so far)`` seconds are left before
    ``--deadline`` (epoch seconds); at the deadline every process still alive is killed; a run that holds the turn
    longer than ``--run-timeout`` s is killed (a hang costs one run, not the call).
Records per run: ``W/probes/NAME_rR.meta.json`` (name, MBS, GBS, max_length, K) and ``W/probes/launch.json`` (start,
turn, exit times, rc, state) for throughput_summary.py; logs in ``W/runs/NAME_rR.log``.
``--wait-file F``: no turn before F exists (throughput_1b.sh makes the weights while the first runs start up).
``--lookahead 1`` is the serial mode (one process at a time, no overlap).
``--family LABEL=DIR`` (families.sh): runs LABEL_stock / LABEL_plt4 (LABEL_plt1 if named) of DIR through its own
ms-swift model type (config.json's model_type), instead of the Llama runs of ``--model``; ``--template`` for all.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))  # megatron pt runs here (custom_model/llama.py)
PROBE_DIR = os.path.join(HERE, 'step_probe')
sys.path.insert(0, HERE)
from process_tree import _alive, _children, descendants  # noqa: E402
from run_order import cpu_split, expand, fmt_cpus, plan  # noqa: E402,F401  (tests and the summary use them here)

# name -> (model args, SWIFT_PLT_DISABLE, K, max_length at K) ; the max_length is the same 2048 positions
BASES = {
    'stock': (['--model_type', 'llama'], '1', 1),
    'plt1': (['--model_type', 'llama3_2_plt', '--custom_register_path', 'custom_model/llama.py', '--patch_size', '1'],
             '0', 1),
    'plt4': (['--model_type', 'llama3_2_plt', '--custom_register_path', 'custom_model/llama.py', '--patch_size', '4'],
             '0', 4),
}
BASES['stock2'] = BASES['stock']  # the control: the same stock run again, so stock2/stock is the noise floor
POSITIONS = 2048
MODELS = {}  # base name -> model dir, for --family runs (default: --model)


def family_bases(label, model_type):
    """Runs of one --family LABEL=DIR: the family's own ms-swift model type (config.json model_type), stock with the
    plugin off, and --patch_size 1 / 4 (the plugin swaps in its gpt_plt model at K > 1)."""
    return {
        f'{label}_stock': (['--model_type', model_type], '1', 1),
        f'{label}_plt1': (['--model_type', model_type, '--patch_size', '1'], '0', 1),
        f'{label}_plt4': (['--model_type', model_type, '--patch_size', '4'], '0', 4),
    }


def add_families(specs):
    """['LABEL=DIR', ...] -> the default run names (LABEL_stock LABEL_plt4 per family); registers their bases."""
    names = []
    for spec in specs:
        label, _, d = spec.partition('=')
        if not label or not d or '_r' in label:
            raise SystemExit(f'--family {spec!r}: expected LABEL=DIR (LABEL without "_r")')
        with open(os.path.join(d, 'config.json')) as f:
            model_type = json.load(f)['model_type']
        for name, base in family_bases(label, model_type).items():
            BASES[name] = base
            MODELS[name] = d
        names += [f'{label}_stock', f'{label}_plt4']
    return names


def wait_gpu_free(limit_mib=8192, timeout=90.0, poll=0.5):
    """Wait until every visible GPU uses < limit_mib (the waiting runs hold only their CUDA contexts), so that
    the next turn does not start out of memory; (seconds waited, last per-GPU readings). Without nvidia-smi: no wait."""
    t0 = time.time()
    vis = os.environ.get('CUDA_VISIBLE_DEVICES')
    cmd = ['nvidia-smi', '--query-gpu=memory.used', '--format=csv,noheader,nounits'] + (['-i', vis] if vis else [])
    used = []
    while True:
        try:
            used = [int(x) for x in subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.split()]
        except (OSError, ValueError, subprocess.SubprocessError):
            return time.time() - t0, used
        if all(u < limit_mib for u in used) or time.time() - t0 > timeout:
            return time.time() - t0, used
        time.sleep(poll)


class Run:

    def __init__(self, idx, key, base, rnd, mbs):
        self.idx, self.key, self.base, self.round, self.mbs = idx, key, base, rnd, mbs
        self.proc = None
        self.known = set()  # descendants seen (torchrun's worker runs in a session of its own)
        self.state = 'pending'  # pending -> started -> (turn) -> done | failed | killed | skipped
        self.t_start = self.t_turn = self.t_exit = None
        self.rc = None

    def record(self, t0):
        rel = (lambda t: None if t is None else round(t - t0, 2))
        return dict(idx=self.idx, key=self.key, base=self.base, round=self.round, mbs=self.mbs, state=self.state,
                    rc=self.rc, start=rel(self.t_start), turn=rel(self.t_turn), exit=rel(self.t_exit))


class Launcher:

    def __init__(self, a):
        self.a = a
        self.t0 = time.time()
        self.runs = [Run(i, *x) for i, x in enumerate(plan(a.names.split(), a.rounds, a.rounds_m8, a.mbs,
                                                           a.first_round, a.m8_after, a.rotate, a.warmup))]
        self.turn_file = os.path.join(a.work, 'turn')
        os.makedirs(os.path.join(a.work, 'runs'), exist_ok=True)
        os.makedirs(os.path.join(a.work, 'probes'), exist_ok=True)
        # an earlier call's records on the same machine would enter the summary: its probes (runs of other rounds
        # too) and its ms-swift output dirs (a rerun adds a v1-... beside the old v0-... logging.jsonl)
        for f in os.listdir(os.path.join(a.work, 'probes')):
            if f.endswith(('.jsonl', '.jsonl.turn.json', '.jsonl.prof.json', '.meta.json', 'launch.json')):
                os.remove(os.path.join(a.work, 'probes', f))
        for r in self.runs:
            shutil.rmtree(os.path.join(a.work, 'runs', r.key), ignore_errors=True)
        self.max_alive_seen = 0
        self.longest_turn = 0.0
        self.events = []

    def log(self, msg):
        line = f'TPUT [{time.time() - self.t0:6.1f} s] {msg}'
        print(line, flush=True)
        self.events.append(line)

    def write_turn(self, idx):
        tmp = self.turn_file + '.tmp'
        with open(tmp, 'w') as f:
            f.write(str(idx))
        os.replace(tmp, self.turn_file)

    def command(self, run):
        a = self.a
        model_args, disable, k = BASES[run.base]
        max_len = a.positions * k
        data = a.data_k4 if k > 1 else a.data_k1
        od = os.path.join(a.work, 'runs', run.key)
        probe = os.path.join(a.work, 'probes', run.key + '.jsonl')
        for p in (probe, probe + '.turn.json', probe + '.prof.json'):
            if os.path.exists(p):
                os.remove(p)
        with open(os.path.join(a.work, 'probes', run.key + '.meta.json'), 'w') as f:
            json.dump(dict(name=run.base, round=run.round, mbs=run.mbs, gbs=a.gbs, max_length=max_len, k=k,
                           idx=run.idx), f)
        cmd = [a.megatron, 'pt', *model_args, '--max_length', str(max_len), '--model', MODELS.get(run.base, a.model),
               '--template', a.template, '--dataset', data, '--packing', 'true', '--micro_batch_size', str(run.mbs),
               '--global_batch_size', str(a.gbs), '--train_iters', str(max(a.iters, a.profile_step)), '--lr', '1e-4',
               '--min_lr', '1e-5', '--lr_warmup_iters', '2', '--attention_backend', 'fused', '--bf16', 'true',
               '--seed', '42', '--logging_steps', '1', '--save_steps', '1000000', '--no_save_optim', 'true',
               '--no_save_rng', 'true', '--save_safetensors', 'false', '--split_dataset_ratio', '0',
               '--output_dir', od, '--dataloader_num_workers', '2', '--dataset_num_proc', str(a.dataset_num_proc),
               '--report_to', 'tensorboard', *a.extra_args.split()]
        prof = a.profile_step if (a.profile_step and run.round == a.first_round and not run.base.startswith('stock')
                                  and run.mbs == a.mbs) else 0
        env = dict(os.environ)
        env.update({
            'SWIFT_PLT_DISABLE': disable,
            'NPROC_PER_NODE': str(a.nproc),
            'MASTER_PORT': str(29500 + 37 * (run.idx % 50) + 11),
            'HF_DATASETS_CACHE': os.path.join(a.work, 'cache'),
            'TORCHINDUCTOR_CACHE_DIR': os.path.join(a.work, 'inductor_cache'),
            'PYTHONPATH': PROBE_DIR + (':' + os.environ['PYTHONPATH'] if os.environ.get('PYTHONPATH') else ''),
            'STEP_PROBE_OUT': probe,
            'STEP_PROBE_STOP': str(max(a.iters, prof)),
            'STEP_PROBE_PROFILE_STEP': str(prof),
            'STEP_PROBE_TURN_FILE': self.turn_file,
            'STEP_PROBE_TURN_ID': str(run.idx),
            'STEP_PROBE_T_LAUNCH': repr(time.time()),
        })
        if a.train_cpus != a.start_cpus:
            env['STEP_PROBE_TRAIN_CPUS'] = a.train_cpus
        return cmd, env, od

    def start(self, run):
        cmd, env, od = self.command(run)
        os.makedirs(od, exist_ok=True)
        start_cpus = set(int(c) for c in expand(self.a.start_cpus))

        def pin():
            try:
                os.sched_setaffinity(0, start_cpus)
            except OSError:
                pass

        log = open(os.path.join(self.a.work, 'runs', run.key + '.log'), 'w')
        run.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, preexec_fn=pin)
        log.close()
        run.t_start = time.time()
        run.state = 'started'
        self.log(f'start {run.key} (mbs {run.mbs}, pid {run.proc.pid}, cpus {self.a.start_cpus})')

    def kill(self, runs, why):
        """SIGTERM, then SIGKILL, every process of ``runs`` (the CLI, torchrun's worker, dataloader workers)."""
        runs = [runs] if isinstance(runs, Run) else list(runs)
        kids = _children()
        pids = set()
        for run in runs:
            pids |= run.known
            if run.proc is not None:
                pids |= {run.proc.pid, *descendants(run.proc.pid, kids)}
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in pids:
                try:
                    os.kill(p, sig)
                except OSError:
                    pass
            t = time.time()
            while time.time() - t < 3 and any(_alive(p) for p in pids):
                for run in runs:
                    if run.proc is not None:
                        run.proc.poll()
                time.sleep(0.05)
        for run in runs:
            if run.proc is not None:
                try:
                    run.proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    pass
            run.rc = run.proc.returncode if run.proc is not None else None
            run.t_exit = time.time()
            run.state = 'killed'
            self.log(f'killed {run.key}: {why}')
        if any(run.t_turn for run in runs):  # a killed rank can hold its GPU memory for seconds after its exit
            waited, used = wait_gpu_free()
            self.log(f'GPU memory after the kill: {used} MiB per GPU (waited {waited:.1f} s)')

    def reap(self, run):
        """The run's CLI has exited: wait for (then kill) what is left of its tree, so that the GPU is free."""
        left = [p for p in run.known if _alive(p)]
        t = time.time()
        while left and time.time() - t < 5:
            time.sleep(0.05)
            left = [p for p in left if _alive(p)]
        for p in left:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        run.rc = run.proc.returncode
        run.t_exit = time.time()
        run.state = 'done' if run.rc == 0 else 'failed'
        gpu_from = run.t_turn
        if run.t_turn:  # the probe's record: when the process reached the turn gate (it may have had the turn earlier)
            try:
                with open(os.path.join(self.a.work, 'probes', run.key + '.jsonl.turn.json')) as f:
                    gpu_from = max(run.t_turn, json.load(f)['wait_start'])
            except (OSError, ValueError, KeyError):
                pass
        took = f', turn to exit {run.t_exit - gpu_from:.1f} s' if run.t_turn else ' (before its turn)'
        self.log(f'exit {run.key}: rc={run.rc} after {run.t_exit - run.t_start:.1f} s{took}'
                 + (f', {len(left)} leftover process(es) killed' if left else ''))
        if run.t_turn and run.rc == 0:
            self.longest_turn = max(self.longest_turn, run.t_exit - gpu_from)
        try:  # packed rows: fewer than ITERS * GBS would start a second epoch within the timed steps
            sizes = [x.split('size=')[-1].strip() for x in open(os.path.join(self.a.work, 'runs', run.key + '.log'),
                                                                 errors='replace') if 'Dataset Token Length' in x]
            if sizes:
                self.log(f'  {run.key}: packed rows {sizes[-1]} (a run uses {self.a.iters * self.a.gbs})')
        except OSError:
            pass
        if run.rc != 0:
            try:
                tail = open(os.path.join(self.a.work, 'runs', run.key + '.log'), errors='replace').read()[-2000:]
                print('\n'.join('  | ' + x for x in tail.splitlines()[-15:]), flush=True)
            except OSError:
                pass

    def loop(self):
        a = self.a
        runs = self.runs
        turn = 0
        granted = -1
        last_scan = 0.0
        if os.path.exists(self.turn_file):
            os.remove(self.turn_file)
        while True:
            now = time.time()
            alive = [r for r in runs if r.state == 'started']
            if now >= a.deadline:
                self.kill(alive, 'budget')
                for r in runs:
                    if r.state == 'pending':
                        r.state = 'skipped'
                self.log('deadline reached')
                break
            if now - last_scan > 0.5 and alive:  # remember each run's descendants (killed with it)
                kids = _children()
                for r in alive:
                    r.known |= set(descendants(r.proc.pid, kids))
                last_scan = now
            for r in alive:
                if r.proc.poll() is not None:
                    self.reap(r)
                elif r.t_turn and now - r.t_turn > a.run_timeout:
                    self.kill(r, f'held the turn longer than {a.run_timeout} s')
            # advance the turn past finished / skipped runs
            while turn < len(runs) and runs[turn].state in ('done', 'failed', 'killed', 'skipped'):
                turn += 1
            if turn >= len(runs):
                break
            left = a.deadline - now
            need = max(a.turn_secs, self.longest_turn)
            if granted != turn and a.wait_file and not os.path.exists(a.wait_file):
                if a.fail_file and os.path.exists(a.fail_file):
                    self.log(f'{a.fail_file} exists: no turn for any run')
                    self.kill([r for r in runs if r.state == 'started'], 'aborted')
                    for r in runs[turn:]:
                        r.state = 'skipped'
                    break
                pass  # no turn before the model's weights are complete (made while the first runs start up)
            elif granted != turn:
                if left < need:
                    self.log(f'budget: {left:.0f} s left < {need:.0f} s needed for a turn: '
                             f'{len(runs) - turn} run(s) skipped')
                    self.kill([r for r in runs[turn:] if r.state == 'started'], 'no turn (budget)')
                    for r in runs[turn:]:
                        r.state = 'skipped'
                    break
                if a.wait_file and turn == 0:
                    self.log(f'{a.wait_file} present')
                self.write_turn(turn)
                granted = turn
                runs[turn].t_turn = now
                self.log(f'turn -> {runs[turn].key}' + ('' if runs[turn].state == 'started' else ' (not started)'))
            # start processes: at most `lookahead` alive, in order
            alive = [r for r in runs if r.state == 'started']
            self.max_alive_seen = max(self.max_alive_seen, len(alive))
            nxt = next((r for r in runs if r.state == 'pending'), None)
            if nxt is not None and len(alive) < a.lookahead:
                # a run started now has its turn after the ones before it: skip the start if no turn could come
                if left < need + a.min_start_secs and nxt.idx != turn:
                    nxt.state = 'skipped'
                    self.log(f'skip start of {nxt.key}: {left:.0f} s left')
                else:
                    self.start(nxt)
                    self.max_alive_seen = max(self.max_alive_seen, len(alive) + 1)
                continue
            time.sleep(a.poll)
        left_alive = [r for r in runs if r.state == 'started']  # none by construction; never leave one behind
        if left_alive:
            self.kill(left_alive, 'launcher exiting')
        with open(os.path.join(a.work, 'probes', 'launch.json'), 'w') as f:
            json.dump(dict(t0=self.t0, lookahead=a.lookahead, train_cpus=a.train_cpus, start_cpus=a.start_cpus,
                           dataset_num_proc=a.dataset_num_proc, max_alive_seen=self.max_alive_seen,
                           runs=[r.record(self.t0) for r in runs], events=self.events), f, indent=1)
        self.log(f'launcher done: {sum(r.state == "done" for r in runs)} of {len(runs)} runs ok, '
                 f'at most {self.max_alive_seen} alive (lookahead {a.lookahead})')


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--work', required=True)
    ap.add_argument('--model', default=None, help='the model of the stock/plt1/plt4 runs (Llama)')
    ap.add_argument('--family', action='append', default=[],
                    help='LABEL=DIR (repeatable): runs LABEL_stock, LABEL_plt4 (and LABEL_plt1 if named) of that dir '
                    'through its own model type; --names defaults to them')
    ap.add_argument('--template', default='llama3_2', help='ms-swift template of every run')
    ap.add_argument('--data-k1', required=True)
    ap.add_argument('--data-k4', required=True)
    ap.add_argument('--names', default=None, help='default: stock plt1 plt4, or the --family runs')
    ap.add_argument('--rounds', type=int, default=3)
    ap.add_argument('--rounds-m8', type=int, default=1)
    ap.add_argument('--first-round', type=int, default=1)
    ap.add_argument('--m8-after', type=int, default=None, help='MBS-4 rounds before the MBS 8 rounds (default: all)')
    ap.add_argument('--rotate', action='store_true', help='rotate the order of the names from round to round')
    ap.add_argument('--warmup', action='store_true', help='one run of the first name before round 1 (round 0)')
    ap.add_argument('--mbs', type=int, default=4)
    ap.add_argument('--gbs', type=int, default=16)
    ap.add_argument('--iters', type=int, default=12)
    ap.add_argument('--profile-step', type=int, default=0)
    ap.add_argument('--lookahead', type=int, default=3)
    ap.add_argument('--deadline', type=float, default=None, help='epoch seconds (default: none)')
    ap.add_argument('--turn-secs', type=float, default=45)
    ap.add_argument('--min-start-secs', type=float, default=20)
    ap.add_argument('--run-timeout', type=float, default=240)
    ap.add_argument('--train-cpus', default=None, help='default: from the affinity mask (cpu_split)')
    ap.add_argument('--start-cpus', default=None)
    ap.add_argument('--dataset-num-proc', type=int, default=None)
    ap.add_argument('--megatron', default='megatron')
    ap.add_argument('--wait-file', default=None, help='no turn is given before this file exists (the weights)')
    ap.add_argument('--fail-file', default=None, help='if it appears while waiting for --wait-file: stop')
    ap.add_argument('--poll', type=float, default=0.1)
    ap.add_argument('--positions', type=int, default=POSITIONS, help='positions per sequence: max_length = K * this')
    ap.add_argument('--nproc', type=int, default=1, help="GPUs of every run (NPROC_PER_NODE; the layout's flags go in "
                    '--extra-args)')
    ap.add_argument('--extra-args', default='', help='appended to every command line (later flags win)')
    a = ap.parse_args(argv)
    family_names = add_families(a.family)
    a.names = a.names or (' '.join(family_names) if family_names else 'stock plt1 plt4')
    if a.model is None and any(n not in MODELS for n in a.names.split()):
        ap.error('--model is required for runs that are not --family runs')
    a.deadline = a.deadline if a.deadline is not None else time.time() + 10**7
    train, start = cpu_split(os.sched_getaffinity(0), a.lookahead)
    a.train_cpus = a.train_cpus or fmt_cpus(train)
    a.start_cpus = a.start_cpus or fmt_cpus(start)
    if a.dataset_num_proc is None:  # the start cores shared by the (lookahead - 1) runs starting up at once
        a.dataset_num_proc = max(1, min(8, len(expand(a.start_cpus)) // max(1, a.lookahead - 1)))
    if a.train_cpus != a.start_cpus:  # the launcher's polling stays off the training cores too
        try:
            os.sched_setaffinity(0, set(expand(a.start_cpus)))
        except OSError:
            pass
    L = Launcher(a)
    L.log(f'{len(L.runs)} runs: {" ".join(r.key for r in L.runs)}; lookahead {a.lookahead}, train cpus '
          f'{a.train_cpus}, start cpus {a.start_cpus}, dataset_num_proc {a.dataset_num_proc}, '
          f'{a.deadline - time.time():.0f} s to the deadline')
    L.loop()
    return 0


if __name__ == '__main__':
    sys.exit(main())
