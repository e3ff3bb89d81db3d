"""The two-stage recipe without running it: budget arithmetic (brute force and by hand), the errors, the commands
it composes, the resume state machine on fake checkpoint dirs, the YAML form, and the vanilla-export checks."""
import itertools
import json
import math
import os
import random
import re
from fractions import Fraction
from unittest import mock

import pytest

from swift_plt.recipe import export as vanilla
from swift_plt.recipe.cli import main
from swift_plt.recipe.family import REGISTER_FILE, causal_lm_class, run_model_type
from swift_plt.recipe.options import RecipeError, check_micro_batch, parse_options
from swift_plt.recipe.plan import make_plan, min_tokens, parse_lam, parse_tokens
from swift_plt.recipe.stages import check_plan_file, plan_steps

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')


# ---------------------------------------------------------------------------------------------- arithmetic
def brute_force_iters(budget, per_step):
    n = 0
    while (n + 1) * per_step <= budget:
        n += 1
    return n


@pytest.mark.parametrize('stage1_batch', ['tokens', 'sequences'])
def test_plan_matches_brute_force_on_random_inputs(stage1_batch):
    rng = random.Random(0)
    for _ in range(300):
        k, t = rng.randint(2, 8), rng.choice([8, 16, 32, 100])
        g = rng.randint(1, 4) * k if stage1_batch == 'tokens' else rng.randint(1, 16)
        g1 = g // k if stage1_batch == 'tokens' else g  # stage-1 sequences (of k*t tokens) per step
        q = rng.randint(2, 12)
        lam = Fraction(rng.randint(1, q - 1), q)
        n = rng.randint(min_tokens(k, lam, t, g, stage1_batch), 40 * g * k * t)
        plan = make_plan(n, k, lam, seq_length=t, global_batch_size=g, stage1_batch=stage1_batch)
        # stage 1's share: the largest integer <= λ·N, found by counting (λ exact: p/q)
        share1 = max(x for x in range(n + 1) if x * lam.denominator <= lam.numerator * n)
        assert (plan.stage1.budget_tokens, plan.stage2.budget_tokens) == (share1, n - share1)
        assert (plan.stage1.global_batch_size, plan.stage2.global_batch_size) == (g1, g)
        assert plan.stage1.train_iters == brute_force_iters(share1, g1 * k * t)
        assert plan.stage2.train_iters == brute_force_iters(n - share1, g * t)
        assert plan.stage1.seq_length == k * t and plan.stage2.seq_length == t
        assert plan.stage1.tokens == plan.stage1.train_iters * g1 * k * t <= share1
        assert plan.stage2.tokens == plan.stage2.train_iters * g * t <= n - share1
        assert plan.consumed_tokens <= n
        assert plan.nominal_compute_ratio == lam / k + 1 - lam
        # model positions run (a stage-1 sequence of k*t tokens is t positions) / positions of token-level
        # training on the tokens consumed (one per token), counted step by step
        positions = plan.stage1.train_iters * g1 * t + plan.stage2.train_iters * g * t
        assert plan.actual_compute_ratio == Fraction(positions, plan.consumed_tokens)


def test_stage1_batch_keeps_tokens_per_step_by_default():
    """The paper's set-up (PatchTrain run_patch.sh / run_token.sh): the same tokens per optimizer step in both
    stages, so stage 1 gets K times the steps of --stage1_batch sequences."""
    by_tokens = make_plan('2B', 4, '2/3', seq_length=2048, global_batch_size=256)
    by_sequences = make_plan('2B', 4, '2/3', seq_length=2048, global_batch_size=256, stage1_batch='sequences')
    assert by_tokens.stage1_batch == 'tokens'
    assert by_tokens.stage1.global_batch_size == 64 and by_sequences.stage1.global_batch_size == 256
    assert by_tokens.stage1.tokens_per_step == by_tokens.stage2.tokens_per_step == 256 * 2048
    assert by_tokens.stage1.train_iters == 1_333_333_333 // (256 * 2048) == 2543
    assert by_sequences.stage1.train_iters == 635
    assert by_tokens.stage2 == by_sequences.stage2
    assert 'global_batch_size=64' in by_tokens.summary() and 'stage1_batch=tokens' in by_tokens.summary()


