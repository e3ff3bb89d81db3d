"""One run's processes for run.py: their environment, the `megatron pt` / recipe / export commands, the deadline."""
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time

from make_models import model_type, structure

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
# peak; ~1/sqrt(width), the same in every run of a size (the other structures: tiny's)
LR = {'tiny': 1e-3, 'XS': 2e-3, 'S': 1.4e-3, 'M': 1e-3, 'tinyMoE': 1e-3, 'tinyHybrid': 1e-3}
# --gdn torch: a hybrid trains on megatron-core's torch Gated DeltaNet, padded rows (fla 0.6's backward is refused on
# Hopper with Triton < 3.7.1: swift_plt.plugin.arguments.fla_hopper_problem); TE's attention must then be
# deterministic too
TORCH_GDN_ARGS = ['--padding_free', 'false', '--megatron_extra_kwargs', '{"deterministic_mode": true}']
TORCH_GDN_ENV = {'NVTE_ALLOW_NONDETERMINISTIC_ALGO': '0'}
# an MoE's load-balancing loss: Qwen3-MoE's router_aux_loss_coef (ms-swift's Megatron default is 0: none)
MOE_ARGS = ['--moe_aux_loss_coeff', '1e-3']


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

    def run(self, name, cmd, log, env=None):
        """0 or the exit code; NOT_STARTED when less than MIN_LEFT s are left; KILLED when the deadline stopped it.
        ``env``: variables added to the run's environment (structure_env)."""
        os.makedirs(os.path.dirname(log), exist_ok=True)
        t = time.time()
        left = self.deadline - t
        if left < self.MIN_LEFT:
            self.failed.append(f'{name}: {NOT_STARTED}')
            return NOT_STARTED
        with open(log, 'w') as f:
            f.write('$ ' + shlex.join(cmd) + '\n')
            f.flush()
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=dict(self.env(), **(env or {})),
                                 cwd=REPO, start_new_session=True)
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


def torch_gdn(a, size):
    """Whether the size's runs take megatron-core's torch Gated DeltaNet (a hybrid, --gdn torch)."""
    return structure(size) == 'hybrid' and getattr(a, 'gdn', 'torch') == 'torch'


def structure_env(a, size):
    """Environment variables the size's `megatron` processes need (torch_gdn: TORCH_GDN_ENV)."""
    return dict(TORCH_GDN_ENV) if torch_gdn(a, size) else {}


def megatron_common(a, size, seed):
    """The flags of every `megatron pt` of a job (token-level and both stages of the recipe): recipe, seed, logging,
    CPU or GPU flags, and a size's structure flags (MoE: MOE_ARGS; torch_gdn: no packing, TORCH_GDN_ARGS)."""
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
    if structure(size) == 'moe':
        args += MOE_ARGS
    if torch_gdn(a, size):
        args[args.index('--packing') + 1] = 'false'  # padded rows (packing implies --padding_free true)
        args += TORCH_GDN_ARGS[2:] if a.cpu else TORCH_GDN_ARGS  # CPU_MEGATRON_ARGS has --padding_free false
    return args


def token_level_cmd(a, size, seed, model, dataset, iters, out_dir):
    """`megatron pt` of a token-level run (a): the size's --model_type (make_models.model_type), T, G, iterations."""
    return [exe('megatron'), 'pt', '--model', model, '--model_type', model_type(size), '--dataset', dataset,
            '--max_length', str(a.seq), '--global_batch_size', str(a.gbs), '--micro_batch_size', str(a.mbs),
            '--train_iters', str(iters), '--output_dir', out_dir, '--add_version', 'false', '--save_safetensors',
            'false', *megatron_common(a, size, seed)]


def recipe_cmd(a, size, seed, model, out_dir, tokens, K, lam, G1, files):
    """`swift-plt-two-stage` of a (b)/(c) run on ``tokens``: the megatron_common flags go to both stages (the recipe
    takes --model_type from config.json: llama3_2_plt for Llama, qwen3_moe, qwen3_5); ``files``: {'1', '2': data}."""
    return [exe('swift-plt-two-stage'), '--model', model, '--output_dir', out_dir, '--tokens', str(tokens),
            '--patch_size', str(K), '--lam', str(lam), '--max_length', str(a.seq), '--global_batch_size', str(a.gbs),
            '--stage1_batch', a.stage1_batch, '--stage1_args',
            f'--dataset {files["1"]} --micro_batch_size {math.gcd(a.mbs, G1)}',
            '--stage2_args', f'--dataset {files["2"]} --micro_batch_size {a.mbs}',
            '--export_args', shlex.join(export_args(a)), *megatron_common(a, size, seed)]


def export_args(a):
    if a.cpu:
        return ['--torch_dtype', 'float32', '--fp16', 'false', '--bf16', 'false', '--ddp_backend', 'gloo',
                '--use_cpu_initialization', 'true', '--perform_initialization', 'true', '--check_model', 'false']
    return ['--torch_dtype', 'bfloat16']


def exe(name):
    p = os.path.join(os.path.dirname(sys.executable), name)
    return p if os.path.exists(p) else name
