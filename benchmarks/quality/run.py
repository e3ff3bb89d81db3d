"""Quality benchmark: does the two-stage PLT recipe reach token-level quality at about half the compute?

    python benchmarks/quality/run.py --kit KIT --work W --out OUT [--sizes S M] [--tokens 10000000] ...
    (on a GPU machine: bash benchmarks/quality/run_gpu.sh, which calls this)

Per model size (make_models.py), on the same train-document stream and the same held-out rows:
  (a) token-level baseline: `megatron pt --model_type llama --train_iters N/(G*T)`        (compute 1.0)
  (b) `swift-plt-two-stage --tokens N --patch_size 4 --lam 2/3`                             (compute ~0.5)
  (c) `swift-plt-two-stage --tokens 2N --patch_size 4 --lam 2/3`                            (compute ~1.0)
  sweeps: b/c at another K or λ, e.g. --runs a b b_k2 b_l12 (variants.py)
All runs: the same T, global batch, peak LR, LR schedule shape (warm-up 5% of the steps, cosine to 10% of the peak;
stage 2 a fresh schedule with the same peak, as in the paper), seed. Data (make_run_data.py): (a) trains on the
stream's tokens [0, N); (b) stage 1 on [0, λN) cut into rows of K*T tokens, stage 2 on [λN, N) in rows of T tokens,
so (a) and (b) see the same documents and no stage repeats the other's data; (c) likewise on [0, 2N) (one epoch).
Every final model is exported to a plain HF Llama (swift-plt-export-vanilla, also for (a)) and so is the end of
stage 1 of (b) and (c); eval_heldout.py scores them all with plain transformers.

GPU time: the runs start concurrently (start-up is CPU work) but their training loops take turns on the GPU
(gpu_lock.py: an fcntl lock from the first to the last step), so each run's GPU seconds are its training loops
alone on the GPU (`train_seconds`, summed over stages). Start-up, export and eval are not counted.
"""
import argparse
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
LR = {'tiny': 1e-3, 'XS': 2e-3, 'S': 1.4e-3, 'M': 1e-3}  # peak; ~1/sqrt(width), the same in every run of a size


class Runner:

    def __init__(self, a, t0):
        self.a = a
        self.procs = []
        self.lock = threading.Lock()
        self.port = 29600
        self.deadline = t0 + a.deadline  # from the start of run.py
        self.failed = []
        self.timeline = []

    def env(self):
        with self.lock:
            self.port += 7
            port = self.port
        if self.a.cpu:
            sys.path.insert(0, os.path.join(REPO, 'tests'))
            from harness.cli import harness_env
            env = harness_env()
        else:
            env = dict(os.environ, OMP_NUM_THREADS='2')  # up to 9 runs start at once on 16 cores
        env.update({'NPROC_PER_NODE': '1', 'MASTER_PORT': str(port), 'QUAL_GPU_LOCK': os.path.join(self.a.work,
                                                                                                     'gpu.lock')})
        return env

    def run(self, name, cmd, log):
        os.makedirs(os.path.dirname(log), exist_ok=True)
        t = time.time()
        left = self.deadline - t
        if left < 10:
            self.failed.append(f'{name}: not started (deadline)')
            return 1
        with open(log, 'w') as f:
            f.write('$ ' + shlex.join(cmd) + '\n')
            f.flush()
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=self.env(), cwd=REPO,
                                 start_new_session=True)
            with self.lock:
                self.procs.append(p)
            try:
                rc = p.wait(timeout=left)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                rc = -9
        dt = time.time() - t
        self.timeline.append({'name': name, 'start': t, 'seconds': dt, 'rc': rc})
        print(f'[{time.strftime("%H:%M:%S")}] {name}: rc={rc} {dt:.0f}s', flush=True)
        if rc != 0:
            self.failed.append(f'{name}: rc={rc} (log {log})')
        return rc


def megatron_common(a, size):
    lr = a.lr or LR[size]
    args = ['--template', 'llama', '--packing', 'true', '--lr', str(lr),
            '--min_lr', str(lr / 10), '--lr_decay_style', 'cosine', '--lr_warmup_fraction', '0.05', '--seed', '42',
            '--logging_steps', str(a.logging_steps), '--save_steps', '100000', '--no_save_optim', 'true',
            '--no_save_rng', 'true', '--split_dataset_ratio', '0', '--check_model', 'false', '--dataset_num_proc',
            str(a.num_proc), '--dataloader_num_workers', '1', '--external_plugins',
            os.path.join(HERE, 'gpu_lock.py'), '--callbacks', 'gpu_lock']
    if a.cpu:
        sys.path.insert(0, os.path.join(REPO, 'tests'))
        from harness.cli import CPU_MEGATRON_ARGS
        args += ['--torch_dtype', 'float32', '--fp16', 'false', '--bf16', 'false']
        args += [x for x in CPU_MEGATRON_ARGS if x not in ('--split_dataset_ratio', '0')]
        args[args.index('--packing') + 1] = 'false'  # no THD packing on CPU (TE only)
    else:
        args += ['--torch_dtype', 'bfloat16', '--attention_backend', 'fused']
    return args