@pytest.mark.parametrize('g, k', [(2, 4), (6, 4), (9, 2)])
def test_stage1_batch_tokens_needs_g_multiple_of_k(g, k):
    with pytest.raises(ValueError, match=f'--global_batch_size {g} is not a multiple of --patch_size {k}.*'
                       '--stage1_batch sequences'):
        make_plan('1M', k, '2/3', seq_length=16, global_batch_size=g)
    assert make_plan('1M', k, '2/3', seq_length=16, global_batch_size=g, stage1_batch='sequences').stage1.\
        global_batch_size == g
    with pytest.raises(ValueError, match="--stage1_batch 'rows': use one of tokens, sequences"):
        make_plan('1M', k, '2/3', seq_length=16, global_batch_size=g, stage1_batch='rows')


def test_plan_by_hand():
    # README example: N=2B, K=4, λ=2/3, T=2048, G=256 (stage 1 at G sequences per step)
    plan = make_plan('2B', 4, '2/3', seq_length=2048, global_batch_size=256, stage1_batch='sequences')
    assert plan.stage1.budget_tokens == 1_333_333_333  # floor(2e9 * 2/3)
    assert plan.stage1.tokens_per_step == 256 * 4 * 2048 == 2_097_152
    assert plan.stage1.train_iters == 635  # 1333333333 / 2097152 = 635.78
    assert plan.stage2.budget_tokens == 666_666_667
    assert plan.stage2.tokens_per_step == 524_288
    assert plan.stage2.train_iters == 1271  # 666666667 / 524288 = 1271.56
    assert plan.nominal_compute_ratio == Fraction(1, 2)
    assert plan.actual_compute_ratio == Fraction(635 + 1271, 4 * 635 + 1271)
    text = plan.summary()
    assert 'train_iters 635 (rounded down)' in text and 'train_iters 1,271 (rounded down)' in text
    assert 'λ/K + 1 - λ = 0.5000 (FLOP saving 50.0%)' in text
    # exact fits: nothing left by rounding
    plan = make_plan(3 * 4096, 4, '2/3', seq_length=256, global_batch_size=2,
                     stage1_batch='sequences')  # 8192 / 2048, 4096 / 512
    assert (plan.stage1.train_iters, plan.stage2.train_iters, plan.consumed_tokens) == (4, 8, 3 * 4096)
    assert plan.actual_compute_ratio == Fraction(12, 24)
    plan = make_plan(3 * 4096, 4, '2/3', seq_length=256, global_batch_size=4)  # 8192 / 1024, 4096 / 1024
    assert (plan.stage1.train_iters, plan.stage2.train_iters, plan.consumed_tokens) == (8, 4, 3 * 4096)
    assert plan.actual_compute_ratio == Fraction(8 * 256 + 4 * 1024, 3 * 4096) == Fraction(1, 2)


def test_lambda_is_exact_not_float():
    # float(0.29) * 100 = 28.999999999999996 -> a float floor would give stage 1 one token less
    assert math.floor(0.29 * 100) == 28
    plan = make_plan(100, 2, '0.29', seq_length=1, global_batch_size=1, stage1_batch='sequences')
    assert plan.stage1.budget_tokens == 29 and plan.stage1.train_iters == 14  # 29 // 2
    assert parse_lam('2/3') == Fraction(2, 3) and parse_lam(0.5) == Fraction(1, 2)


@pytest.mark.parametrize('k, lam, t, g', list(itertools.product([2, 4], ['1/2', '2/3', '0.9', '1/7'], [1, 3, 16],
                                                                 [1, 5])))
@pytest.mark.parametrize('stage1_batch', ['tokens', 'sequences'])
def test_min_tokens_is_the_smallest_budget_with_one_step_per_stage(k, lam, t, g, stage1_batch):
    g = g * k if stage1_batch == 'tokens' else g
    n = min_tokens(k, parse_lam(lam), t, g, stage1_batch)
    plan = make_plan(n, k, lam, seq_length=t, global_batch_size=g, stage1_batch=stage1_batch)
    assert plan.stage1.train_iters >= 1 and plan.stage2.train_iters >= 1
    with pytest.raises(ValueError, match='too small for one training step'):
        make_plan(n - 1, k, lam, seq_length=t, global_batch_size=g, stage1_batch=stage1_batch)


def test_too_small_budget_message_names_the_stage_and_the_minimum():
    with pytest.raises(ValueError) as e:
        make_plan(1000, 4, '2/3', seq_length=64, global_batch_size=4,
                  stage1_batch='sequences')  # stage 1 needs 1024 tokens per step
    msg = str(e.value)
    assert 'stage 1 (patch level) gets 666 tokens but one step needs 1,024' in msg
    assert 'stage 2 (token level) gets 334 tokens but one step needs 256' not in msg  # stage 2 has a step
    assert f'--tokens >= {min_tokens(4, Fraction(2, 3), 64, 4, "sequences"):,}' in msg


