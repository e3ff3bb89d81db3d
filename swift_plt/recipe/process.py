"""Running the stock CLIs for the recipe: their executables, how many processes they get, logged runs, and the likely
cause when one fails."""
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence

# ms-swift's `megatron` relaunches itself under torchrun only when one of these is set (swift/cli/main.py,
# use_torchrun); without them it runs in-process and fails in init_process_group ("RANK expected, but not set").
LAUNCH_VARS = ('NPROC_PER_NODE', 'NNODES')
MODEL_PARALLEL_FLAGS = ('tensor_model_parallel_size', 'pipeline_model_parallel_size', 'context_parallel_size')


def cli_executable(name: str) -> str:
    """``megatron`` / ``swift`` of this interpreter's environment (a venv need not be on PATH), else PATH's."""
    exe = os.path.join(os.path.dirname(sys.executable), name)
    return exe if os.path.exists(exe) else (shutil.which(name) or name)


class LoggedRun:
    """``cmd`` with ``extra_env`` added to our environment, its merged stdout/stderr copied to ``log_path`` and to
    ``on_line`` as each line comes, and to our stdout: at once, or from ``show()`` on (earlier lines replayed) when
    started ``quiet`` (a stage running beside another)."""

    def __init__(self, cmd: List[str], log_path: str, extra_env: Optional[Mapping[str, str]] = None,
                 on_line: Optional[Callable[[str], None]] = None, quiet: bool = False):
        os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
        self._log = open(log_path, 'a', encoding='utf-8')
        self._log.write(f'$ {subprocess.list2cmdline(cmd)}\n')
        if extra_env:
            self._log.write(f'# environment: {env_prefix(extra_env)}\n')
        self._log.flush()
        self._on_line, self._held, self._lock = on_line, ([] if quiet else None), threading.Lock()
        # unbuffered: lines come as they are printed (the live output, and on_line's timing)
        env = dict(os.environ, PYTHONUNBUFFERED='1', **(extra_env or {}))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                     errors='replace')
        self._pump = threading.Thread(target=self._copy, daemon=True)
        self._pump.start()

    def _copy(self) -> None:
        for line in self.proc.stdout:
            self._log.write(line)
            self._log.flush()
            with self._lock:
                if self._held is None:
                    sys.stdout.write(line)
                else:
                    self._held.append(line)
            if self._on_line:
                self._on_line(line)

    def show(self) -> None:
        with self._lock:
            sys.stdout.write(''.join(self._held or ()))
            sys.stdout.flush()
            self._held = None

    def wait(self) -> int:
        rc = self.proc.wait()
        self._pump.join()
        self.show()
        self._log.close()
        return rc


def run_logged(cmd: List[str], log_path: str, extra_env: Optional[Mapping[str, str]] = None,
               on_line: Optional[Callable[[str], None]] = None) -> int:
    """Run ``cmd`` (``LoggedRun``) to its end; return the exit code."""
    return LoggedRun(cmd, log_path, extra_env, on_line).wait()


def free_port() -> int:
    """A TCP port free on this machine now (a second torchrun beside a running one)."""
    with socket.socket() as sock:
        sock.bind(('', 0))
        return sock.getsockname()[1]


def env_prefix(env: Mapping[str, str]) -> str:
    return ' '.join(f'{k}={v}' for k, v in env.items())


# ---------------------------------------------------------------------------------------------- process count
def flag_value(argv: Sequence[str], name: str) -> Optional[str]:
    """The last value of ``--name V`` / ``--name=V`` in argv (argparse: the last one wins), else None."""
    value = None
    for i, a in enumerate(argv):
        if a.startswith(f'--{name}='):
            value = a.split('=', 1)[1]
        elif a == f'--{name}' and i + 1 < len(argv):
            value = argv[i + 1]
    return value


def flag_int(argv: Sequence[str], name: str, default: Optional[int] = 1) -> Optional[int]:
    """``flag_value`` as an integer (``default`` when absent); ValueError naming the flag otherwise."""
    value = flag_value(argv, name)
    try:
        return default if value is None else int(value)
    except ValueError:
        raise ValueError(f'--{name} {value!r} must be an integer.') from None


def flag_bool(argv: Sequence[str], name: str, default: bool = False) -> bool:
    """``flag_value`` as ms-swift reads a bool flag (true/1/yes), ``default`` when absent."""
    value = flag_value(argv, name)
    return default if value is None else value.lower() in ('true', '1', 'yes')


def model_parallel_size(argv: Sequence[str]) -> int:
    """TP·PP·CP of a `megatron` command line (ms-swift's defaults are 1): its process count must be a multiple."""
    size = 1
    for name in MODEL_PARALLEL_FLAGS:
        try:
            n = flag_int(argv, name)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f'--{name} {flag_value(argv, name)!r} must be a positive integer.')
        size *= n
    return size


def gpu_count() -> int:
    """CUDA devices this process sees (torch honours CUDA_VISIBLE_DEVICES); 0 without CUDA."""
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 -- no torch or no driver: no GPU
        return 0


def gpu_memory() -> Optional[int]:
    """Total bytes of the first visible CUDA device (a property: no CUDA context, no memory taken); None without."""
    try:
        import torch
        return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 -- no torch or no driver: no GPU
        return None


