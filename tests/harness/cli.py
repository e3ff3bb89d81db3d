"""Run the stock ms-swift CLI (``megatron pt``, ``swift export``, ...) on CPU in a subprocess."""
import ast
import atexit
import glob
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

from .dist import cpu_threads, free_port

SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'site')

# Flags a `megatron pt` / `megatron sft` run needs on this CPU stack (cpu_notes): no fused/flash attention, no
# THD packing (TE only), no fused cross entropy, gloo instead of NCCL, weights built on the CPU, TP attributes set
# (perform_initialization, see cpu_notes' first hazard), no distributed optimizer, no hub access.
CPU_MEGATRON_ARGS: List[str] = [
    '--attention_backend', 'unfused',
    '--padding_free', 'false',
    '--cross_entropy_loss_fusion', 'false',
    '--ddp_backend', 'gloo',
    '--use_cpu_initialization', 'true',
    '--perform_initialization', 'true',
    '--use_distributed_optimizer', 'false',
    '--check_model', 'false',
    '--split_dataset_ratio', '0',
]  # yapf: disable

# Flags of a `swift pt` / `swift sft` run (ms-swift's HF backend) here: no hub access. Its trainer asks the ModelScope
# hub whether the local model is the latest (--check_model, default true); offline that is ~30 s of connection
# timeouts and retries per run (seen here), and it checks nothing the tests look at.
CPU_SWIFT_ARGS: List[str] = ['--check_model', 'false']


# The stock console scripts the tests run (ms-swift's), which must run under this interpreter.
CONSOLE_SCRIPTS = ('swift', 'megatron')
_script_dir = None


def script_dir() -> str:
    """A directory whose ``swift`` / ``megatron`` run under this interpreter; ``harness_env`` puts it first on PATH.

    Normally this interpreter's bin directory (the venv's). In a venv made with ``--system-site-packages`` over a
    Python that already has ms-swift, pip writes no ``swift`` / ``megatron`` into the venv, and the ones on PATH run
    the base interpreter, which does not see the swift-plt installed in the venv. Then the same console scripts,
    with this interpreter in the shebang, are written to a temporary directory (removed at exit).
    """
    global _script_dir
    bin_dir = os.path.dirname(sys.executable)
    if all(os.path.exists(os.path.join(bin_dir, name)) for name in CONSOLE_SCRIPTS):
        return bin_dir
    if _script_dir is None:
        tmp = tempfile.mkdtemp(prefix='swift_plt_harness_bin_')
        atexit.register(shutil.rmtree, tmp, True)
        for ep in importlib.metadata.entry_points(group='console_scripts'):
            if ep.name in CONSOLE_SCRIPTS:
                path = os.path.join(tmp, ep.name)
                with open(path, 'w') as f:  # what pip writes for a console script
                    f.write(f'#!{sys.executable}\nimport sys\nfrom {ep.module} import {ep.attr}\n'
                            f'sys.argv[0] = {ep.name!r}\nsys.exit({ep.attr}())\n')
                os.chmod(path, 0o755)
        _script_dir = tmp
    return _script_dir