@pytest.mark.parametrize('lam', ['0', '1', '-0.1', '1.5', '3/2', 0, 1.0])
def test_lambda_outside_0_1_is_refused(lam):
    with pytest.raises(ValueError, match=r'outside \(0, 1\)'):
        make_plan('1M', 4, lam, seq_length=16, global_batch_size=1)


@pytest.mark.parametrize('lam', ['abc', '1/0', ''])
def test_lambda_garbage_is_refused(lam):
    with pytest.raises(ValueError, match='expected a fraction'):
        parse_lam(lam)


@pytest.mark.parametrize('text, n', [('2B', 2 * 10**9), ('1e9', 10**9), ('1.5M', 1_500_000), ('300k', 300_000),
                                     (12345, 12345), ('2T', 2 * 10**12)])
def test_parse_tokens(text, n):
    assert parse_tokens(text) == n


@pytest.mark.parametrize('text', ['0', '-5', 'abc', '1.5', '1e-3', True])
def test_parse_tokens_refuses(text):
    with pytest.raises(ValueError):
        parse_tokens(text)


@pytest.mark.parametrize('kwargs, message', [
    (dict(patch_size=1), 'needs K >= 2'),
    (dict(patch_size=0), 'positive integer'),
    (dict(seq_length=0), '--max_length must be a positive integer'),
    (dict(global_batch_size=-1), '--global_batch_size must be a positive integer'),
])
def test_bad_shapes_are_refused(kwargs, message):
    args = dict(tokens='1M', patch_size=4, lam='2/3', seq_length=16, global_batch_size=2)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        make_plan(args.pop('tokens'), args.pop('patch_size'), args.pop('lam'), **args)


# ---------------------------------------------------------------------------------------------- runner (dry)
def base_argv(model_dir, out, *extra, stage1_batch='sequences'):
    """N=3840, λ=0.8, T=64, G=4, K=4: stage 1 gets 3072 tokens, 3 steps of 4 x 256 tokens ('sequences') or 12 of
    1 x 256 ('tokens', the default); stage 2 gets 768 tokens, 3 steps of 4 x 64."""
    return ['--model', model_dir, '--output_dir', str(out), '--tokens', '3840', '--lam', '0.8', '--max_length', '64',
            '--global_batch_size', '4', '--dataset', 'd.jsonl', '--lr', '1e-3',
            *(['--stage1_batch', stage1_batch] if stage1_batch else []), *extra]


def steps_of(argv):
    opts = parse_options(argv)
    plan = make_plan(opts.tokens, opts.patch_size, opts.lam, seq_length=opts.max_length,
                     global_batch_size=opts.global_batch_size, stage1_batch=opts.stage1_batch)
    return {s.name: s for s in plan_steps(opts, plan)}


def flag(cmd, name):
    return cmd[cmd.index(name) + 1]


def test_dry_run_prints_plan_and_commands(model_dir, tmp_path, capsys):
    rc = main(base_argv(model_dir, tmp_path / 'out', '--stage1_args', '--lr 2e-3', '--dry_run'))
    out = capsys.readouterr().out
    assert rc == 0, out
    assert 'λ/K + 1 - λ = 0.4000' in out  # 0.8 / 4 + 0.2
    assert 'train_iters 3 (rounded down)' in out
    assert not os.path.exists(tmp_path / 'out')  # dry run: nothing written
    steps = steps_of(base_argv(model_dir, tmp_path / 'out', '--stage1_args', '--lr 2e-3'))
    s1, s2 = steps['stage1'].cmd, steps['stage2'].cmd
    assert s1[1:3] == ['pt', '--model'] and s2[1] == 'pt'
    assert (flag(s1, '--patch_size'), flag(s1, '--max_length'), flag(s1, '--train_iters')) == ('4', '256', '3')
    assert (flag(s2, '--patch_size'), flag(s2, '--max_length'), flag(s2, '--train_iters')) == ('1', '64', '3')
    assert flag(s1, '--model_type') == flag(s2, '--model_type') == 'llama3_2_plt'
    assert '--mcore_model' not in s1
    assert flag(s2, '--mcore_model') == str(tmp_path / 'out' / 'stage1_patch' / 'checkpoint-3')
    assert flag(s2, '--finetune') == 'true'  # weights only: fresh optimizer and LR schedule
    for cmd in (s1, s2):  # user flags reach both stages, after the recipe's
        assert flag(cmd, '--dataset') == 'd.jsonl'
    assert s1[-2:] == ['--lr', '2e-3'] and s2.count('--lr') == 1  # stage-only flags last (they win)
    assert steps['export'].cmd is None
    assert flag(s1, '--global_batch_size') == flag(s2, '--global_batch_size') == '4'