def export_args(a):
    if a.cpu:
        return ['--torch_dtype', 'float32', '--fp16', 'false', '--bf16', 'false', '--ddp_backend', 'gloo',
                '--use_cpu_initialization', 'true', '--perform_initialization', 'true', '--check_model', 'false']
    return ['--torch_dtype', 'bfloat16']


def exe(name):
    p = os.path.join(os.path.dirname(sys.executable), name)
    return p if os.path.exists(p) else name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--kit', required=True, help='prepare_data.py output (tokenizer, train_docs, heldout_ids)')
    ap.add_argument('--work', required=True)
    ap.add_argument('--out', required=True)
    ap.add_argument('--sizes', nargs='+', default=['XS', 'S', 'M'])
    ap.add_argument('--tokens', type=int, default=10_000_000, help='N')
    ap.add_argument('--seq', type=int, default=512, help='T')
    ap.add_argument('--gbs', type=int, default=32)
    ap.add_argument('--mbs', type=int, default=32)
    ap.add_argument('--lr', type=float, default=None)
    ap.add_argument('--logging_steps', type=int, default=5)
    ap.add_argument('--num_proc', type=int, default=2)
    ap.add_argument('--runs', nargs='+', default=['a', 'b', 'c'],
                    help='a, b, c and sweep variants of b/c such as b_k2, b_k8, b_l12, c_l34 (variants.py)')
    ap.add_argument('--stage1_batch', default='tokens', choices=['tokens', 'sequences'],
                    help="the recipe's --stage1_batch: stage 1 takes G/K sequences of K*T tokens per step (tokens, "
                    "the paper's set-up and the recipe's default) or G (sequences)")
    ap.add_argument('--deadline', type=float, default=420,
                    help='seconds from the start for models, data, all training and exports (then eval, report)')
    ap.add_argument('--max_parallel', type=int, default=0,
                    help='pipelines (one run of one size) at once; 0 = all. Start-up is CPU-bound: 9 at once on 16 '
                    'cores made each start-up 2-5x slower and the training steps slower too')
    ap.add_argument('--cpu', action='store_true', help='CPU dry run through the test harness flags')
    a = ap.parse_args()
    sys.path.insert(0, REPO)
    from swift_plt.recipe.plan import make_plan
    from variants import parse_run
    os.makedirs(a.work, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    N, T, G = a.tokens, a.seq, a.gbs

    # models
    models = {}
    r = subprocess.run([sys.executable, os.path.join(HERE, 'make_models.py'), os.path.join(a.kit, 'tokenizer'),
                        os.path.join(a.work, 'models'), *a.sizes], capture_output=True, text=True, check=True)
    for line in r.stdout.splitlines():
        if line.startswith('{'):
            m = json.loads(line)
            models[m['size']] = m
    print(f'models: {json.dumps(models)}', flush=True)

    # plans and data: one plan per two-stage run (its K and λ: variants.py)
    variants = {run: parse_run(run) for run in a.runs}
    budget = {run: N if base == 'b' else 2 * N for run, (base, _, _) in variants.items()}  # tokens of b, c runs
    plans = {run: make_plan(budget[run], Kr, lam_r, seq_length=T, global_batch_size=G,
                            stage1_batch=a.stage1_batch)
             for run, (base, Kr, lam_r) in variants.items() if base != 'a'}
    a_iters = N // (G * T)
    specs, margin = [], 0.04

    def spec(name, start, tokens, length, roff):
        specs.append(f'{name}:{start}:{tokens}:{length}:{roff}')
        return roff + int(tokens * margin)

    for run, (base, Kr, _) in variants.items():  # the files of the runs asked for (same cuts as always)
        if base == 'a':
            spec('a', 0, N, T, 0)
            continue
        n, n1 = budget[run], plans[run].stage1.budget_tokens
        spec(f'{run}2', n1, n - n1, T, spec(f'{run}1', 0, n1, Kr * T, 0))
    data = os.path.join(a.work, 'data')
    cutters = [subprocess.Popen([sys.executable, os.path.join(HERE, 'make_run_data.py'), a.kit, data, '--reserve_from',
                                 str(2 * N), '--spec', sp, '--stats', f'data_stats_{sp.split(":")[0]}.json'])
               for sp in specs]  # one process per file
    if any(p.wait() for p in cutters):
        raise SystemExit('make_run_data.py failed')
    print(f'data ready: {time.time() - t0:.0f}s', flush=True)

    runner = Runner(a, t0)
    threads = []

    def pipeline(size, run):
        m = models[size]
        out = os.path.join(a.work, 'runs', f'{size}_{run}')
        common = megatron_common(a, size)
        logs = os.path.join(out, 'logs')
        if run == 'a':
            cmd = [exe('megatron'), 'pt', '--model', m['dir'], '--model_type', 'llama', '--dataset',
                   os.path.join(data, 'a.jsonl'), '--max_length', str(T), '--global_batch_size', str(G),
                   '--micro_batch_size', str(a.mbs),
                   '--train_iters', str(a_iters), '--output_dir', os.path.join(out, 'token'), '--add_version', 'false',
                   '--save_safetensors', 'false', *common]
            if runner.run(f'{size}_a train', cmd, os.path.join(logs, 'train.log')) == 0:
                runner.run(f'{size}_a export', [
                    exe('swift-plt-export-vanilla'), '--checkpoint', os.path.join(out, 'token'), '--output_dir',
                    os.path.join(out, 'hf'), *export_args(a)], os.path.join(logs, 'export_run.log'))
            return
        _, Kr, lam_r = variants[run]
        tokens = budget[run]
        G1 = plans[run].stage1.global_batch_size
        recipe = [exe('swift-plt-two-stage'), '--model', m['dir'], '--output_dir', out, '--tokens', str(tokens),
                  '--patch_size', str(Kr), '--lam', str(lam_r), '--max_length', str(T), '--global_batch_size', str(G),
                  '--stage1_batch', a.stage1_batch, '--stage1_args',
                  f'--dataset {os.path.join(data, run + "1.jsonl")} --micro_batch_size {math.gcd(a.mbs, G1)}',
                  '--stage2_args', f'--dataset {os.path.join(data, run + "2.jsonl")} --micro_batch_size {a.mbs}',
                  '--export_args', shlex.join(export_args(a)), *common]
        if runner.run(f'{size}_{run} stage1', recipe + ['--stage', '1'], os.path.join(out, 'runner_stage1.log')):
            return
        t = threading.Thread(target=runner.run, args=(f'{size}_{run} export stage1', [
            exe('swift-plt-export-vanilla'), '--checkpoint', os.path.join(out, 'stage1_patch'), '--output_dir',
            os.path.join(out, 'hf_stage1'), *export_args(a)], os.path.join(out, 'export_stage1_run.log')))
        t.start()
        runner.run(f'{size}_{run} stage2+export', recipe, os.path.join(out, 'runner_all.log'))
        t.join()

    slots = threading.Semaphore(a.max_parallel or len(a.sizes) * len(a.runs))

    def limited(size, run):
        with slots:
            pipeline(size, run)

    for size in a.sizes:
        for run in a.runs:
            th = threading.Thread(target=limited, args=(size, run))
            th.start()
            threads.append(th)
    for th in threads:
        th.join()
    print(f'training + exports done: {time.time() - t0:.0f}s; failed: {runner.failed}', flush=True)

    # held-out evaluation: plain transformers, plugin disabled
    evals = os.path.join(a.out, 'eval.jsonl')
    if os.path.exists(evals):
        os.remove(evals)
    targets = []
    for size in a.sizes:
        targets.append(f'{size}_init={models[size]["dir"]}')
        for run in a.runs:
            out = os.path.join(a.work, 'runs', f'{size}_{run}')
            if run != 'a':  # the end of stage 1
                targets.append(f'{size}_{run}_stage1={os.path.join(out, "hf_stage1")}')
            targets.append(f'{size}_{run}={os.path.join(out, "hf")}')
    env = dict(os.environ, SWIFT_PLT_DISABLE='1')
    if a.cpu:
        env.pop('PYTHONPATH', None)
        env['QUAL_EVAL_ROWS'] = '8'  # the CPU dry run scores 8 rows, not all 512
    r = subprocess.run([sys.executable, os.path.join(HERE, 'eval_heldout.py'), os.path.join(a.kit, 'heldout_ids.npy'),
                        evals, *targets], env=env, cwd='/tmp', capture_output=True, text=True)
    with open(os.path.join(a.out, 'eval.log'), 'w') as f:
        f.write(r.stdout + r.stderr)
    print(''.join(line + '\n' for line in r.stdout.splitlines() if line.startswith('EVAL')), flush=True)

    meta = {'N': N, 'T': T, 'G': G, 'stage1_batch': a.stage1_batch, 'a_iters': a_iters,
            'variants': {run: {'K': Kr, 'lam': str(lam_r), 'G1': plans[run].stage1.global_batch_size,
                               'plan': plans[run].to_dict()}
                         for run, (_, Kr, lam_r) in variants.items() if run in plans},
            'models': models, 'sizes': a.sizes, 'runs': a.runs, 'lr': {
                s: a.lr or LR[s] for s in a.sizes}, 'mbs': a.mbs, 'failed': runner.failed,
            'timeline': [dict(x, start=round(x['start'] - t0, 1)) for x in runner.timeline],
            'wall_seconds': time.time() - t0, 'cpu': a.cpu, 'specs': specs}
    with open(os.path.join(a.out, 'meta.json'), 'w') as f:
        json.dump(meta, f, indent=1, default=str)
    subprocess.run([sys.executable, os.path.join(HERE, 'report.py'), a.work, a.out])
    return 1 if runner.failed else 0


if __name__ == '__main__':
    sys.exit(main())