def harness_env(env_extra: Optional[Dict[str, str]] = None, nproc: int = 1) -> Dict[str, str]:
    """Environment of a CPU CLI run: harness sitecustomize on PYTHONPATH, this interpreter's ``swift`` /
    ``megatron`` first on PATH, ``OMP_NUM_THREADS`` as given from outside (else 1) per process, offline, torchrun
    settings."""
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join([SITE_DIR] + [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
    env['PATH'] = os.pathsep.join([script_dir(), os.path.dirname(sys.executable), env.get('PATH', '')])
    env.update({
        'SWIFT_PLT_CPU_HARNESS': '1',
        'OMP_NUM_THREADS': cpu_threads(),
        'MKL_NUM_THREADS': cpu_threads(),
        'TOKENIZERS_PARALLELISM': 'false',
        'HF_HUB_OFFLINE': '1',
        'TRANSFORMERS_OFFLINE': '1',
        'HF_DATASETS_OFFLINE': '1',
        'MODELSCOPE_OFFLINE': '1',
        'CUDA_VISIBLE_DEVICES': '',
        # ms-swift only relaunches under torchrun when NPROC_PER_NODE is set; ranks then get RANK etc.
        'NPROC_PER_NODE': str(nproc),
        'MASTER_ADDR': '127.0.0.1',
        'MASTER_PORT': str(free_port()),
        'PYTHONUNBUFFERED': '1',
    })
    env.update(env_extra or {})
    return env


def run_cli(argv: List[str],
            env_extra: Optional[Dict[str, str]] = None,
            nproc: int = 1,
            timeout: float = 600,
            cwd: Optional[str] = None,
            check: bool = False) -> subprocess.CompletedProcess:
    """Run ``argv`` (e.g. ``['megatron', 'pt', '--model', d, ...]`` or ``['swift', 'export', ...]``) on CPU.

    ``swift`` / ``megatron`` run under this interpreter (``script_dir``); other commands come from this
    interpreter's bin directory, else PATH. Returns the CompletedProcess with stdout and stderr merged in
    ``.stdout`` (text). ``check=True`` raises ``CalledProcessError`` on failure, with the output in the message
    tail.
    """
    env = harness_env(env_extra, nproc)
    cmd = [shutil.which(argv[0], path=env['PATH']) or argv[0], *argv[1:]]
    proc = subprocess.run(
        cmd,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout)
    if check and proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, cmd, output=proc.stdout[-20000:])
    return proc


def parse_logs(output: str) -> List[dict]:
    """Every log dict ms-swift's Megatron trainer printed, in order.

    The trainer prints one Python dict per logging step (ms-swift 4.6.0 ``megatron/callbacks/print.py``), e.g.
    ``{'loss': 6.35, 'grad_norm': 2.21, 'learning_rate': 0.000775, 'iteration': '1/3', 'elapsed_time': '0s', ...}``;
    evaluation logs carry ``eval_*`` keys instead of ``loss``.
    """
    logs = []
    for line in output.splitlines():
        start, end = line.find('{'), line.rfind('}')
        if start < 0 or end < start or "'iteration'" not in line:
            continue
        try:
            d = ast.literal_eval(line[start:end + 1])
        except (ValueError, SyntaxError):
            continue
        if isinstance(d, dict):
            logs.append(d)
    return logs


def parse_losses(output: str) -> List[float]:
    """Per-step training losses, i.e. ``'loss'`` of each training log dict (run with ``--logging_steps 1``)."""
    return [float(d['loss']) for d in parse_logs(output) if 'loss' in d]


def hf_train_logs(output_dir: str) -> List[dict]:
    """Training log dicts of a `swift pt/sft` (HF backend) run: its ``logging.jsonl`` (full precision, unlike the
    printed dicts), without the final summary line."""
    paths = sorted(glob.glob(os.path.join(output_dir, '*', 'logging.jsonl')))
    if not paths:
        return []
    with open(paths[-1]) as f:
        logs = [json.loads(line) for line in f if line.strip()]
    return [d for d in logs if 'loss' in d]


def convert_precision(output: str):
    """(mean_diff, argmax agreement) of ms-swift's `--test_convert_precision` check, parsed from a run's output:
    its "mean_diff (with loss)" and the fraction of positions where the printed HF and Megatron argmax tokens
    (`hf_tokens:` / `mg_tokens:`, > 100 of them) agree. Two code paths in bf16 on a random model with nearly flat
    logits: assert a rate (tests use >= 95%), never that every near-tie resolves the same way."""
    mean_diff = float(re.search(r'mean_diff \(with loss\): ([0-9.e+-]+)', output).group(1))
    hf_tokens, mg_tokens = (json.loads(re.search(rf'^{k}: (\[.*\])$', output, re.M).group(1))
                            for k in ('hf_tokens', 'mg_tokens'))
    assert len(hf_tokens) == len(mg_tokens) > 100, (len(hf_tokens), len(mg_tokens))
    return mean_diff, sum(a == b for a, b in zip(hf_tokens, mg_tokens)) / len(hf_tokens)