def test_default_stage1_batch_keeps_tokens_per_step(model_dir, tmp_path, capsys):
    """Without --stage1_batch: stage 1 runs G/K = 1 sequence of 256 tokens per step (256 tokens, as stage 2's
    4 x 64), so 12 steps instead of 3."""
    steps = steps_of(base_argv(model_dir, tmp_path / 'out', stage1_batch=None))
    s1, s2 = steps['stage1'].cmd, steps['stage2'].cmd
    assert (flag(s1, '--global_batch_size'), flag(s1, '--max_length'), flag(s1, '--train_iters')) == ('1', '256', '12')
    assert (flag(s2, '--global_batch_size'), flag(s2, '--max_length'), flag(s2, '--train_iters')) == ('4', '64', '3')
    assert flag(s2, '--mcore_model') == str(tmp_path / 'out' / 'stage1_patch' / 'checkpoint-12')


@pytest.mark.parametrize('extra, message', [
    (['--micro_batch_size', '2'], r'stage 1: its --global_batch_size 1 is not a multiple of --micro_batch_size 2 x '
     r'data-parallel size 1 \(stage 1 takes G/K = 1 sequence of 256 tokens.*--stage1_args "--micro_batch_size 1"'),
    (['--stage2_args', '--micro_batch_size 3'], 'stage 2: its --global_batch_size 4 is not a multiple of '
     '--micro_batch_size 3 x data-parallel size 1: give stage 2 --stage2_args "--micro_batch_size 2"'),
    (['--micro_batch_size=x'], "--micro_batch_size 'x' must be an integer"),
    (['--micro_batch_size=0'], 'stage 1: --micro_batch_size 0 must be at least 1'),
    (['--global_batch_size', '6'], '--global_batch_size 6 is not a multiple of --patch_size 4'),
])
def test_stage_batch_errors_before_anything_runs(model_dir, tmp_path, capsys, monkeypatch, extra, message):
    """With the user's process count (NPROC_PER_NODE): a micro batch the recipe would otherwise lower."""
    monkeypatch.setenv('NPROC_PER_NODE', '1')
    rc = main(base_argv(model_dir, tmp_path / 'out', *extra, stage1_batch=None))
    assert rc == 2
    assert re.search(message, capsys.readouterr().err)
    assert not os.path.exists(tmp_path / 'out')


def test_stage1_micro_batch_from_stage1_args_wins(model_dir, tmp_path):
    argv = base_argv(model_dir, tmp_path / 'out', '--micro_batch_size', '2', '--stage1_args', '--micro_batch_size 1',
                     stage1_batch=None)
    opts = parse_options(argv)
    plan = make_plan(opts.tokens, opts.patch_size, opts.lam, seq_length=64, global_batch_size=4)
    check_micro_batch(opts, plan)  # no error: stage 1 gets 1, stage 2 gets 2
    s1 = steps_of(argv)['stage1'].cmd
    assert s1[len(s1) - 1 - s1[::-1].index('--micro_batch_size') + 1] == '1'  # the last one (it wins)


@pytest.mark.parametrize('extra, message', [
    (['--train_iters', '5'], '--train_iters is set by the two-stage recipe'),
    (['--mcore_model=x'], '--mcore_model is set by the two-stage recipe'),
    (['--stage2_args', '--finetune false'], '--stage2_args: --finetune is set'),
    (['--export_args', '--patch_size 4'], 'the vanilla export writes a plain model'),
    (['--export_args', '--model_type qwen3'], '--model_type is set by the vanilla export itself'),
    (['--stage1_args', '--model_type qwen3'], '--stage1_args: --model_type must be the same for both stages'),
    (['--lam', '1'], 'outside (0, 1)'),
    (['--tokens', '1000'], 'too small for one training step'),
])
def test_errors_before_anything_runs(model_dir, tmp_path, capsys, extra, message):
    rc = main(base_argv(model_dir, tmp_path / 'out', *extra))
    err = capsys.readouterr().err
    assert rc == 2 and message in err, err
    assert not os.path.exists(tmp_path / 'out')


def test_missing_arguments_and_model(tmp_path, capsys):
    assert main(['--tokens', '1M']) == 2
    assert 'missing --model, --output_dir, --max_length, --global_batch_size' in capsys.readouterr().err
    assert main(base_argv(str(tmp_path / 'nope'), tmp_path / 'out')) == 2
    assert 'not a directory' in capsys.readouterr().err


