"""torch.distributed (gloo) + megatron parallel state on CPU, in this process or in N spawned processes."""
import contextlib
import io
import os
import random
import socket
import time
import traceback
from typing import Any, Callable, List, Optional

from .patches import install


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the caller's ranks bind it seconds later, after their imports).

    Under pytest-xdist (`pytest -n N`, .ci/run) worker i of N draws at random from every N-th port of 10000-32767
    starting at 10000 + i, below the kernel's ephemeral ports (32768-60999 by default): no two workers can pick the
    same port, and no gloo connection or other socket that the kernel numbers can take it before the ranks bind it.
    Outside xdist: any port the kernel gives."""
    worker, count = os.environ.get('PYTEST_XDIST_WORKER', ''), os.environ.get('PYTEST_XDIST_WORKER_COUNT', '')
    if worker[2:].isdigit() and count.isdigit() and int(count) > 0:  # 'gw0', 'gw1', ...
        ports = range(10000 + int(worker[2:]) % int(count), 32768, int(count))
        rng = random.Random()  # not the global one: tests seed it
        for _ in range(100):
            port = rng.choice(ports)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(('127.0.0.1', port))
                except OSError:  # in use
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def cpu_threads() -> str:
    """Threads per process for everything the harness starts: ``OMP_NUM_THREADS`` as given from outside (so that a
    test run under ``OMP_NUM_THREADS=2`` really runs its ranks and CLIs with 2 threads), else 1."""
    value = os.environ.get('OMP_NUM_THREADS', '').strip()
    return value if value.isdigit() and int(value) > 0 else '1'


def _set_threads():
    import torch
    os.environ['OMP_NUM_THREADS'] = cpu_threads()
    torch.set_num_threads(int(os.environ['OMP_NUM_THREADS']))


def init_megatron(*, rank: int = 0, world_size: int = 1, tp: int = 1, pp: int = 1, port: int = None,
                  seed: int = 42, cp: int = 1, ep: int = 1, etp: Optional[int] = None):
    """``install()``, gloo process group, ``initialize_model_parallel(tp, pp)`` and megatron's RNG seeding.

    ``world_size`` must be a multiple of ``tp * pp * cp`` (the rest is data parallel; ``cp``: context parallel, which
    needs the CPU CP attention stand-in, ``harness.cp_attention``). ``ep`` / ``etp``: expert model / expert tensor
    parallel sizes (MoE; ``etp=None``: megatron's default, ``tp``); ``world_size`` must also be a multiple of
    ``etp * ep * pp``. Seeding follows
    ``mcore_bridge.set_random_seed`` (pipeline stage p gets ``seed + 1009 * p``).
    """
    install()
    _set_threads()
    import numpy as np
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel

    if world_size % (tp * pp * cp):
        raise ValueError(f'world_size {world_size} is not a multiple of tp*pp*cp = {tp * pp * cp}')
    if not dist.is_initialized():
        os.environ.setdefault('MASTER_ADDR', '127.0.0.1')
        os.environ['MASTER_PORT'] = str(port or os.environ.get('MASTER_PORT') or free_port())
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                          LOCAL_WORLD_SIZE=str(world_size))
        dist.init_process_group('gloo', rank=rank, world_size=world_size)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                             context_parallel_size=cp, expert_model_parallel_size=ep,
                                             expert_tensor_parallel_size=etp)
    seed = seed + 1009 * parallel_state.get_pipeline_model_parallel_rank()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def init_single_process_megatron(tp: int = 1, pp: int = 1, seed: int = 42):
    """World of one process (so ``tp == pp == 1``); see ``init_megatron``."""
    init_megatron(rank=0, world_size=1, tp=tp, pp=pp, seed=seed)


def destroy_megatron():
    import torch.distributed as dist
    from megatron.core import parallel_state
    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def _dumps(obj) -> bytes:
    import torch
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _loads(data: bytes):
    import torch
    return torch.load(io.BytesIO(data), weights_only=False)


def _worker(rank, world_size, tp, pp, port, seed, fn, args, queue, cp=1, ep=1, etp=None, env=None):
    if env is not None:  # forked from the preloaded server: the caller's environment, as a spawned child has it
        os.environ.clear()
        os.environ.update(env)
    try:
        init_megatron(rank=rank, world_size=world_size, tp=tp, pp=pp, port=port, seed=seed, cp=cp, ep=ep, etp=etp)
        result = fn(*args)
        queue.put((rank, True, _dumps(result)))
    except BaseException:
        queue.put((rank, False, traceback.format_exc()))
        raise
    finally:
        try:
            destroy_megatron()
        except Exception:
            pass


_TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Environment that install() reads when it runs (in the preloaded server, once): a caller that sets one gets fresh
# interpreters instead.
_INSTALL_ENV = ('SWIFT_PLT_CPU_PACK_AS_CP', 'SWIFT_PLT_CPU_CP_ATTENTION', 'SWIFT_PLT_CPU_HARNESS_JIT')


@contextlib.contextmanager
def _environ(name: str, value: str):
    """``os.environ[name] = value`` for the block (what processes started in it inherit), then as before."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name)
        else:
            os.environ[name] = before


def _context(fresh: bool):
    """Where ranks come from: a forkserver that ran ``install()`` and imported the stack once (``_preload``), so a
    rank costs a fork instead of ~15 s of imports; or, with ``fresh`` (or ``SWIFT_PLT_HARNESS_FRESH=1``), a new
    interpreter per rank."""
    import torch.multiprocessing as mp
    if fresh or os.environ.get('SWIFT_PLT_HARNESS_FRESH') == '1' or any(os.environ.get(k) for k in _INSTALL_ENV):
        return mp.get_context('spawn'), None
    from multiprocessing import forkserver
    ctx = mp.get_context('forkserver')
    ctx.set_forkserver_preload(['harness._preload'])  # no effect once the server runs
    # the server imports the preload with its own sys.path (the caller's is not passed on), so `harness` must be
    # found through PYTHONPATH when it starts; a failed preload import is silent (ranks would import it all again)
    pythonpath = os.environ.get('PYTHONPATH')
    with _environ('PYTHONPATH', os.pathsep.join([_TESTS_DIR] + ([pythonpath] if pythonpath else []))):
        forkserver.ensure_running()
    return ctx, dict(os.environ, OMP_NUM_THREADS=cpu_threads())


# A rank's traceback that ends in one of these failed to join the gloo group (its store connection broke, seen once
# for a 4-rank spawn on a loaded 2-core machine), not in the code under test: spawn starts the ranks once more.
_RENDEZVOUS_ERRORS = ('torch.distributed.DistNetworkError', 'torch.distributed.DistStoreError')


def spawn(fn: Callable, world_size: int, *args, retry: bool = True, **kwargs) -> List[Any]:
    """Run ``fn(*args)`` in ``world_size`` new processes joined in a gloo group with megatron parallel state
    ``(tp, pp, cp, ep, etp)`` initialised (see ``init_megatron``); return the per-rank results (rank order).

    ``fn`` and ``args`` must be picklable (``fn`` defined at module level). Results travel through ``torch.save``,
    so tensors are fine. A new process per rank (forked from the preloaded server, see ``_context``) also isolates
    megatron's global state (and the RoPE hazard, see ``patches``) from the caller and from other calls. Raises
    ``RuntimeError`` with the failing rank's traceback, or on timeout; with ``retry``, ranks that failed to join
    their gloo group are started once more.
    """
    try:
        return _spawn(fn, world_size, *args, **kwargs)
    except RuntimeError as e:
        if not retry or not any(err in str(e).rstrip().rsplit('\n', 1)[-1] for err in _RENDEZVOUS_ERRORS):
            raise
        print(f'spawn: the ranks could not join their gloo group, starting them once more:\n{e}')
        return _spawn(fn, world_size, *args, **kwargs)


def _spawn(fn: Callable, world_size: int, *args, tp: int = 1, pp: int = 1, seed: int = 42,
           timeout: float = 300, cp: int = 1, ep: int = 1, etp: Optional[int] = None, fresh: bool = False) -> List[Any]:
    ctx, env = _context(fresh)
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [
        ctx.Process(target=_worker, args=(rank, world_size, tp, pp, port, seed, fn, args, queue, cp, ep, etp, env))
        for rank in range(world_size)
    ]
    with _environ('OMP_NUM_THREADS', cpu_threads()):  # inherited by spawned children before torch starts there
        for p in procs:
            p.start()
    results, deadline, ok = {}, time.monotonic() + timeout, False
    try:
        while len(results) < world_size:
            if not queue.empty():
                rank, success, payload = queue.get()
                if not success:
                    raise RuntimeError(f'rank {rank} failed:\n{payload}')
                results[rank] = _loads(payload)
                continue
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead and queue.empty():
                raise RuntimeError(f'worker exited with code {dead[0].exitcode} without a result')
            if time.monotonic() > deadline:
                raise RuntimeError(f'spawn: timed out after {timeout} s')
            time.sleep(0.05)
        ok = True
    finally:
        for p in procs:  # after a failure the other ranks may wait in a collective forever: kill them
            p.join(timeout=30 if ok else 0)
            if p.is_alive():
                p.kill()
                p.join()
    return [results[r] for r in range(world_size)]
