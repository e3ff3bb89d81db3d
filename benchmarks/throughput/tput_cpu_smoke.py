#!/usr/bin/env python3
"""CPU smoke run of the pipelined throughput launcher with the real `megatron pt` (ms-swift 4.6) on a tiny Llama.

    python benchmarks/throughput/tput_cpu_smoke.py WORK_DIR [--rounds 1] [--rounds-m8 1] [--lookahead 3] [--budget 900]
    python benchmarks/throughput/tput_cpu_smoke.py WORK_DIR --families     # families.sh's runs: toy qwen3, qwen3_moe

Same launcher and step probe as throughput_1b.sh (turn gate in BaseMegatronTrainer.__init__, os._exit
after the last step, torchrun's worker in its own session), but the tiny model of tests/harness, the CPU flags of
tests/harness (gloo, unfused attention, no padding-free), fp32 and 64/256 positions at K=1/4; then
throughput_summary.py. Not a timing: it proves the plumbing with the real stack. Needs tests/ (the
harness) and the plugin installed in this interpreter's environment; minutes on 2 cores.
"""
import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, 'tests'))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('work')
    ap.add_argument('--rounds', default='1')
    ap.add_argument('--rounds-m8', default='1')
    ap.add_argument('--lookahead', default='3')
    ap.add_argument('--budget', type=float, default=900)
    ap.add_argument('--train-cpus', default=None)
    ap.add_argument('--start-cpus', default=None)
    ap.add_argument('--families', action='store_true',
                    help="families.sh's runs (dense_stock dense_plt4 moe_stock moe_plt4) on toy-width qwen3 and "
                    'qwen3_moe dirs of tests/gpu/make_family_configs.py --tiny; then families_summary.py')
    a = ap.parse_args()
    from harness.cli import CPU_MEGATRON_ARGS, harness_env
    from harness.tiny import make_jsonl, make_tiny_llama
    os.makedirs(a.work, exist_ok=True)
    data = make_jsonl(os.path.join(a.work, 'data.jsonl'), rows=1500)
    env = harness_env({}, 1)
    env.pop('MASTER_PORT')  # one per run, from the launcher
    extra = ['--torch_dtype', 'float32', '--bf16', 'false', '--fp16', 'false', '--dataloader_num_workers', '1',
             *CPU_MEGATRON_ARGS]
    if a.families:
        mdir = os.path.join(a.work, 'models')
        subprocess.check_call([sys.executable, os.path.join(REPO, 'tests', 'gpu', 'make_family_configs.py'), '--out',
                               mdir, '--tiny', '--device', 'cpu', '--only', 'qwen3-1.7b,qwen3-30b-a3b-cut'])
        runs = ['--family', f'dense={mdir}/qwen3-1.7b', '--family', f'moe={mdir}/qwen3-30b-a3b-cut', '--template',
                'default']
    else:
        runs = ['--model', make_tiny_llama(os.path.join(a.work, 'tiny'))]
        extra = ['--template', 'llama', *extra]
    cmd = [sys.executable, os.path.join(HERE, 'tput_launch.py'), '--work', a.work, *runs,
           '--data-k1', data, '--data-k4', data, '--rounds', a.rounds, '--rounds-m8', a.rounds_m8, '--lookahead',
           a.lookahead, '--iters', '6', '--positions', '64', '--deadline', repr(time.time() + a.budget),
           '--turn-secs', '10', '--megatron', 'megatron', '--extra-args', ' '.join(extra)]
    if a.train_cpus:
        cmd += ['--train-cpus', a.train_cpus, '--start-cpus', a.start_cpus]
    rc = subprocess.call(cmd, env=env, cwd=REPO)
    if a.families:
        return subprocess.call([sys.executable, os.path.join(HERE, 'families_summary.py'), a.work, '--warm', '2'],
                               cwd=REPO) or rc
    subprocess.call([sys.executable, os.path.join(HERE, 'throughput_summary.py'),
                     os.path.join(a.work, 'probes'), '--warm', '2'], cwd=REPO)
    return rc


if __name__ == '__main__':
    sys.exit(main())
