"""The README's two-stage command on a whole node of 1, 2, 4 and 8 GPUs (simulated: the recipe's visible-GPU count,
``stages.gpu_count``, monkeypatched; torch's count honours CUDA_VISIBLE_DEVICES, but CPU torch sees none), through the
dry run: each stage runs on every visible GPU, or one line before stage 1 names the --global_batch_size that does
(the recipe never changes G itself), and that value does."""
import os
import re
import shlex

import pytest

from swift_plt.recipe import cli
from swift_plt.recipe.process import Launch
from swift_plt.recipe.stages import all_gpus_hint
from test_two_stage_launch import opts_plan, recipe_argv

README = os.path.join(os.path.dirname(__file__), '..', '..', 'README.md')
HINT = re.compile(r'swift-plt-two-stage: hint: .*--global_batch_size (\d+) \(now (\d+)\) runs them on all (\d+)')


def readme_argv():
    """The arguments of the README's `swift-plt-two-stage` command (section "Two-stage recipe"), as written."""
    with open(README, encoding='utf-8') as f:
        text = f.read()
    section = text[text.index('## Two-stage recipe'):]
    block = re.search(r'```bash\n(.*?)```', section, re.S).group(1)
    argv = shlex.split(block.replace('\\\n', ' '))
    assert argv[0] == 'swift-plt-two-stage'
    return argv[1:]


def with_flag(argv, name, value):
    argv = list(argv)
    argv[argv.index(name) + 1] = value
    return argv


def dry_run(argv, gpus, monkeypatch, capsys):
    """The dry run's output on ``gpus`` visible GPUs, no NPROC_PER_NODE / NNODES; (stage process counts, hint lines,
    the index of each line) from it."""
    for k in ('NPROC_PER_NODE', 'NNODES'):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr('swift_plt.recipe.stages.gpu_count', lambda: gpus)
    assert cli.main([*argv, '--dry_run']) == 0
    lines = capsys.readouterr().out.splitlines()
    stage1 = lines.index('[stage1] start')
    counts = [int(re.match(r'    \$ NPROC_PER_NODE=(\d+) ', lines[i + 1]).group(1))
              for i, line in enumerate(lines) if line.startswith(('[stage1] ', '[stage2] '))]
    hints = [(i, line) for i, line in enumerate(lines) if line.startswith('swift-plt-two-stage: hint:')]
    return counts, hints, stage1


@pytest.fixture
def readme(model_dir, tmp_path):
    """The README's command with a model dir that exists here (the dry run reads its config.json) and a fresh
    output dir; every other argument as written."""
    argv = readme_argv()
    assert argv[argv.index('--global_batch_size') + 1] == '8' and argv[argv.index('--patch_size') + 1] == '4'
    return with_flag(with_flag(argv, '--model', model_dir), '--output_dir', str(tmp_path / 'two_stage'))


# README example (G=8, K=4: stage 1 takes 2 sequences per step, stage 2 8): visible GPUs -> (processes of each
# stage, the hinted --global_batch_size or None)
WANT = {1: (1, None), 2: (2, None), 4: (2, 16), 8: (2, 32)}


@pytest.mark.parametrize('gpus', sorted(WANT))
def test_readme_command_uses_every_gpu_or_says_the_flag_that_does(readme, gpus, monkeypatch, capsys):
    counts, hints, stage1 = dry_run(readme, gpus, monkeypatch, capsys)
    processes, hinted = WANT[gpus]
    assert counts == [processes, processes]
    if processes == gpus:
        assert hints == []
        return
    # one line, before stage 1, naming the flag, its value, the current one and the GPU count
    assert len(hints) == 1 and hints[0][0] < stage1, hints
    m = HINT.match(hints[0][1])
    assert m and tuple(map(int, m.groups())) == (hinted, 8, gpus), hints[0][1]
    # and the value does it: both stages on every GPU, no hint
    counts, hints, _ = dry_run(with_flag(readme, '--global_batch_size', str(hinted)), gpus, monkeypatch, capsys)
    assert counts == [gpus, gpus] and hints == []


def test_hint_is_the_smallest_batch_that_fits_and_says_what_it_changes(model_dir, tmp_path):
    opts, plan = opts_plan(recipe_argv(model_dir, tmp_path / 'o'))  # N=240K, K=4, T=256, G=8
    assert all_gpus_hint(opts, plan, Launch({'NPROC_PER_NODE': '2'}, 2, gpus=4)) == (
        'hint: the stages run on 2 of the 4 visible GPUs; --global_batch_size 16 (now 8) runs them on all 4: 2x the '
        'tokens per step, 39 + 19 steps instead of 78 + 39')
    # 3 GPUs: G/K and G must both split over 3 ranks: 12 (not a multiple of 8)
    assert '--global_batch_size 12 (now 8) runs them on all 3: 1.5x' in all_gpus_hint(
        opts, plan, Launch({}, 2, gpus=3))
    # a run already in OUTPUT_DIR keeps its plan: another G needs a new one
    assert 'runs them on all 4 in a new --output_dir (this one holds the run at 8):' in all_gpus_hint(
        opts, plan, Launch({}, 2, gpus=4), resuming=True)
    # no hint: every GPU runs, the user's count, or no global batch helps (TP 2 does not divide 3 GPUs)
    assert all_gpus_hint(opts, plan, Launch({}, 4, gpus=4)) == ''
    assert all_gpus_hint(opts, plan, Launch({}, 2, gpus=None)) == ''
    opts, plan = opts_plan(recipe_argv(model_dir, tmp_path / 'o', '--tensor_model_parallel_size', '2'))
    assert all_gpus_hint(opts, plan, Launch({}, 2, gpus=3)) == ''
    # a budget too small for one step at any larger G: no hint
    opts, plan = opts_plan(with_flag(recipe_argv(model_dir, tmp_path / 'o'), '--tokens', '7K'))
    assert all_gpus_hint(opts, plan, Launch({}, 2, gpus=4)) == ''


def test_user_count_gets_no_hint(readme, monkeypatch, capsys):
    monkeypatch.setenv('NPROC_PER_NODE', '1')
    monkeypatch.setattr('swift_plt.recipe.stages.gpu_count', lambda: 8)
    assert cli.main([*readme, '--dry_run']) == 0
    assert 'hint:' not in capsys.readouterr().out
