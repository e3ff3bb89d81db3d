"""The two-stage runner's end-of-run report (summary.txt/json, loss_curves.png) on synthetic stage logs: steps,
tokens, training-loop seconds from ms-swift's train_speed, tokens/s and patches/s, resumed stages, no logs."""
import json
import os
from fractions import Fraction

import pytest

from swift_plt.recipe.phases import MilestoneClock, phase_seconds
from swift_plt.recipe.plan import make_plan
from swift_plt.recipe.stage_report import (export_seconds, format_report, record_wall_time, stage_report,
                                          steady_step_seconds, train_loop_seconds, write_report)


def _write_logs(path, entries):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, 'logging.jsonl'), 'w') as f:
        for e in entries:
            f.write(json.dumps(e) + '\n')
        f.write(json.dumps({'train_runtime': 1.0}) + '\n')  # a non-step line is ignored


def _entries(iters, total, speed, loss0=5.0, step=1):
    return [{'loss': loss0 - 0.01 * i, 'iteration': f'{i}/{total}', 'train_speed(s/it)': speed}
            for i in range(step, iters + 1, step)]


def _lines(entries):
    return [dict(e, _line=i) for i, e in enumerate(entries)]


def test_train_loop_seconds_single_and_resumed():
    assert train_loop_seconds(_lines(_entries(10, 10, 0.5))) == (pytest.approx(5.0), 10)
    assert train_loop_seconds(_lines(_entries(10, 10, 0.5, step=5))) == (pytest.approx(5.0), 10)  # logging_steps 5
    # logged every 2 steps at 0.5 s/it up to step 6, crashed at step 7; resumed from checkpoint-6 (its log starts at
    # line 3): steps 7..10 at 0.25 s/it
    first = _entries(6, 10, 0.5, step=2)
    resumed = [{'loss': 1.0, 'iteration': f'{i}/10', 'train_speed(s/it)': 0.25} for i in (8, 10)]
    inv = [{'log_line': 0, 'start_iteration': 0}, {'log_line': 3, 'start_iteration': 6}]
    assert train_loop_seconds(_lines(first + resumed), inv) == (pytest.approx(6 * 0.5 + 4 * 0.25), 10)
    assert train_loop_seconds(_lines([{'loss': 1.0, 'iteration': '1/2'}])) is None
    assert steady_step_seconds(_lines(_entries(10, 10, 0.5, step=5))) == pytest.approx(0.5)
    assert steady_step_seconds(_lines(first + resumed), inv) == pytest.approx(0.5)  # the first invocation's steps
    assert steady_step_seconds(_lines(_entries(1, 10, 0.5))) is None


def test_stage_report_tokens_and_rates(tmp_path):
    # N=3840, K=4, λ=0.8, T=64, G=4: stage 1 3 steps of 4x256 tokens, stage 2 3 steps of 4x64
    plan = make_plan(3840, 4, '4/5', seq_length=64, global_batch_size=4, stage1_batch='sequences')
    out = str(tmp_path)
    _write_logs(os.path.join(out, 'stage1_patch'), _entries(3, 3, 0.5))
    _write_logs(os.path.join(out, 'stage2_token'), _entries(3, 3, 0.25))
    record_wall_time(os.path.join(out, 'logs'), 'stage1', 10.0, 1)  # failed before its first step
    record_wall_time(os.path.join(out, 'logs'), 'stage1', 2.5, 0)  # a second invocation adds up
    r1, r2 = stage_report(out, plan)
    assert (r1['steps'], r1['tokens'], r1['seq_length']) == (3, 3 * 4 * 256, 256)
    assert (r2['steps'], r2['tokens'], r2['seq_length']) == (3, 3 * 4 * 64, 64)
    assert r1['train_seconds'] == pytest.approx(1.5) and r2['train_seconds'] == pytest.approx(0.75)
    assert r1['tokens_per_s'] == pytest.approx(3072 / 1.5) and r1['patches_per_s'] == pytest.approx(3072 / 1.5 / 4)
    assert r2['tokens_per_s'] == pytest.approx(768 / 0.75) and r2['patches_per_s'] is None  # K=1: no patches/s
    assert r1['wall_seconds'] == pytest.approx(12.5) and r2['wall_seconds'] is None
    assert (r1['first_loss'], r1['last_loss']) == (4.99, 4.97)


