"""How many processes the recipe's CLIs get (the user's NPROC_PER_NODE / NNODES, else the visible GPUs, as the batch
allows), that the stage and export commands carry it, and what a failed step says."""
import json
import os
import sys

import pytest

from swift_plt.recipe import cli, export
from swift_plt.recipe.options import parse_options
from swift_plt.recipe.early_start import GATE_ENV, PARENT_ENV, read_gate
from swift_plt.recipe.plan import make_plan
from swift_plt.recipe.process import export_launch, failure_cause, pick_launch, run_logged
from swift_plt.recipe.stages import plan_steps, stage_launch

NO_GPU_CHECK = 'device_count must not be called when the user set the process count'


def never():
    raise AssertionError(NO_GPU_CHECK)


def fits_all(n):
    return None


def recipe_argv(model_dir, out, *extra):
    """N=240K, K=4, λ=2/3, T=256, G=8: stage 1 takes G/K = 2 sequences of 1024 tokens per step, stage 2 8 of 256."""
    return ['--model', model_dir, '--output_dir', str(out), '--tokens', '240K', '--max_length', '256',
            '--global_batch_size', '8', '--dataset', 'd.jsonl', *extra]


def opts_plan(argv):
    opts = parse_options(argv)
    return opts, make_plan(opts.tokens, opts.patch_size, opts.lam, seq_length=opts.max_length,
                           global_batch_size=opts.global_batch_size, stage1_batch=opts.stage1_batch)


# ---------------------------------------------------------------------------------------------- the count
@pytest.mark.parametrize('devices, want, what', [
    (0, 1, 'no visible GPU'),
    (1, 1, '1 visible GPU'),
    (2, 2, '2 visible GPUs'),
    (8, 8, '8 visible GPUs'),
])
def test_unset_picks_the_visible_gpus_or_1(devices, want, what):
    launch = pick_launch({}, fits_all, lambda: devices)
    assert launch.env == {'NPROC_PER_NODE': str(want)} and launch.world_size == want
    assert launch.note == f'NPROC_PER_NODE={want} ({what}; set NPROC_PER_NODE to override)'


@pytest.mark.parametrize('environ, world', [
    ({'NPROC_PER_NODE': '1'}, 1),
    ({'NPROC_PER_NODE': '4'}, 4),
    ({'NNODES': '2'}, 2),  # torchrun: 1 process per node by default
    ({'NPROC_PER_NODE': '4', 'NNODES': '2'}, 8),
    ({'NPROC_PER_NODE': 'auto'}, None),  # torchrun's own choice: not known here
    ({'NNODES': '1:2'}, None),
])
def test_user_setting_is_kept_unchanged(environ, world):
    launch = pick_launch(dict(environ, OTHER='x'), fits_all, never)
    assert launch.env == {} and launch.world_size == world  # nothing added: the user's environment as it is
    assert launch.note == ' '.join(f'{k}={v}' for k, v in environ.items()) + ' (from the environment)'


def test_unset_count_is_lowered_to_what_the_batch_allows():
    # fits: at most 2 data-parallel processes
    launch = pick_launch({}, lambda n: None if n <= 2 else f'{n} is too many', lambda: 8)
    assert launch.env == {'NPROC_PER_NODE': '2'}
    assert launch.note == ('NPROC_PER_NODE=2 (8 visible GPUs; 8 processes would not fit: 8 is too many; set '
                           'NPROC_PER_NODE to override)')
    # nothing fits: all the GPUs, and the caller says why
    assert pick_launch({}, lambda n: 'no', lambda: 4).env == {'NPROC_PER_NODE': '4'}


