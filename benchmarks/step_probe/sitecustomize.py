"""Step probe for the throughput benchmark (benchmarks/throughput_1b.sh); not part of the plugin.

Put this directory first on PYTHONPATH: Python imports ``sitecustomize`` at start-up in every process (torchrun's
children included). When ``STEP_PROBE_OUT`` is set, a ``sys.meta_path`` finder waits for ms-swift's
``swift.megatron.trainers.base`` and wraps ``BaseMegatronTrainer.train_step`` (one optimizer step: all micro-batches,
forward, backward, optimizer). Nothing else changes, so it measures the stock run (``SWIFT_PLT_DISABLE=1``) and the
plugin's runs the same way. Per step it appends to ``$STEP_PROBE_OUT`` (JSON lines, rank 0 only):
  step, t_end (perf_counter after torch.cuda.synchronize() at the end of train_step), loss (ms-swift's sum/count over
  the micro-batches' 'loss' metrics), grad_norm, max_mem_gib (torch.cuda.max_memory_allocated).
``STEP_PROBE_PROFILE_STEP=n``: step n runs under torch.profiler (CPU + CUDA); its ``key_averages()`` go to
``$STEP_PROBE_OUT.prof.json`` (name, count, self/total CPU and device time in us). ``STEP_PROBE_STOP=n``: the process
exits (os._exit(0)) after step n, skipping the final checkpoint save.
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


def _wrap(module):
    cls = module.BaseMegatronTrainer
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
