"""ms-swift external plugin for the quality benchmark: one training loop on the GPU at a time, timed.

    megatron pt ... --external_plugins benchmarks/quality/gpu_lock.py --callbacks gpu_lock

Adds a Megatron callback `gpu_lock`. At `on_train_begin` (after model build, checkpoint load and data set-up) it
takes an exclusive `fcntl` lock on $QUAL_GPU_LOCK (if set) and starts a clock; at `on_train_end` (after the last
step and its checkpoint save) it synchronises CUDA, stops the clock, writes OUTPUT_DIR/gpu_time.json and releases
the lock. So several runs can start up (CPU work) concurrently while their training loops use the GPU one after
another, and each run's `train_seconds` is its training loop alone on the GPU. Benchmark-only: not part of the
plugin and not installed with it.
"""
import fcntl
import json
import os
import time

from swift.megatron.callbacks.base import MegatronCallback
from swift.megatron.callbacks.mapping import megatron_callbacks_map


def _sync():
    try:
        import torch
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 -- timing only
        pass


class GpuLockCallback(MegatronCallback):

    def on_train_begin(self):
        self.lock = None
        t = time.time()
        path = os.environ.get('QUAL_GPU_LOCK')
        if path:
            self.lock = open(path, 'a')
            fcntl.flock(self.lock, fcntl.LOCK_EX)
        self.wait = time.time() - t
        _sync()
        self.t0 = time.time()
        self.start_iteration = self.state.iteration
        self.step_ends = []
        self.saves = []

    def on_step_end(self):
        self.step_ends.append(time.time())

    def on_save(self, output_dir):
        self.saves.append(time.time())

    def on_train_end(self):
        _sync()
        t1 = time.time()
        steps = [round(b - a, 6) for a, b in zip([self.t0] + self.step_ends, self.step_ends)]
        rec = {'train_seconds': t1 - self.t0, 'steps_seconds': sum(steps),
               'save_seconds': (self.saves[-1] - self.step_ends[-1]) if self.saves and self.step_ends else None,
               'lock_wait_seconds': self.wait, 'start_unix': self.t0, 'end_unix': t1,
               'iterations': self.state.iteration - self.start_iteration, 'step_seconds': steps}
        with open(os.path.join(self.args.output_dir, 'gpu_time.json'), 'w') as f:
            json.dump(rec, f)
        if self.lock is not None:
            fcntl.flock(self.lock, fcntl.LOCK_UN)
            self.lock.close()


megatron_callbacks_map['gpu_lock'] = GpuLockCallback
