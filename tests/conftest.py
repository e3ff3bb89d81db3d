"""pytest set-up of the CPU suite.

Triton decides between compiling and its CPU interpreter (``TRITON_INTERPRET=1``) when it is imported, and upstream
code that other test modules import (megatron-core, mcore-bridge) may import it before ``tests/*/test_plt_triton*.py``
are collected: the fused-loss kernels then refuse to run on CPU tensors ("Cannot call @triton.jit'd outside of the
scope of a kernel", seen in a mixed run). So on a machine without CUDA the interpreter is switched on here, before
any test module is imported; the processes the tests start inherit it (they launch no Triton kernel)."""
import inspect
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')


def pytest_configure(config):
    """Under ``--dist loadgroup`` pytest-xdist groups a test by writing ``item._nodeid``; pytest 9.2 derives the node id
    from elsewhere, so the ``xdist_group`` marks are silently ignored there (module fixtures then run on every
    worker): stop before collecting instead."""
    from _pytest.nodes import Node
    if config.getoption('dist', 'no') == 'loadgroup' and '._nodeid' not in inspect.getsource(Node.nodeid.fget):
        raise pytest.UsageError(f'pytest {pytest.__version__} ignores the xdist_group marks of --dist loadgroup '
                                '(Node.nodeid no longer reads _nodeid, which pytest-xdist sets): install pytest<9.2 '
                                '(setup.py [test])')
