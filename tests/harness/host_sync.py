"""Count the host copies (device syncs on a GPU) that code under test makes, on CPU tensors."""
import torch

HOST_SYNCS = ('item', 'tolist', 'numpy', '__bool__', '__int__', '__float__', '__index__')


def count_host_syncs(monkeypatch):
    """Count the Tensor methods that copy a value to the host (a device sync on GPU); CPU stands in for the GPU."""
    calls, depth = [], [0]
    for name in HOST_SYNCS:
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _name=name, _original=original, **kw):
            if not depth[0]:  # outermost only: a torch function mode (the harness's, once installed in this
                calls.append(_name)  # process) dispatches the same method again
            depth[0] += 1
            try:
                return _original(self, *a, **kw)
            finally:
                depth[0] -= 1

        monkeypatch.setattr(torch.Tensor, name, counted)
    return calls