def test_stage_report_counts_stage1_tokens_with_its_own_batch(tmp_path):
    # the default stage1_batch='tokens': stage 1 runs G/K = 1 sequence of 256 tokens per step (12 steps)
    plan = make_plan(3840, 4, '4/5', seq_length=64, global_batch_size=4)
    out = str(tmp_path)
    _write_logs(os.path.join(out, 'stage1_patch'), _entries(12, 12, 0.5))
    r1, _ = stage_report(out, plan)
    assert (r1['steps'], r1['global_batch_size'], r1['tokens']) == (12, 1, 12 * 1 * 256)
    assert r1['tokens_per_s'] == pytest.approx(256 / 0.5)


def test_unlogged_last_step_of_a_complete_stage(tmp_path):
    # 7 steps logged every 2 (the last logged is 6) at 0.5 s/it; the final checkpoint says the stage is complete
    plan = make_plan(7 * 1024 + 3 * 256, 4, Fraction(7 * 1024, 7 * 1024 + 3 * 256), seq_length=64,
                     global_batch_size=4, stage1_batch='sequences')
    assert plan.stage1.train_iters == 7
    out = str(tmp_path)
    _write_logs(os.path.join(out, 'stage1_patch'), _entries(7, 7, 0.5, step=2))
    (r1, _) = stage_report(out, plan)
    assert r1['steps'] == 6  # no final checkpoint: what the log shows
    ck = os.path.join(out, 'stage1_patch', 'checkpoint-7')
    os.makedirs(ck)
    open(os.path.join(ck, 'latest_checkpointed_iteration.txt'), 'w').write('7')
    (r1, _) = stage_report(out, plan)
    assert (r1['steps'], r1['tokens']) == (7, 7 * 1024)
    assert r1['tokens_per_s'] == pytest.approx(1024 / 0.5) and r1['train_seconds'] == pytest.approx(3.5)


def test_write_report_files(tmp_path, capsys):
    plan = make_plan(3840, 4, '4/5', seq_length=64, global_batch_size=4, stage1_batch='sequences')
    out = str(tmp_path)
    _write_logs(os.path.join(out, 'stage1_patch'), _entries(3, 3, 0.5))
    write_report(out, plan)  # stage 2 not run yet (e.g. --stage 1)
    text = open(os.path.join(out, 'summary.txt')).read()
    assert '3/3 steps, 3,072 tokens, time 1.5 s' in text and '2,048 tokens/s, 512 patches/s' in text
    assert 'stage 2 (token level, K=1, max_length=64): no training log' in text
    assert json.load(open(os.path.join(out, 'summary.json')))[0]['tokens'] == 3072
    assert open(os.path.join(out, 'loss_curves.png'), 'rb').read(8) == b'\x89PNG\r\n\x1a\n'
    assert 'patches/s' in capsys.readouterr().out


def test_report_names_each_stage_micro_batch(tmp_path):
    """The settings of a stage's last invocation (its micro batch, recompute and why) reach the summary."""
    plan = make_plan(3840, 4, '4/5', seq_length=64, global_batch_size=4, stage1_batch='sequences')
    out = str(tmp_path)
    _write_logs(os.path.join(out, 'stage1_patch'), _entries(3, 3, 0.5))
    logs = os.path.join(out, 'logs')
    record_wall_time(logs, 'stage1', 1.0, 1, settings={'micro_batch_size': 1, 'recompute_granularity': 'full'})
    record_wall_time(logs, 'stage1', 1.0, 0, settings={'micro_batch_size': 4, 'recompute_granularity': None,
                                                       'why': 'stage 1: --micro_batch_size 4 (the largest that fits)'})
    r1, r2 = stage_report(out, plan)
    assert (r1['micro_batch_size'], r1['recompute_granularity']) == (4, None) and r2['micro_batch_size'] is None
    assert r1['micro_batch_why'].endswith('(the largest that fits)')
    text = format_report([r1, r2], plan)
    assert 'stage 1 (patch level, K=4, max_length=256, micro_batch_size=4): 3/3 steps' in text


