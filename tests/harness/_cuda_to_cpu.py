"""CUDA -> CPU redirects for a CPU-only torch build (torch 2.13.0+cpu).

Upstream (megatron-core 0.16.1, mcore-bridge 1.6.5, ms-swift 4.6.0) creates tensors with ``device='cuda'`` /
``device=torch.cuda.current_device()``, calls ``.cuda()`` / ``.to('cuda')``, uses CUDA streams, events, memory
statistics and the CUDA RNG. On a CPU build each of those raises "Torch not compiled with CUDA enabled".

* ``CudaToCpuMode`` is a ``TorchFunctionMode`` kept on the torch-function stack of the main thread. It rewrites any
  CUDA device argument (``'cuda'``, ``'cuda:N'``, ``torch.device('cuda')``, an int index) of any torch call to
  ``'cpu'``, turns ``Tensor.cuda()`` / ``Tensor.pin_memory()`` into identity, and answers ``Tensor.type()`` with the
  ``torch.cuda.*`` name when the caller is megatron-core (its optimizers assert ``param.type() ==
  'torch.cuda.FloatTensor'``). Cost measured on a 50-layer MLP fwd+bwd: within noise.
* ``patch_torch_cuda()`` replaces the ``torch.cuda`` functions upstream calls with CPU equivalents or no-ops.
  ``torch.cuda.is_available()`` and ``device_count()`` are left alone (False / 0): code that branches on them takes
  its CPU path.
"""
import contextlib
import sys

import torch
from torch.overrides import TorchFunctionMode


def _is_cuda(device) -> bool:
    if isinstance(device, bool):
        return False
    if isinstance(device, int):
        return True  # a bare index means a CUDA device in torch
    if isinstance(device, str):
        return device.startswith('cuda')
    if isinstance(device, torch.device):
        return device.type == 'cuda'
    return False


def _caller_module(depth: int) -> str:
    frame = sys._getframe(depth)
    while frame is not None and frame.f_globals.get('__name__', '').startswith(('torch', __name__)):
        frame = frame.f_back
    return '' if frame is None else frame.f_globals.get('__name__', '')


_IDENTITY = {torch.Tensor.cuda, torch.Tensor.pin_memory}


class CudaToCpuMode(TorchFunctionMode):

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _IDENTITY:
            return args[0]
        if 'device' in kwargs and _is_cuda(kwargs['device']):
            kwargs = dict(kwargs, device='cpu')
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], 'cpu') + tuple(args[2:])
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            if name.startswith('torch.') and not name.startswith('torch.cuda.') and _caller_module(2).startswith(
                    'megatron.core'):
                return 'torch.cuda.' + name[len('torch.'):]
            return name
        return func(*args, **kwargs)


class NullStream:
    """Stand-in for ``torch.cuda.Stream`` / ``Event``: CPU work is synchronous, so every method is a no-op."""

    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        return lambda *args, **kwargs: None

    def query(self):
        return True

    def elapsed_time(self, other):
        return 0.0


_MODE = None


def enter_mode():
    """Push ``CudaToCpuMode`` on this thread's torch-function stack, once."""
    global _MODE
    if _MODE is None:
        _MODE = CudaToCpuMode()
        _MODE.__enter__()  # never exited: lives for the process


def patch_torch_cuda():
    cuda = torch.cuda
    cuda.current_device = lambda: 0  # an index; CudaToCpuMode maps device=0 to the CPU
    cuda.set_device = lambda device: None
    cuda.synchronize = lambda device=None: None
    cuda.Stream = NullStream
    cuda.Event = NullStream
    cuda.stream = lambda stream=None: contextlib.nullcontext()
    cuda.current_stream = lambda device=None: NullStream()
    cuda.default_stream = lambda device=None: NullStream()
    for name in ('memory_allocated', 'memory_reserved', 'max_memory_allocated', 'max_memory_reserved'):
        setattr(cuda, name, lambda device=None: 0)
    cuda.reset_peak_memory_stats = lambda device=None: None
    cuda.empty_cache = lambda: None
    # The "CUDA" RNG is the CPU default generator: megatron's tracker then forks/restores the generator that CPU
    # dropout actually draws from, so TP ranks get distinct streams in TP regions as they would on GPUs.
    cuda.get_rng_state = lambda device='cuda': torch.get_rng_state()
    cuda.set_rng_state = lambda new_state, device='cuda': torch.set_rng_state(new_state)

    def manual_seed(seed):
        torch.manual_seed(seed)

    cuda.manual_seed = manual_seed
