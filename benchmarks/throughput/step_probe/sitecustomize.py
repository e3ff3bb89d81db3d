"""Step probe of the throughput benchmark (benchmarks/throughput/throughput_1b.sh); not part of the plugin.

Put this directory first on PYTHONPATH: Python imports ``sitecustomize`` at start-up in every process (torchrun's
children included). When ``STEP_PROBE_OUT`` is set, a ``sys.meta_path`` finder waits for ms-swift's
``swift.megatron.trainers.base`` and wraps ``BaseMegatronTrainer.train_step`` (one optimizer step). Nothing else
changes, so it measures the stock run (``SWIFT_PLT_DISABLE=1``) and the plugin's runs the same way. Per step it
appends to ``$STEP_PROBE_OUT`` (JSON lines, rank 0 only): step, t_end (perf_counter after torch.cuda.synchronize()),
wall, loss (ms-swift's sum/count over the micro-batches' 'loss' metrics), grad_norm, max_mem_gib.
``STEP_PROBE_PROFILE_STEP=n``: step n runs under torch.profiler; its ``key_averages()`` go to
``$STEP_PROBE_OUT.prof.json``. ``STEP_PROBE_STOP=n``: the process exits (os._exit(0)) after step n (no final save).

Turn gate (benchmarks/throughput/tput_launch.py): with ``STEP_PROBE_TURN_FILE`` and ``STEP_PROBE_TURN_ID`` set, the
probe also wraps ``BaseMegatronTrainer.__init__`` and, before it runs, polls the turn file until it holds this run's
id. In ms-swift 4.6 nothing GPU-heavy happens before that ``__init__`` (the HF model is built on ``meta``; dataset
tokenisation and packing are CPU work; ``prepare_model()`` is its first statement of substance), so a waiting process
holds only its CUDA context and runs no kernels. ``STEP_PROBE_TRAIN_CPUS`` (e.g. ``0-5``): on the turn, every thread
is moved to those cores and torch's intra-op pool is resized to them minus 3 (``fit_torch_threads``).
``$STEP_PROBE_OUT.turn.json`` records launch, wait_start, turn and init_done times and the affinity before/after.
"""
import importlib.abc
import importlib.util
import json
import os
import sys
import time

_TARGET = 'swift.megatron.trainers.base'


def _dump_profile(prof, path, step):
    try:
        prof.__exit__(None, None, None)
        rows = []
        for e in prof.key_averages():
            rows.append({
                'name': e.key,
                'count': e.count,
                'self_cpu_us': e.self_cpu_time_total,
                'cpu_us': e.cpu_time_total,
                'self_device_us': getattr(e, 'self_device_time_total', getattr(e, 'self_cuda_time_total', 0)),
                'device_us': getattr(e, 'device_time_total', getattr(e, 'cuda_time_total', 0)),
            })
        with open(path, 'w') as f:
            json.dump({'step': step, 'rows': rows}, f)
    except Exception as e:  # the probe must never break a run
        print(f'[step_probe] profiler failed: {e!r}', file=sys.stderr)


def parse_cpus(spec):
    """'0-5,8' -> {0, 1, 2, 3, 4, 5, 8}; '' -> set()."""
    cpus = set()
    for part in (spec or '').split(','):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition('-')
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def move_all_threads(cpus):
    """Pin every thread of this process (each tid in /proc/self/task) to ``cpus``; returns how many were moved."""
    n = 0
    try:
        tids = os.listdir('/proc/self/task')
    except OSError:
        tids = ['0']
    for tid in tids:
        try:
            os.sched_setaffinity(int(tid), cpus)
            n += 1
        except (OSError, ValueError):  # a thread that just exited; cores not present
            pass
    return n