def fake_checkpoint(run_dir, it, complete=True):
    d = run_dir / f'checkpoint-{it}'
    (d / f'iter_{it:07d}').mkdir(parents=True)
    if complete:
        (d / 'latest_checkpointed_iteration.txt').write_text(str(it))
    return str(d)


def test_resume_state_machine(model_dir, tmp_path):
    out = tmp_path / 'out'
    argv = base_argv(model_dir, out)
    s1, s2 = out / 'stage1_patch', out / 'stage2_token'
    # stage 1 interrupted after checkpoint-2 (checkpoint-3 half written: no tracker)
    ck2 = fake_checkpoint(s1, 2)
    fake_checkpoint(s1, 3, complete=False)
    steps = steps_of(argv)
    assert steps['stage1'].action == f'resume from {ck2}'
    assert (flag(steps['stage1'].cmd, '--mcore_model'), flag(steps['stage1'].cmd, '--finetune')) == (ck2, 'false')
    # stage 1 complete -> skipped; stage 2 starts from it, weights only
    (s1 / 'checkpoint-3' / 'latest_checkpointed_iteration.txt').write_text('3')
    steps = steps_of(argv)
    assert steps['stage1'].cmd is None and steps['stage1'].action.startswith('skip (complete')
    assert flag(steps['stage2'].cmd, '--mcore_model') == str(s1 / 'checkpoint-3')
    assert flag(steps['stage2'].cmd, '--finetune') == 'true'
    # stage 2 interrupted -> resumes stage 2 (full state), not from stage 1
    ck = fake_checkpoint(s2, 1)
    steps = steps_of(argv)
    assert (flag(steps['stage2'].cmd, '--mcore_model'), flag(steps['stage2'].cmd, '--finetune')) == (ck, 'false')
    # both complete -> only the export is left
    fake_checkpoint(s2, 3)
    steps = steps_of(argv)
    assert steps['stage1'].cmd is None and steps['stage2'].cmd is None
    assert steps['export'].action == f"{s2 / 'checkpoint-3'} -> {out / 'hf'}"
    # a finished export of this checkpoint (provenance written by the export) -> skipped; of another -> redone
    (out / 'hf').mkdir()
    (out / 'hf' / vanilla.PROVENANCE).write_text(json.dumps({'checkpoint': str(s2 / 'checkpoint-3')}))
    assert steps_of(argv)['export'].action == f"skip (done: {out / 'hf'})"
    (out / 'hf' / vanilla.PROVENANCE).write_text(json.dumps({'checkpoint': str(s1 / 'checkpoint-3')}))
    assert steps_of(argv)['export'].action.endswith(f"-> {out / 'hf'}")
    # a checkpoint past the plan's train_iters: another plan's run
    fake_checkpoint(s2, 7)
    with pytest.raises(RecipeError, match='past this plan'):
        steps_of(argv)


def test_stage2_without_stage1_checkpoint_is_refused(model_dir, tmp_path, capsys):
    out = tmp_path / 'out'
    assert main(base_argv(model_dir, out, '--stage', '2')) == 2
    err = capsys.readouterr().err
    assert 'stage 2 starts from the stage-1 checkpoint' in err and 'does not exist or is incomplete' in err
    fake_checkpoint(out / 'stage1_patch', 3, complete=False)  # interrupted save
    assert main(base_argv(model_dir, out, '--stage', '2')) == 2
    assert 'does not exist or is incomplete' in capsys.readouterr().err
    assert main(base_argv(model_dir, out, '--stage', '2', '--stage1_checkpoint', str(tmp_path))) == 2
    assert f'stage-1 checkpoint {tmp_path}' in capsys.readouterr().err
    ck = fake_checkpoint(tmp_path / 'elsewhere', 9)
    steps = steps_of(base_argv(model_dir, out, '--stage', '2', '--stage1_checkpoint', ck))
    assert flag(steps['stage2'].cmd, '--mcore_model') == ck and 'stage1' not in steps
    assert main(base_argv(model_dir, out, '--stage', 'export')) == 2
    assert 'nothing to export: stage 2 is not complete' in capsys.readouterr().err


