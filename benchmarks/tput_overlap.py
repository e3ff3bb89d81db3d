#!/usr/bin/env python3
"""Which other runs were starting up while a run's steps were timed (pipelined throughput benchmark).

    python benchmarks/tput_overlap.py benchmarks/results/h200_2026-11-23

benchmarks/tput_launch.py starts run i+LOOKAHEAD-1 when run i gets the turn, so a run's timed steps can overlap the
start-up (imports, tokenisation with --dataset_num_proc workers, packing) of up to LOOKAHEAD-1 others, on the start
cores but on the same host (memory bandwidth, caches, the GPU feeder's CPU time). Reads ``launch.json`` (start and
turn per run, seconds from the launcher's start) and ``throughput.json`` (per run: ``startup_s`` = launch to
``BaseMegatronTrainer.__init__``, ``turn_to_step1_s``, ``turn_to_last_step_s``, ``step_s_median``). The steps
window is turn + [step 1, last step]; another run's start-up window is [start, start + startup_s] (exit for a run
with no probe record). Prints one line per run: ms/step, the window and every start-up that overlaps it.
"""
import json
import os
import sys


def overlaps(launch, runs):
    starts = {r['key']: r for r in launch['runs']}
    rows = []
    for key, v in runs.items():
        turn = starts[key]['turn']
        w0, w1 = turn + v['turn_to_step1_s'], turn + v['turn_to_last_step_s']
        ov = []
        for other, r in starts.items():
            if other == key or r['start'] is None:
                continue
            s = r['start']
            e = s + runs[other]['startup_s'] if other in runs and runs[other].get('startup_s') else r['exit']
            o = min(w1, e) - max(w0, s)
            if o > 0:
                ov.append((other, s, e, o))
        rows.append((key, v['step_s_median'] * 1e3, w0, w1, ov))
    return rows


def main():
    d = sys.argv[1]
    with open(os.path.join(d, 'launch.json')) as f:
        launch = json.load(f)
    with open(os.path.join(d, 'throughput.json')) as f:
        runs = json.load(f)['runs']
    for key, ms, w0, w1, ov in overlaps(launch, runs):
        others = '; '.join(f'{o} [{s:.0f}, {e:.0f}] s ({t:.1f} s)' for o, s, e, t in ov) or 'none'
        print(f'OVERLAP {key:12s} {ms:6.1f} ms/step, steps [{w0:.0f}, {w1:.0f}] s, {len(ov)} start-ups overlapping: '
              f'{others}')


if __name__ == '__main__':
    main()
