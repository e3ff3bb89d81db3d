"""One run's processes for run.py: their environment, the `megatron pt` / export flags, the deadline."""
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


NOT_STARTED = 'not started (deadline)'
KILLED = 'killed at the deadline'


class Runner:
    MIN_LEFT = 10  # seconds: no step starts with less left before the deadline

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
        env.update({'NPROC_PER_NODE': '1', 'MASTER_PORT': str(port)})
        if not self.a.no_gpu_lock:
            env['QUAL_GPU_LOCK'] = os.path.join(self.a.work, 'gpu.lock')
        else:
            env.pop('QUAL_GPU_LOCK', None)
        return env

    def run(self, name, cmd, log):
        """0 or the exit code; NOT_STARTED when less than MIN_LEFT s are left; KILLED when the deadline stopped it."""
        os.makedirs(os.path.dirname(log), exist_ok=True)
        t = time.time()
        left = self.deadline - t
        if left < self.MIN_LEFT:
            self.failed.append(f'{name}: {NOT_STARTED}')
            return NOT_STARTED
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
                p.wait()
                rc = KILLED
        dt = time.time() - t
        self.timeline.append({'name': name, 'start': t, 'seconds': dt, 'rc': rc})
        print(f'[{time.strftime("%H:%M:%S")}] {name}: rc={rc} {dt:.0f}s', flush=True)
        if rc != 0:
            self.failed.append(f'{name}: {rc if rc == KILLED else f"rc={rc}"} (log {log})')
        return rc


def step_status(step, rc):
    """None when the step succeeded, else why the job did not finish."""
    if rc == 0:
        return None
    return f'{step} {rc}' if isinstance(rc, str) else f'{step} failed (rc={rc})'


def megatron_common(a, size, seed):
    lr = a.lr or LR[size]
    args = ['--template', 'llama', '--packing', 'true', '--lr', str(lr),
            '--min_lr', str(lr / 10), '--lr_decay_style', 'cosine', '--lr_warmup_fraction', '0.05', '--seed', str(seed),
            '--data_seed', str(seed),
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