def test_rerun_with_another_plan_is_refused(model_dir, tmp_path, capsys):
    out = tmp_path / 'out'
    opts = parse_options(base_argv(model_dir, out))
    plan = make_plan(opts.tokens, opts.patch_size, opts.lam, seq_length=64, global_batch_size=4)
    check_plan_file(str(out), plan, write=True)
    check_plan_file(str(out), plan, write=False)  # same plan: fine
    assert main(base_argv(model_dir, out, '--lam', '0.75', '--dry_run')) == 2
    assert 'holds a run with another plan' in capsys.readouterr().err


def test_yaml_config_example_and_cli_override(tmp_path, model_dir):
    example = os.path.join(REPO, 'examples', 'two_stage.yaml')
    opts = parse_options(['--config', example, '--model', model_dir, '--lam', '3/4', '--seed', '1'])
    assert opts.model == model_dir and opts.lam == '3/4'  # the command line wins
    assert opts.patch_size == 4 and opts.tokens and opts.max_length and opts.global_batch_size
    assert '--dataset' in opts.args and opts.args[-2:] == ['--seed', '1']  # YAML args, then the command line's
    cfg = tmp_path / 'c.yaml'
    cfg.write_text('model: m\nbogus: 1\n')
    with pytest.raises(RecipeError, match="unknown key 'bogus'"):
        parse_options(['--config', str(cfg)])
    cfg.write_text('stage: 3\n')
    with pytest.raises(RecipeError, match="--stage '3': use all, 1, 2 or export"):
        parse_options(['--config', str(cfg), '--model', 'm', '--output_dir', 'o', '--tokens', '1M',
                      '--max_length', '8', '--global_batch_size', '1'])
    cfg.write_text('args: {dataset: d.jsonl, bf16: true, lr: 0.001}\nstage1_args: [--lr, "2e-3"]\n')
    opts = parse_options(['--config', str(cfg), '--model', 'm', '--output_dir', 'o', '--tokens', '1M',
                         '--max_length', '8', '--global_batch_size', '1'])
    assert opts.args == ['--dataset', 'd.jsonl', '--bf16', 'true', '--lr', '0.001']
    assert opts.stage1_args == ['--lr', '2e-3']


# ---------------------------------------------------------------------------------------------- families
@pytest.mark.parametrize('model_type, want', [('llama', 'llama3_2_plt'), ('qwen3', 'qwen3'),
                                              ('qwen3_moe', 'qwen3_moe'), ('kimi_k2', 'deepseek_v3')])
def test_stage_commands_use_the_family_model_type(family_model_dir, tmp_path, model_type, want):
    """Llama keeps the design type and its register file; other families pass their own type, no register file."""
    steps = steps_of(base_argv(family_model_dir(model_type), tmp_path / 'out'))
    for cmd in (steps['stage1'].cmd, steps['stage2'].cmd):
        assert flag(cmd, '--model_type') == want and cmd.count('--model_type') == 1
        assert ('--custom_register_path' in cmd) == (want == 'llama3_2_plt')
        if want == 'llama3_2_plt':
            assert flag(cmd, '--custom_register_path') == REGISTER_FILE
    assert (flag(steps['stage1'].cmd, '--patch_size'), flag(steps['stage2'].cmd, '--patch_size')) == ('4', '1')


def test_every_family_has_the_ms_swift_model_type_the_steps_pass():
    from swift.model import MODEL_MAPPING

    from swift_plt.families import FAMILIES
    from swift_plt.plugin.register import register_swift
    from swift_plt.recipe.family import swift_model_type
    register_swift()  # llama3_2_plt: what the register file does in the stages
    assert [t for t in FAMILIES if swift_model_type(t) not in MODEL_MAPPING] == []


def test_user_model_type_overrides_for_every_step(family_model_dir, tmp_path, capsys):
    """--model_type with the flags of both stages replaces the one from config.json (both stages, the export)."""
    argv = base_argv(family_model_dir('llama'), tmp_path / 'out', '--model_type', 'llama3_2')
    steps = steps_of(argv)
    for cmd in (steps['stage1'].cmd, steps['stage2'].cmd):
        assert flag(cmd, '--model_type') == 'llama3_2' and '--custom_register_path' not in cmd
    assert main(argv + ['--dry_run']) == 0, capsys.readouterr().err
    assert run_model_type(family_model_dir('llama'), parse_options(argv).args) == 'llama3_2'