def test_stage_count_follows_the_data_parallel_arithmetic(model_dir, tmp_path):
    """megatron: processes % (TP·PP·CP) == 0 and global batch % (micro batch x DP) == 0, for both stages."""
    opts, plan = opts_plan(recipe_argv(model_dir, tmp_path / 'o'))
    assert (plan.stage1.global_batch_size, plan.stage2.global_batch_size) == (2, 8)
    assert stage_launch(opts, plan, {}, lambda: 1).env == {'NPROC_PER_NODE': '1'}
    assert stage_launch(opts, plan, {}, lambda: 2).env == {'NPROC_PER_NODE': '2'}
    launch = stage_launch(opts, plan, {}, lambda: 8)  # stage 1's 2 sequences per step: DP <= 2
    assert launch.env == {'NPROC_PER_NODE': '2'}
    assert 'stage 1: its --global_batch_size 2 is not a multiple of data-parallel size 8, not even at ' \
        '--micro_batch_size 1' in launch.note
    opts, plan = opts_plan(recipe_argv(model_dir, tmp_path / 'o', '--micro_batch_size', '2'))
    launch = stage_launch(opts, plan, {}, lambda: 4)  # DP 2 fits at a smaller stage-1 micro batch
    assert launch.env == {'NPROC_PER_NODE': '2'} and launch.stage_args == {1: ['--micro_batch_size', '1']}
    opts, plan = opts_plan(recipe_argv(model_dir, tmp_path / 'o', '--tensor_model_parallel_size', '2'))
    assert stage_launch(opts, plan, {}, lambda: 8).env == {'NPROC_PER_NODE': '4'}  # TP2 x DP2
    assert stage_launch(opts, plan, {}, lambda: 3).env == {'NPROC_PER_NODE': '2'}  # TP2 x DP1


@pytest.mark.parametrize('environ, extra, message', [
    ({'NPROC_PER_NODE': '4'}, [], 'stage 1: its --global_batch_size 2 is not a multiple of data-parallel size 4, '
     'not even at --micro_batch_size 1 (stage 1 takes G/K = 2 sequences of 1024 tokens per step, --stage1_batch '
     'tokens). The stages would run NPROC_PER_NODE=4 (from the environment)'),
    # the user's count is kept: a micro batch that does not fit is refused, with the one that does
    ({'NPROC_PER_NODE': '2'}, ['--micro_batch_size', '2'], 'stage 1: its --global_batch_size 2 is not a multiple of '
     '--micro_batch_size 2 x data-parallel size 2 (stage 1 takes G/K = 2 sequences of 1024 tokens per step, '
     '--stage1_batch tokens): give stage 1 --stage1_args "--micro_batch_size 1"'),
    ({'NNODES': '4'}, [], 'data-parallel size 4'),
    ({'NPROC_PER_NODE': '1'}, ['--stage2_args', '--context_parallel_size 2'],
     'stage 2: 1 process(es) is not a multiple of TP·PP·CP = 2'),
    ({}, ['--tensor_model_parallel_size', '2'], 'stage 1: 1 process(es) is not a multiple of TP·PP·CP = 2'),
])
def test_a_count_that_does_not_fit_is_refused_before_anything_runs(model_dir, tmp_path, capsys, monkeypatch,
                                                                    environ, extra, message):
    for k in ('NPROC_PER_NODE', 'NNODES'):
        monkeypatch.delenv(k, raising=False)
    for k, v in environ.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr('swift_plt.recipe.stages.gpu_count', lambda: 1)
    assert cli.main(recipe_argv(model_dir, tmp_path / 'out', *extra)) == 2
    assert message in capsys.readouterr().err
    assert not os.path.exists(tmp_path / 'out')


def test_export_count_is_its_model_parallel_size():
    assert export_launch([], {}).env == {'NPROC_PER_NODE': '1'}
    launch = export_launch(['--tensor_model_parallel_size', '2', '--pipeline_model_parallel_size=2'], {})
    assert launch.env == {'NPROC_PER_NODE': '4'}
    assert launch.note == 'NPROC_PER_NODE=4 (TP·PP·CP of the export; set NPROC_PER_NODE to override)'
    assert export_launch(['--tensor_model_parallel_size', '2'], {'NPROC_PER_NODE': '8'}).env == {}
    with pytest.raises(ValueError, match="--tensor_model_parallel_size 'x' must be a positive integer"):
        export_launch(['--tensor_model_parallel_size', 'x'], {})