def test_each_stage_and_the_recipe_against_token_level(tmp_path):
    """Overhead = wall - training loop per stage; the token-level estimate of a stage = its tokens at stage 2's rate;
    the recipe's training and wall clock against token-level training of all its tokens with one start-up."""
    plan = make_plan(3840, 4, '4/5', seq_length=64, global_batch_size=4, stage1_batch='sequences')
    out = str(tmp_path)
    _write_logs(os.path.join(out, 'stage1_patch'), _entries(3, 3, 0.5))  # 3,072 tokens in 1.5 s
    _write_logs(os.path.join(out, 'stage2_token'), _entries(3, 3, 0.25))  # 768 tokens in 0.75 s: 1,024 tokens/s
    record_wall_time(os.path.join(out, 'logs'), 'stage1', 11.5, 0)
    assert format_report(stage_report(out, plan), plan).count('against token-level') == 0  # stage 2's wall missing
    record_wall_time(os.path.join(out, 'logs'), 'stage2', 10.75, 0)
    r1, r2 = stage_report(out, plan)
    assert (r1['overhead_seconds'], r2['overhead_seconds']) == (pytest.approx(10.0), pytest.approx(10.0))
    assert (r1['token_level_seconds'], r2['token_level_seconds']) == (pytest.approx(3.0), pytest.approx(0.75))
    text = format_report([r1, r2], plan)
    assert 'time 1.5 s (wall 11.5 s: 10.0 s start-up, data and saving); token-level est. 3.0 s' in text
    # training 2.25 s vs 3.75 s; wall 22.25 s vs 3.75 + 10.0 s
    assert ('(est. 3.8 s of training, 13.8 s wall with one start-up): training 0.60x, wall 1.62x' in text)
    write_report(out, plan)
    assert json.load(open(os.path.join(out, 'summary.json')))[1]['overhead_seconds'] == pytest.approx(10.0)


def test_token_level_estimate_pays_stage_2s_first_step_once(tmp_path):
    """Stage 2's first step compiles (8-30 s at K=1 on an H100): a token-level run pays it once, so stage 1's tokens
    are estimated at stage 2's rate after that step, not at its mean rate."""
    plan = make_plan(3840, 4, '4/5', seq_length=64, global_batch_size=4, stage1_batch='sequences')
    out = str(tmp_path)
    _write_logs(os.path.join(out, 'stage1_patch'), _entries(3, 3, 0.5))  # 3,072 tokens in 1.5 s
    # stage 2: ms-swift's train_speed is the mean since the start: 2.0 s for step 1, then 0.25 s a step
    _write_logs(os.path.join(out, 'stage2_token'), [{'loss': 5.0, 'iteration': f'{i}/3', 'train_speed(s/it)':
                                                     (2.0 + 0.25 * (i - 1)) / i} for i in (1, 2, 3)])
    record_wall_time(os.path.join(out, 'logs'), 'stage1', 11.5, 0)
    record_wall_time(os.path.join(out, 'logs'), 'stage2', 12.5, 0)
    r1, r2 = stage_report(out, plan)
    assert r2['train_seconds'] == pytest.approx(2.5) and r2['steady_tokens_per_s'] == pytest.approx(256 / 0.25)
    # stage 1: 3,072 tokens at 1,024 tokens/s (its mean rate, 307 tokens/s, would say 10 s); stage 2: itself
    assert (r1['token_level_seconds'], r2['token_level_seconds']) == (pytest.approx(3.0), pytest.approx(2.5))
    assert 'training 0.73x' in format_report([r1, r2], plan)  # (1.5 + 2.5) / (3.0 + 2.5)