@pytest.mark.parametrize('model_type, message', [
    ('deepseek_v32', '`deepseek_v32` is not supported: DeepSeek sparse attention'),
    ('mistral', 'model type `mistral` (config.json) has no patch-level training; supported: '),
    ('qwen2_vl', 'model type `qwen2_vl` (config.json) has no patch-level training'),
])
def test_unsupported_family_is_refused_before_anything_runs(family_model_dir, tmp_path, capsys, model_type,
                                                           message):
    out = tmp_path / 'out'
    assert main(base_argv(family_model_dir(model_type), out)) == 2
    err = capsys.readouterr().err
    assert message in err and 'The two-stage recipe trains stage 1 at patch size K > 1.' in err, err
    assert 'Use --patch_size 1' not in err and not os.path.exists(out)


def test_family_without_transformers_class_is_refused_when_exporting(family_model_dir, tmp_path, capsys):
    """internlm3 trains at patch level, but transformers has no class for it: the export could not write a plain
    model, so a run that exports is refused before anything runs; its stages alone are not."""
    model = family_model_dir('internlm3')
    assert main(base_argv(model, tmp_path / 'out', '--dry_run')) == 2
    err = capsys.readouterr().err
    assert "model_type 'internlm3' has no causal LM class in transformers" in err, err
    assert main(base_argv(model, tmp_path / 'out', '--stage', '1', '--dry_run')) == 0


def test_model_without_config_is_refused(tmp_path, capsys):
    (tmp_path / 'm').mkdir()
    assert main(base_argv(str(tmp_path / 'm'), tmp_path / 'out')) == 2
    err = capsys.readouterr().err
    assert f"--model {tmp_path / 'm'}: cannot read {tmp_path / 'm' / 'config.json'}" in err, err


# ---------------------------------------------------------------------------------------------- vanilla export
@pytest.mark.parametrize('model_type, cls', [('llama', 'LlamaForCausalLM'), ('qwen3', 'Qwen3ForCausalLM'),
                                             ('qwen3_moe', 'Qwen3MoeForCausalLM')])
def test_vanilla_config(model_type, cls):
    """The family's own model_type and transformers class; PLT and remote-code keys dropped."""
    src = {'model_type': model_type, 'architectures': ['PLTForCausalLM'], 'patch_size': 4,
           'auto_map': {'AutoModelForCausalLM': 'modeling_plt.PLTForCausalLM'}, 'hidden_size': 64}
    out = vanilla.vanilla_config(src)
    assert out == {'model_type': model_type, 'architectures': [cls], 'hidden_size': 64}
    assert src['patch_size'] == 4  # input untouched