def fit_torch_threads(n_cpus, reserved=3):
    """After the move: torch's intra-op pool was sized at start-up for the start cores; left at that size on the
    fewer training cores (which also run the dataloader workers and the pin-memory thread) it oversubscribes them and
    slows every CPU tensor op of the training loop. Leave ``reserved`` cores to those. Returns (before, after)."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, n_cpus - reserved))
    return before, torch.get_num_threads()


def wait_for_turn(turn_file, turn_id, poll=0.05, timeout=None):
    """Block until ``turn_file`` holds ``turn_id`` (the launcher writes it atomically); returns the seconds waited."""
    t0 = time.time()
    while True:
        try:
            with open(turn_file) as f:
                if f.read().strip() == str(turn_id):
                    return time.time() - t0
        except OSError:
            pass
        if timeout is not None and time.time() - t0 > timeout:
            raise TimeoutError(f'[step_probe] no turn {turn_id} in {turn_file} after {timeout} s')
        time.sleep(poll)


def _turn_gate(init):
    turn_file = os.environ['STEP_PROBE_TURN_FILE']
    turn_id = os.environ.get('STEP_PROBE_TURN_ID', '0')
    cpus = parse_cpus(os.environ.get('STEP_PROBE_TRAIN_CPUS', ''))
    rec_path = os.environ['STEP_PROBE_OUT'] + '.turn.json'

    def __init__(self, *args, **kwargs):
        rec = {'turn_id': turn_id, 'launch': float(os.environ.get('STEP_PROBE_T_LAUNCH', 'nan')),
               'wait_start': time.time(), 'cpus_before': sorted(os.sched_getaffinity(0))}
        with open(rec_path, 'w') as f:  # the launcher reads wait_start (its turn-to-exit time starts there)
            json.dump(rec, f)
        print(f'[step_probe] run {turn_id}: waiting for the turn', file=sys.stderr, flush=True)
        wait_for_turn(turn_file, turn_id)
        rec['turn'] = time.time()
        if cpus:
            rec['threads_moved'] = move_all_threads(cpus)
            try:
                # the training cores are shared by the run's ranks on this node (torchrun's LOCAL_WORLD_SIZE)
                rec['torch_threads'] = fit_torch_threads(len(cpus) // int(os.environ.get('LOCAL_WORLD_SIZE', '1')))
            except Exception as e:  # the probe must never break a run
                rec['torch_threads'] = repr(e)
        rec['cpus_after'] = sorted(os.sched_getaffinity(0))
        print(f'[step_probe] run {turn_id}: turn after {rec["turn"] - rec["wait_start"]:.1f} s, cpus '
              f'{rec["cpus_after"]}', file=sys.stderr, flush=True)
        init(self, *args, **kwargs)
        rec['init_done'] = time.time()
        with open(rec_path, 'w') as f:
            json.dump(rec, f)

    return __init__


def _wrap(module):
    cls = module.BaseMegatronTrainer
    if os.environ.get('STEP_PROBE_TURN_FILE'):
        cls.__init__ = _turn_gate(cls.__init__)
    orig = cls.train_step
    out = os.environ['STEP_PROBE_OUT']
    prof_step = int(os.environ.get('STEP_PROBE_PROFILE_STEP', '0') or 0)
    stop = int(os.environ.get('STEP_PROBE_STOP', '0') or 0)
    state = {'step': 0}

    def train_step(self, train_data_iterator):
        import torch
        state['step'] += 1
        step = state['step']
        rank0 = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
        prof = None
        cuda = torch.cuda.is_available()
        if step == prof_step and rank0:
            if cuda:
                torch.cuda.synchronize()
            acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
            try:
                prof = torch.profiler.profile(activities=acts)
                prof.__enter__()
            except Exception as e:  # the probe must never break a run
                print(f'[step_probe] profiler failed to start: {e!r}', file=sys.stderr)
                prof = None
        result = orig(self, train_data_iterator)
        if cuda:
            torch.cuda.synchronize()
        t_end = time.perf_counter()
        if prof is not None:
            _dump_profile(prof, out + '.prof.json', step)
        if rank0:
            metrics, grad_norm, _ = result
            loss = None
            try:
                s = c = 0.0
                for m in metrics or []:
                    v = m.get('loss') if isinstance(m, dict) else None
                    if v is not None and v.numel() == 2:
                        s += float(v[0])
                        c += float(v[1])
                loss = s / c if c else None
            except Exception:  # the probe must never break a run
                pass
            rec = {
                'step': step,
                't_end': t_end,
                'wall': time.time(),
                'loss': loss,
                'grad_norm': float(grad_norm) if grad_norm is not None else None,
                'max_mem_gib': torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0,
                'profiled': prof is not None,
            }
            with open(out, 'a') as f:
                f.write(json.dumps(rec) + '\n')
        if stop and step >= stop:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        return result

    cls.train_step = train_step


class _Loader(importlib.abc.Loader):

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        _wrap(module)

    def __getattr__(self, name):
        return getattr(self.loader, name)


class _Finder(importlib.abc.MetaPathFinder):

    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
            sys.meta_path.remove(self)  # once
        return spec


def _chain():
    """Run the next ``sitecustomize`` on sys.path (this one shadows it: the system's, a test harness's)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for p in sys.path:
        f = os.path.join(os.path.abspath(p or '.'), 'sitecustomize.py')
        if os.path.abspath(p or '.') != here and os.path.isfile(f):
            spec = importlib.util.spec_from_file_location('_sitecustomize_chained', f)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


_chain()
if os.environ.get('STEP_PROBE_OUT'):
    sys.meta_path.insert(0, _Finder())
