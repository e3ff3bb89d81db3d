"""pytest set-up of the CPU suite.

Triton decides between compiling and its CPU interpreter (``TRITON_INTERPRET=1``) when it is imported, and upstream
code that other test modules import (megatron-core, mcore-bridge) may import it before ``tests/*/test_plt_triton*.py``
are collected: the fused-loss kernels then refuse to run on CPU tensors ("Cannot call @triton.jit'd outside of the
scope of a kernel", seen in a mixed run). So on a machine without CUDA the interpreter is switched on here, before
any test module is imported; the processes the tests start inherit it (they launch no Triton kernel)."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')
