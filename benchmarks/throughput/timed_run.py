"""Run a command (a `megatron pt`), log it, and print its wall clock split at ms-swift's milestones (the recipe's
phases, swift_plt.recipe.phases) and its training-loop seconds (ms-swift's train_speed x steps).

    python benchmarks/throughput/timed_run.py LOG OUTPUT_DIR -- megatron pt ...
"""
import sys
import time

from swift_plt.recipe.phases import MilestoneClock, phase_seconds
from swift_plt.recipe.process import run_logged
from swift_plt.recipe.stage_report import train_logs, train_loop_seconds


def main(argv):
    log, out, sep, *cmd = argv
    assert sep == '--' and cmd, __doc__
    clock, t = MilestoneClock(), time.time()
    rc = run_logged(cmd, log, on_line=clock.line)
    clock.stop()
    wall = time.time() - t
    steps = train_logs(out)
    train = (train_loop_seconds(steps) or (float('nan'), 0))[0] if steps else float('nan')
    phases = ', '.join(f'{k} {v:.1f} s' for k, v in phase_seconds(clock.marks()))
    print(f'TIMED rc={rc} wall {wall:.1f} s, training {train:.1f} s ({len(steps)} logged steps); {phases}', flush=True)
    return rc


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
