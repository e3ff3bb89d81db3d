"""CPU test harness hook for subprocesses: with SWIFT_PLT_CPU_HARNESS=1, run ``harness.install()`` at start-up.

``harness.cli.run_cli`` puts this directory on PYTHONPATH, so every Python process of a CLI run (the ``megatron`` /
``swift`` entry point, torchrun's launcher, each rank, dataset workers) gets the CPU patches before it imports
ms-swift. Without the variable this file does nothing.
"""
import os
import sys

if os.environ.get('SWIFT_PLT_CPU_HARNESS') == '1':
    _tests_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if _tests_dir not in sys.path:
        sys.path.append(_tests_dir)  # appended: never shadows anything installed
    from harness import install

    install()
    del _tests_dir