@dataclass
class Launch:
    env: Dict[str, str] = field(default_factory=dict)  # added to the CLI's environment ({}: the user's is kept)
    world_size: Optional[int] = None  # processes per run (None: not known, e.g. NPROC_PER_NODE=auto)
    note: str = ''  # what was picked and why, for the user
    # per stage: flags added at the end of its command (they win: its micro-batch size, recompute) and why
    stage_args: Dict[int, List[str]] = field(default_factory=dict)
    stage_notes: Dict[int, str] = field(default_factory=dict)
    stage_env: Dict[int, Dict[str, str]] = field(default_factory=dict)  # per stage: added to its environment
    gpus: Optional[int] = None  # the visible GPUs, when the recipe picked the count (None: the user's)


def user_launch(environ: Mapping[str, str]) -> Optional[Launch]:
    """The user's NPROC_PER_NODE / NNODES, kept unchanged (torchrun's default is 1 process per node), else None."""
    given = {k: environ[k] for k in LAUNCH_VARS if k in environ}
    if not given:
        return None
    try:
        world: Optional[int] = int(given.get('NPROC_PER_NODE') or 1) * int(given.get('NNODES') or 1)
    except ValueError:  # torchrun also takes NPROC_PER_NODE=auto/gpu and NNODES=MIN:MAX
        world = None
    return Launch({}, world, f'{env_prefix(given)} (from the environment)')


def pick_launch(environ: Mapping[str, str], fits: Callable[[int], Optional[str]],
                device_count: Callable[[], int] = gpu_count) -> Launch:
    """The user's NPROC_PER_NODE / NNODES unchanged; else NPROC_PER_NODE = the visible GPUs (1 without any), lowered
    to the largest count that ``fits`` (it returns why a count does not fit, else None)."""
    given = user_launch(environ)
    if given is not None:
        return given
    devices = device_count()
    top = max(devices, 1)
    why = fits(top)
    n = top if why is None else next((m for m in range(top - 1, 0, -1) if fits(m) is None), top)
    what = f'{devices} visible GPU{"" if devices == 1 else "s"}' if devices else 'no visible GPU'
    if n < top:
        what += f'; {top} processes would not fit: {why.rstrip(".")}'
    return Launch({'NPROC_PER_NODE': str(n)}, n, f'NPROC_PER_NODE={n} ({what}; set NPROC_PER_NODE to override)',
                  gpus=devices)


def export_launch(extra: Sequence[str], environ: Optional[Mapping[str, str]] = None) -> Launch:
    """`megatron export`: the user's NPROC_PER_NODE / NNODES unchanged, else TP·PP·CP of ``extra`` (1 by default),
    since converting weights gains nothing from data parallelism."""
    environ = os.environ if environ is None else environ
    given = user_launch(environ)
    if given is not None:
        return given
    n = model_parallel_size(extra)
    return Launch({'NPROC_PER_NODE': str(n)}, n,
                  f'NPROC_PER_NODE={n} (TP·PP·CP of the export; set NPROC_PER_NODE to override)')


# ---------------------------------------------------------------------------------------------- failures
# (pattern in the log of a failed run, likely cause), first match wins
FAILURE_CAUSES = (
    (r'environment variable RANK expected',
     'ms-swift ran without torchrun: set NPROC_PER_NODE (the number of GPUs to use, 1 on one GPU).'),
    (r'OutOfMemoryError|CUDA out of memory',
     'out of GPU memory: lower that stage\'s micro batch (--stage1_args / --stage2_args "--micro_batch_size N"; the '
     'recipe printed the one it picked for stage 1 and its estimate), or add --recompute_granularity full.'),
    (r'Address already in use|EADDRINUSE',
     'the torchrun port is taken (another run on this machine?): set MASTER_PORT to a free port.'),
    (r'is not divisible by micro batch size',
     'the global batch does not split into micro batches x data-parallel processes: change --micro_batch_size, '
     '--global_batch_size or NPROC_PER_NODE.'),
    (r"No dot product attention|flash-attn v\d is not installed|ModuleNotFoundError: No module named '?flash_attn",
     'no attention kernel for these inputs (flash-attn, ms-swift\'s default backend, is not installed?): pass '
     '--attention_backend fused (Transformer Engine) or unfused.'),
    (r"ModuleNotFoundError: No module named '?[\w.]+'?", 'a Python package is missing ({match}).'),
)
_ERROR_LINE = re.compile(r'\b[\w.]*(?:Error|Exception): .*\S.*')  # also behind torchrun's "[rank0]: "


def failure_cause(log_path: str, offset: int = 0) -> str:
    """The likely cause of a failed run, from its log after byte ``offset`` (this invocation's part): a known
    pattern, else the last error line, else a pointer to the log's end."""
    try:
        with open(log_path, 'rb') as f:
            f.seek(max(offset, os.path.getsize(log_path) - 2_000_000))
            text = f.read().decode('utf-8', errors='replace')
    except OSError:
        return f'no log at {log_path}.'
    for pattern, cause in FAILURE_CAUSES:
        m = re.search(pattern, text)
        if m:
            return cause.format(match=m.group(0))
    errors = [e for e in _ERROR_LINE.findall(text) if 'ChildFailedError' not in e]  # torchrun's wrapper
    if errors:
        return f'the last error in the log: {errors[-1].strip()[:500]}'
    return 'not recognised: see the end of the log.'
