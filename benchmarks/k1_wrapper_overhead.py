#!/usr/bin/env python3
"""Per-call cost of the plugin's K=1 wrappers around stub upstream functions: what a wrapper adds to a call at K=1.

    python benchmarks/k1_wrapper_overhead.py

The wrappers are the real ones (patches/swift_megatron_trainers_utils.py: get_batch_on_this_pp_rank, once per
micro-batch; swift_megatron_utils.py: get_padding_to, once per collated batch, in the dataloader workers;
swift_megatron_trainers_base.py: train_step, once per step), applied to stand-in modules whose upstream function
returns at once. Prints the best of 5 x 200k calls, wrapped and bare, in microseconds.
"""
import timeit
import types
from types import SimpleNamespace

from swift_plt.patches import swift_megatron_trainers_base as tb
from swift_plt.patches import swift_megatron_trainers_utils as tu
from swift_plt.patches import swift_megatron_utils as mu


def stub_batch(args, data, vp_stage=None):
    return data


def stub_pad(args):
    return None


class Trainer:

    def train_step(self, train_data_iterator):
        return None


def main():
    m1, m2, m3 = types.ModuleType('m1'), types.ModuleType('m2'), types.ModuleType('m3')
    m1.get_batch_on_this_pp_rank, m2.get_padding_to, m3.BaseMegatronTrainer = stub_batch, stub_pad, Trainer
    tu.apply(m1)
    mu.apply(m2)
    tb.apply(m3)
    args, data = SimpleNamespace(patch_size=1, task_type='causal_lm'), {}
    trainer = Trainer()
    trainer.args = args
    n = 200000
    for name, wrapped, bare in [
        ('get_batch_on_this_pp_rank', lambda: m1.get_batch_on_this_pp_rank(args, data), lambda: stub_batch(args, data)),
        ('get_padding_to', lambda: m2.get_padding_to(args), lambda: stub_pad(args)),
        ('train_step', lambda: Trainer.train_step(trainer, None), lambda: None),
    ]:
        a = min(timeit.repeat(wrapped, number=n, repeat=5)) / n * 1e6
        b = min(timeit.repeat(bare, number=n, repeat=5)) / n * 1e6
        print(f'K1WRAP {name}: wrapped {a:.3f} us, bare {b:.3f} us, added {a - b:.3f} us per call')


if __name__ == '__main__':
    main()