# ms-swift 4.6's milestone lines as a `megatron pt` run prints them (abridged after the matched part)
MS_SWIFT_LOG = [
    (0.5, '[INFO:swift] megatron.core.__version__: 0.16.1'),
    (20.0, "[INFO:swift] args: MegatronPretrainArguments(use_ray=False, model='/m', ...)"),
    (21.0, '[INFO:swift] max_length: 8192'),
    (50.0, '[INFO:swift] Dataset Token Length: 7837.868020±366.960963, min=1880.000000, max=8192.000000, size=788'),
    (62.0, '[INFO:swift] [rank0] model_parameter_info: PLTGPTModel: 1235.8144M Params (1235.8144M Trainable)'),
    (70.0, '[INFO:swift] The training of Epoch 0 starts...'),
    (75.0, "{'loss': 12.22349548, 'grad_norm': 8.37569618, 'iteration': '1/24', 'elapsed_time': '5s'}"),
    (76.0, "{'loss': 12.0, 'iteration': '2/24'}"),
    (90.0, "{'loss': 7.9, 'iteration': '24/24'}"),
    (91.0, '[INFO:swift] Saving checkpoint ...'),
]


def _clocked(lines, end):
    now = [0.0]
    clock = MilestoneClock(lambda: now[0])
    for t, text in lines:
        now[0] = t
        clock.line(text)
    now[0] = end
    clock.stop()
    return clock.marks()


def test_milestones_split_the_wall_clock_into_phases():
    """Each phase runs from one ms-swift milestone to the next (the step: first and last); they add up to the wall;
    a milestone the log lacks joins its phase to the next."""
    marks = _clocked(MS_SWIFT_LOG, 100.0)
    assert marks == {'args': 20.0, 'data': 50.0, 'model': 62.0, 'train': 70.0, 'first_step': 75.0, 'last_step': 90.0,
                     'end': 100.0}
    assert phase_seconds(marks) == [('start-up', 20.0), ('data', 30.0), ('model', 12.0), ('load', 8.0),
                                    ('first logged step', 5.0), ('steps', 15.0), ('save and exit', 10.0)]
    no_data = _clocked([x for x in MS_SWIFT_LOG if 'Dataset Token Length' not in x[1]], 100.0)
    assert phase_seconds(no_data)[1:3] == [('data + model', 42.0), ('load', 8.0)]
    failed = _clocked(MS_SWIFT_LOG[:3], 30.0)  # died before its data
    assert phase_seconds(failed) == [('start-up', 20.0), ('data + model + load + first logged step + steps + save and exit',
                                                          10.0)]


def test_summary_gives_each_stage_phases_and_counts_the_export(tmp_path):
    """The summary names each stage's phases (summed over its invocations) and, once the export ran, counts its wall
    clock in the recipe's."""
    plan = make_plan(3840, 4, '4/5', seq_length=64, global_batch_size=4, stage1_batch='sequences')
    out = str(tmp_path)
    _write_logs(os.path.join(out, 'stage1_patch'), _entries(3, 3, 0.5))
    _write_logs(os.path.join(out, 'stage2_token'), _entries(3, 3, 0.25))
    logs = os.path.join(out, 'logs')
    marks = _clocked(MS_SWIFT_LOG, 100.0)
    record_wall_time(logs, 'stage1', 60.0, 1, settings={'milestones': {'args': 20.0, 'end': 60.0}})  # interrupted
    record_wall_time(logs, 'stage1', 100.0, 0, settings={'milestones': marks})
    record_wall_time(logs, 'stage2', 100.0, 0, settings={'milestones': marks})
    r1, r2 = stage_report(out, plan)
    assert r1['phases']['start-up'] == pytest.approx(40.0) and r2['phases']['start-up'] == pytest.approx(20.0)
    assert sum(r1['phases'].values()) == pytest.approx(160.0)
    text = format_report([r1, r2], plan, export_seconds(out))
    assert ('    wall clock: start-up 20.0 s, data 30.0 s, model 12.0 s, load 8.0 s, first logged step 5.0 s, steps 15.0 s, '
            'save and exit 10.0 s') in text
    assert 'the export not counted' in text
    record_wall_time(logs, 'export', 40.0, 0)
    assert export_seconds(out) == 40.0
    # recipe wall 160 + 100 + 40 against 3.75 s of training + stage 2's 99.25 s overhead
    assert "wall 2.91x (the export's 40.0 s included)" in format_report([r1, r2], plan, export_seconds(out))