# ---------------------------------------------------------------------------------------------- the commands
def test_stage_and_export_steps_carry_the_count(model_dir, tmp_path):
    opts, plan = opts_plan(recipe_argv(model_dir, tmp_path / 'o'))
    steps = {s.name: s for s in plan_steps(opts, plan, {'NPROC_PER_NODE': '2'}, {'NPROC_PER_NODE': '1'})}
    assert steps['stage1'].env == steps['stage2'].env == {'NPROC_PER_NODE': '2'}
    assert steps['export'].env == {'NPROC_PER_NODE': '1'}
    assert all(s.env == {} for s in plan_steps(opts, plan))


def test_dry_run_says_what_it_picked(model_dir, tmp_path, capsys, monkeypatch):
    for k in ('NPROC_PER_NODE', 'NNODES'):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr('swift_plt.recipe.stages.gpu_count', lambda: 1)
    assert cli.main(recipe_argv(model_dir, tmp_path / 'out', '--dry_run')) == 0
    out = capsys.readouterr().out
    assert 'swift-plt-two-stage: NPROC_PER_NODE=1 (1 visible GPU; set NPROC_PER_NODE to override)\n' in out
    assert out.count('    $ NPROC_PER_NODE=1 ') == 2  # both stage commands, as they will run
    monkeypatch.setattr('swift_plt.recipe.stages.gpu_count', lambda: 4)
    assert cli.main(recipe_argv(model_dir, tmp_path / 'out', '--dry_run')) == 0
    out = capsys.readouterr().out
    assert ('swift-plt-two-stage: NPROC_PER_NODE=2 (4 visible GPUs; 4 processes would not fit: stage 1: its '
            '--global_batch_size 2 is not a multiple of data-parallel size 4, not even at --micro_batch_size 1 (stage '
            '1 takes G/K = 2 sequences of 1024 tokens per step, --stage1_batch tokens); set NPROC_PER_NODE to '
            'override); the export: NPROC_PER_NODE=1 (TP·PP·CP of the export; set NPROC_PER_NODE to '
            'override)\n') in out
    assert 'swift-plt-two-stage: stage 1: --micro_batch_size 1; not sized from GPU memory: no CUDA device here\n' in out


class Finished:
    """A LoggedRun that already ended with ``rc``."""

    def __init__(self, rc):
        self.rc = rc

    def wait(self):
        return self.rc

    def show(self):
        pass


class FakeRun:
    """Stands in for run_logged (or LoggedRun: ``started``): records the command and environment, writes ``log``
    and returns ``rc``."""

    def __init__(self, log='', rc=1, started=False):
        self.calls, self.log, self.rc, self.started = [], log, rc, started

    def __call__(self, cmd, log_path, extra_env=None, on_line=None, quiet=False):
        self.calls.append((cmd, extra_env))
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        with open(log_path, 'a') as f:
            f.write(self.log)
        return Finished(self.rc) if self.started else self.rc