def test_vanilla_config_class_from_the_config_or_refused():
    """Without a mapping entry: the config's own architectures when transformers has that class for this
    model_type; remote-code classes (or another type's class) are refused."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as mapping
    assert 'internlm3' not in mapping and 'kimi_k2' not in mapping
    for config in ({'model_type': 'internlm3', 'architectures': ['InternLM3ForCausalLM']},
                   {'model_type': 'kimi_k2', 'architectures': ['DeepseekV3ForCausalLM']}):
        with pytest.raises(ValueError, match=f"model_type '{config['model_type']}' has no causal LM class"):
            vanilla.vanilla_config(config)
    with mock.patch.dict(mapping, clear=False) as m:
        del m['qwen3']
        assert causal_lm_class({'model_type': 'qwen3', 'architectures': ['Qwen3ForCausalLM']}) == 'Qwen3ForCausalLM'


@pytest.mark.parametrize('patch_size, extra', [(4, []), (None, ['--patch_size', '2']), (None, ['--patch_size=8'])])
def test_vanilla_export_refuses_patch_size_above_1(tmp_path, patch_size, extra):
    with pytest.raises(ValueError, match='the vanilla export writes a plain model'):
        vanilla.export_vanilla(str(tmp_path), str(tmp_path / 'o'), extra=extra, patch_size=patch_size)
    assert vanilla.main(['--checkpoint', str(tmp_path), '--patch_size', '4']) == 2


def test_vanilla_export_command_and_checkpoint_resolution(tmp_path):
    run = tmp_path / 'run'
    fake_checkpoint(run, 2)
    ck5 = fake_checkpoint(run, 5)
    fake_checkpoint(run, 7, complete=False)
    (run / 'args.json').write_text(json.dumps({'model': str(tmp_path)}))
    (tmp_path / 'config.json').write_text('{"model_type": "llama"}')
    assert vanilla.resolve_checkpoint(str(run)) == ck5 and vanilla.resolve_checkpoint(ck5) == ck5
    cmd = vanilla.export_vanilla(str(run), str(tmp_path / 'hf'), extra=['--torch_dtype', 'bfloat16'], dry_run=True)
    assert cmd[1:3] == ['export', '--mcore_model'] and flag(cmd, '--mcore_model') == ck5
    assert flag(cmd, '--model') == str(tmp_path)  # from args.json
    # the model type: from config.json (Llama: the design type and its register file) ...
    assert flag(cmd, '--model_type') == 'llama3_2_plt'
    assert flag(cmd, '--custom_register_path') == REGISTER_FILE
    assert flag(cmd, '--patch_size') == '1' and flag(cmd, '--to_hf') == 'true'
    assert flag(cmd, '--output_dir') == str(tmp_path / 'hf') + '.tmp' and cmd[-2:] == ['--torch_dtype', 'bfloat16']
    with pytest.raises(FileNotFoundError, match='no complete Megatron checkpoint'):
        vanilla.resolve_checkpoint(str(tmp_path / 'run' / 'checkpoint-7'))
    # ... the run's own (args.json) when it says, and the caller's above both
    (run / 'args.json').write_text(json.dumps({'model': str(tmp_path), 'model_type': 'qwen3', 'template': 'qwen3'}))
    cmd = vanilla.export_vanilla(str(run), str(tmp_path / 'hf'), dry_run=True)
    assert flag(cmd, '--model_type') == 'qwen3' and '--custom_register_path' not in cmd
    assert flag(cmd, '--template') == 'qwen3'  # the run's template too
    cmd = vanilla.export_vanilla(str(run), str(tmp_path / 'hf'), extra=['--template', 'default'], dry_run=True)
    assert cmd.count('--template') == 1 and flag(cmd, '--template') == 'default'
    cmd = vanilla.export_vanilla(str(run), str(tmp_path / 'hf'), dry_run=True, model_type='qwen3_moe')
    assert flag(cmd, '--model_type') == 'qwen3_moe' and flag(cmd, '--patch_size') == '1'


def test_check_vanilla_reports_what_is_not_vanilla(tmp_path):
    (tmp_path / 'config.json').write_text(json.dumps({'model_type': 'llama_plt', 'patch_size': 4,
                                                      'architectures': ['LlamaForCausalLM']}))
    (tmp_path / 'modeling_plt.py').write_text('')
    with pytest.raises(AssertionError) as e:
        vanilla.check_vanilla(str(tmp_path))
    assert "config.json has 'patch_size'" in str(e.value) and "model_type is 'llama_plt'" in str(e.value)
    assert 'custom code file modeling_plt.py' in str(e.value)
    (tmp_path / 'config.json').write_text(json.dumps({'model_type': 'qwen3', 'architectures': ['LlamaForCausalLM']}))
    with pytest.raises(AssertionError, match=r"architectures is \['LlamaForCausalLM'\], not \['Qwen3ForCausalLM'\]"):
        vanilla.check_vanilla(str(tmp_path))


@pytest.mark.parametrize('family, cls', [
    ('qwen3', 'transformers.models.qwen3.modeling_qwen3.Qwen3ForCausalLM'),
    ('qwen3_moe', 'transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeForCausalLM'),
    ('qwen3_5_moe', 'transformers.models.qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeForConditionalGeneration')])
def test_make_vanilla_then_check_vanilla_loads_the_family_class(tmp_path, family, cls):
    """A bridge-written dir (PLT keys, a remote-code file, args.json) -> vanilla; plain transformers loads it as the
    family's own class, named in the report (Qwen3.5: the multimodal class, vision tower included)."""
    from swift_plt.tools.tiny_families import make_tiny_family, unavailable
    if unavailable(family):  # Qwen3.5 on transformers 4.57
        pytest.skip(unavailable(family))
    hf = make_tiny_family(family, str(tmp_path / 'hf'))
    config = json.loads((tmp_path / 'hf' / 'config.json').read_text())
    config.update(patch_size=4, auto_map={'AutoModelForCausalLM': 'modeling_plt.PLT'}, architectures=['PLT'])
    (tmp_path / 'hf' / 'config.json').write_text(json.dumps(config))
    (tmp_path / 'hf' / 'modeling_plt.py').write_text('')
    (tmp_path / 'hf' / 'args.json').write_text(json.dumps({'model_type': family}))
    with pytest.raises(AssertionError, match='is not a vanilla checkpoint'):
        vanilla.check_vanilla(hf)
    vanilla.make_vanilla(hf, {'checkpoint': 'ck'})
    report = vanilla.check_vanilla(hf)
    assert report['class'] == cls and report['model_type'] == family and report['num_parameters'] > 0
    assert json.loads((tmp_path / 'hf' / vanilla.PROVENANCE).read_text())['ms_swift_args'] == {'model_type': family}