@pytest.mark.parametrize('environ, env', [({}, {'NPROC_PER_NODE': '1'}), ({'NPROC_PER_NODE': '1'}, {})])
def test_stage_runs_with_the_count_and_a_failure_names_log_and_cause(model_dir, tmp_path, capsys, monkeypatch,
                                                                      environ, env):
    for k in ('NPROC_PER_NODE', 'NNODES'):
        monkeypatch.delenv(k, raising=False)
    for k, v in environ.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr('swift_plt.recipe.stages.gpu_count', lambda: 1)
    fake = FakeRun('[rank0]: ValueError: Error initializing torch.distributed using env:// rendezvous: environment '
                   'variable RANK expected, but not set\n', started=True)
    monkeypatch.setattr(cli, 'LoggedRun', fake)
    out = tmp_path / 'out'
    assert cli.main(recipe_argv(model_dir, out)) == 1
    # stage 1 ran (and failed); stage 2, started beside it, was told to stop at its gate; no export
    (cmd1, env1), (cmd2, env2) = sorted(fake.calls, key=lambda c: c[0][c[0].index('--patch_size') + 1], reverse=True)
    assert cmd1[1] == 'pt' and cmd1[cmd1.index('--patch_size') + 1] == '4'
    assert env1 == env
    gate = env2.pop(GATE_ENV)
    assert read_gate(gate) == {'ok': False, 'why': f'stage 1 failed (exit code 1; log: {out}/logs/stage1.log)'}
    assert env2.pop(PARENT_ENV) == str(os.getpid()) and int(env2.pop('MASTER_PORT')) > 0 and env2 == env
    err = capsys.readouterr().err
    log = out / 'logs' / 'stage1.log'
    assert f'log: {log}' in err
    assert 'likely cause: ms-swift ran without torchrun: set NPROC_PER_NODE' in err
    assert 'rerun the same command' in err


def test_export_failure_names_log_and_cause(tmp_path, monkeypatch):
    ckpt = tmp_path / 'run' / 'checkpoint-3'
    (ckpt / 'iter_0000003').mkdir(parents=True)
    (ckpt / 'latest_checkpointed_iteration.txt').write_text('3')
    (tmp_path / 'config.json').write_text('{"model_type": "llama"}')
    fake = FakeRun('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n')
    monkeypatch.setattr(export, 'run_logged', fake)
    log = tmp_path / 'logs' / 'export.log'
    with pytest.raises(RuntimeError) as e:
        export.export_vanilla(str(ckpt), str(tmp_path / 'hf'), str(tmp_path), log_path=str(log),
                              extra_env={'NPROC_PER_NODE': '1'})
    assert f'log: {log}' in str(e.value) and 'likely cause: out of GPU memory' in str(e.value)
    assert fake.calls[0][1] == {'NPROC_PER_NODE': '1'}


# ---------------------------------------------------------------------------------------------- logs
def test_failure_cause_reads_this_invocation_only(tmp_path):
    log = tmp_path / 'stage1.log'
    log.write_text('$ megatron pt\nRuntimeError: CUDA out of memory\n')  # an earlier invocation
    offset = log.stat().st_size
    with open(log, 'a') as f:
        f.write('$ megatron pt\n[rank0]: Traceback (most recent call last):\n[rank0]: KeyError: \'input_ids\'\n'
                'torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n')
    assert failure_cause(str(log)).startswith('out of GPU memory')
    assert failure_cause(str(log), offset) == "the last error in the log: KeyError: 'input_ids'"
    with open(log, 'a') as f:
        f.write("ModuleNotFoundError: No module named 'transformer_engine'\n")
    assert failure_cause(str(log), offset) == ("a Python package is missing (ModuleNotFoundError: No module named "
                                               "'transformer_engine').")
    log.write_text('nothing recognisable\n')
    assert failure_cause(str(log)) == 'not recognised: see the end of the log.'
    assert failure_cause(str(tmp_path / 'missing.log')).startswith('no log at ')


def test_run_logged_adds_the_environment_and_records_it(tmp_path, capsys):
    log = tmp_path / 'logs' / 'x.log'
    cmd = [sys.executable, '-c', 'import json, os; print(json.dumps([os.environ["NPROC_PER_NODE"], "PATH" in '
           'os.environ]))']
    assert run_logged(cmd, str(log), {'NPROC_PER_NODE': '3'}) == 0
    lines = log.read_text().splitlines()
    assert lines[0].startswith('$ ') and lines[1] == '# environment: NPROC_PER_NODE=3'
    assert json.loads(lines[2]) == ['3', True]  # added to the inherited environment
    assert capsys.readouterr().out.strip() == lines[2]
