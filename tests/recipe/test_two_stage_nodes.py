"""The recipe on several nodes (NNODES=2, one recipe per node on a shared --output_dir), in process with the stage
commands faked: which node does what, the waits of node 1 (done, node 0 failed, timed out), the rerun on both."""
import json
import os
import threading

import pytest

from swift_plt.recipe import cli, nodes
from swift_plt.recipe.export import PROVENANCE
from swift_plt.recipe.nodes import LeaderStatus, NodeWaitError, Nodes, node0_export_launch, read_nodes, wait_for
from swift_plt.recipe.options import RecipeError
from swift_plt.recipe.process import flag_value
from swift_plt.recipe.stages import stage_launch
from test_two_stage_launch import Finished, opts_plan, recipe_argv

TWO = {'NNODES': '2', 'NPROC_PER_NODE': '1', 'MASTER_ADDR': '127.0.0.1', 'MASTER_PORT': '29555'}


# ---------------------------------------------------------------------------------------------- which node
@pytest.mark.parametrize('environ', [{}, {'NNODES': '1'}, {'NNODES': '1', 'NODE_RANK': '0'}, {'NNODES': '1:1'},
                                     {'NPROC_PER_NODE': '8'}])
def test_one_node_is_the_leader_of_one(environ):
    assert read_nodes(environ) == Nodes() and not Nodes().multi and Nodes().leader
    assert Nodes().log_name('stage1') == 'stage1.log'


def test_two_nodes_from_the_environment():
    n = read_nodes(dict(TWO, NODE_RANK='1', SWIFT_PLT_NODE_WAIT='60'))
    assert (n.count, n.rank, n.wait_s, n.multi, n.leader) == (2, 1, 60.0, True, False)
    assert n.log_name('stage1') == 'stage1.node1.log'
    n0 = read_nodes(dict(TWO, NODE_RANK='0'))
    assert n0.leader and n0.log_name('export') == 'export.log' and n0.wait_s == nodes.DEFAULT_WAIT_S


@pytest.mark.parametrize('environ, message', [
    ({'NNODES': '2', 'MASTER_ADDR': 'n0'}, 'NNODES=2: set NODE_RANK on every node'),
    ({'NNODES': '2', 'NODE_RANK': '1'}, 'set MASTER_ADDR on every node'),
    ({'NNODES': '2', 'NODE_RANK': '2', 'MASTER_ADDR': 'n0'}, 'NODE_RANK=2 is not in 0..1'),
    ({'NNODES': '1:2'}, 'elastic node counts are not supported'),
    ({'NNODES': 'two'}, "NNODES='two': expected the number of nodes"),
    (dict(TWO, NODE_RANK='1', SWIFT_PLT_NODE_WAIT='0'), 'SWIFT_PLT_NODE_WAIT=0: expected seconds > 0'),
])
def test_incomplete_multi_node_settings_are_refused(environ, message):
    with pytest.raises(RecipeError, match=message):
        read_nodes(environ)


def test_stages_run_on_every_node_and_the_export_on_node_0_alone(model_dir, tmp_path):
    opts, plan = opts_plan(recipe_argv(model_dir, tmp_path / 'o'))
    launch = stage_launch(opts, plan, dict(TWO, NODE_RANK='1'), None)
    assert launch.env == {} and launch.world_size == 2  # torchrun gets the user's NNODES / NODE_RANK / MASTER_*
    with pytest.raises(RecipeError, match='data-parallel size 4'):  # 2 nodes x 2: stage 1's 2 sequences per step
        stage_launch(opts, plan, dict(TWO, NODE_RANK='0', NPROC_PER_NODE='2'), None)
    assert node0_export_launch([], dict(TWO, NODE_RANK='1')).env == {'NNODES': '1', 'NODE_RANK': '0',
                                                                    'NPROC_PER_NODE': '1'}
    assert node0_export_launch(['--tensor_model_parallel_size', '2'], {'NNODES': '2'}).env['NPROC_PER_NODE'] == '2'


# ---------------------------------------------------------------------------------------------- the waits
class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def test_wait_returns_when_ready(tmp_path):
    calls = iter([False, False, True])
    clock = Clock()
    wait_for('x', lambda: next(calls), Nodes(2, 1, 10), LeaderStatus(str(tmp_path)), None, 1.0, clock, clock.sleep)
    assert clock.t == 2.0


def test_wait_times_out_with_what_to_check(tmp_path):
    clock = Clock()
    with pytest.raises(NodeWaitError, match=r'node 1 waited 5 s for the thing, which node 0 writes; is node 0 '
                       r'running the same command .* SWIFT_PLT_NODE_WAIT sets the wait'):
        wait_for('the thing', lambda: False, Nodes(2, 1, 5), LeaderStatus(str(tmp_path)), None, 1.0, clock,
                 clock.sleep)
    assert clock.t == 5.0


def test_wait_stops_at_a_new_failure_of_node_0_not_an_old_one(tmp_path):
    old = LeaderStatus(str(tmp_path))
    old.write('export', 'failed', rc=1, log='logs/export.log')  # an earlier run's
    since = LeaderStatus(str(tmp_path)).read()
    clock = Clock()
    with pytest.raises(NodeWaitError, match='waited 3 s'):  # the old failure is not this run's
        wait_for('x', lambda: False, Nodes(2, 1, 3), LeaderStatus(str(tmp_path)), since, 1.0, clock, clock.sleep)
    now = LeaderStatus(str(tmp_path))
    assert now.step('stage2', 'logs/stage2.log', lambda: 0) == 0
    assert now.read()['state'] == 'done'
    with pytest.raises(KeyError):
        now.step('export', 'logs/export.log', lambda: {}['boom'])
    with pytest.raises(NodeWaitError, match=r"node 0 failed at export \(KeyError: 'boom'; log: logs/export.log\) "
                       'while node 1 waited for x'):
        wait_for('x', lambda: False, Nodes(2, 1, 3), now, since, 1.0, clock, clock.sleep)
    assert now.step('stage1', 'l', lambda: 3) == 3 and now.read()['rc'] == 3


# ---------------------------------------------------------------------------------------------- the CLI per node
class FakeStage:
    """Stands in for the stages' torchrun: records (command, environment, log name) and writes the final checkpoint
    (as global rank 0 would) unless ``tracker`` is False; ``after`` runs after each call."""

    def __init__(self, tracker=True, after=None):
        self.calls, self.tracker, self.after = [], tracker, after

    def __call__(self, cmd, log_path, extra_env=None, on_line=None, quiet=False):
        self.calls.append((cmd, extra_env, os.path.basename(log_path)))
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        with open(log_path, 'a') as f:
            f.write('$ megatron pt\n')
        it = int(flag_value(cmd, 'train_iters'))
        ckpt = os.path.join(flag_value(cmd, 'output_dir'), f'checkpoint-{it}')
        os.makedirs(os.path.join(ckpt, f'iter_{it:07d}'), exist_ok=True)
        if self.tracker:
            write_tracker(ckpt, it)
        if self.after:
            self.after(cmd)
        return Finished(0)


def write_tracker(ckpt, it):
    with open(os.path.join(ckpt, 'latest_checkpointed_iteration.txt'), 'w') as f:
        f.write(str(it))


def fake_export(hf_log):
    def export_vanilla(checkpoint, output_dir, model, extra, log_path, extra_env, model_type):
        hf_log.append((checkpoint, extra_env, os.path.basename(log_path)))
        os.makedirs(output_dir, exist_ok=True)
        with open(os.path.join(output_dir, PROVENANCE), 'w') as f:
            json.dump({'checkpoint': checkpoint}, f)
    return export_vanilla


@pytest.fixture
def node(monkeypatch):
    """node(rank): the environment of that node of two."""
    monkeypatch.setattr(nodes, 'POLL_S', 0.02)

    def set_node(rank, **extra):
        for k, v in dict(TWO, NODE_RANK=str(rank), **extra).items():
            monkeypatch.setenv(k, v)
    return set_node


def test_node0_writes_the_run_files_and_exports_alone(model_dir, tmp_path, monkeypatch, node, capsys):
    node(0)
    out = tmp_path / 'out'
    stage, exports = FakeStage(), []
    monkeypatch.setattr(cli, 'LoggedRun', stage)
    monkeypatch.setattr(cli, 'export_vanilla', fake_export(exports))
    reports = []
    monkeypatch.setattr(cli, 'write_report', lambda out, plan: reports.append(out))
    assert cli.main(recipe_argv(model_dir, out)) == 0
    text = capsys.readouterr().out
    assert 'node 0 of 2 (NNODES=2 NODE_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29555): joins every stage' in text
    assert [(c[1], c[2]) for c in stage.calls] == [({}, 'stage1.log'), ({}, 'stage2.log')]
    [(ckpt, env, log)] = exports
    assert env == {'NNODES': '1', 'NODE_RANK': '0', 'NPROC_PER_NODE': '1'} and log == 'export.log'
    assert ckpt == str(out / 'stage2_token' / 'checkpoint-39')
    assert reports == [str(out)]  # the summary
    for f in ('plan.json', 'logs/stage1.time.jsonl', 'logs/stage2.time.jsonl'):
        assert (out / f).exists(), f
    assert {k: LeaderStatus(str(out)).read()[k] for k in ('step', 'state')} == {'step': 'all', 'state': 'done'}
    # the rerun skips everything
    assert cli.main(recipe_argv(model_dir, out)) == 0
    assert len(stage.calls) == 2 and len(exports) == 1
    assert '[stage1] skip (complete' in capsys.readouterr().out


def test_node1_joins_the_stages_and_waits_for_node0s_files(model_dir, tmp_path, monkeypatch, node, capsys):
    node(1)
    out = tmp_path / 'out'
    hf = out / 'hf'

    def node0_after(cmd):  # node 0's part while node 1 runs: the tracker (late), then the export of stage 2
        it = int(flag_value(cmd, 'train_iters'))
        ckpt = os.path.join(flag_value(cmd, 'output_dir'), f'checkpoint-{it}')
        threading.Timer(0.1, write_tracker, (ckpt, it)).start()
        if 'stage2_token' in ckpt:
            threading.Timer(0.3, fake_export([]), (ckpt, str(hf), None, (), 'x', {}, None)).start()

    stage = FakeStage(tracker=False, after=node0_after)
    monkeypatch.setattr(cli, 'LoggedRun', stage)
    monkeypatch.setattr(cli, 'export_vanilla', lambda *a, **k: pytest.fail('node 1 must not export'))
    monkeypatch.setattr(cli, 'write_report', lambda *a: pytest.fail('node 1 must not write the summary'))
    threading.Timer(0.1, cli.check_plan_file, (str(out), opts_plan(recipe_argv(model_dir, out))[1], True)).start()
    assert cli.main(recipe_argv(model_dir, out)) == 0
    text = capsys.readouterr().out
    assert [(c[1], c[2]) for c in stage.calls] == [({}, 'stage1.node1.log'), ({}, 'stage2.node1.log')]
    assert '[stage2] complete' in text and f'[export] done by node 0: {hf}' in text and '[done]' in text
    assert sorted(os.listdir(out / 'logs')) == ['stage1.node1.log', 'stage2.node1.log']  # no wall times
    # the rerun: everything done, nothing waited for
    monkeypatch.setattr(cli, 'wait_for', lambda what, ready, *a: ready() or pytest.fail(f'waited for {what}'))
    assert cli.main(recipe_argv(model_dir, out)) == 0
    assert len(stage.calls) == 2 and '[export] skip (done' in capsys.readouterr().out


def test_node1_stops_when_node0_fails(model_dir, tmp_path, monkeypatch, node, capsys):
    node(1)
    out = tmp_path / 'out'
    opts, plan = opts_plan(recipe_argv(model_dir, out))
    cli.check_plan_file(str(out), plan, write=True)
    LeaderStatus(str(out)).write('stage1', 'failed', rc=1, log='old')  # an earlier run's: not this one's
    status = LeaderStatus(str(out))
    stage = FakeStage(tracker=False, after=lambda cmd: threading.Timer(
        0.1, status.write, ('stage1', 'failed'), {'rc': 1, 'log': 'logs/stage1.log'}).start())
    monkeypatch.setattr(cli, 'LoggedRun', stage)
    assert cli.main(recipe_argv(model_dir, out)) == 1
    err = capsys.readouterr().err
    assert 'node 0 failed at stage1 (exit code 1; log: logs/stage1.log) while node 1 waited for' in err
    assert len(stage.calls) == 1


def test_node1_without_node0_times_out(model_dir, tmp_path, monkeypatch, node, capsys):
    node(1, SWIFT_PLT_NODE_WAIT='0.2')
    monkeypatch.setattr(cli, 'LoggedRun', lambda *a, **k: pytest.fail('no stage before node 0 wrote plan.json'))
    assert cli.main(recipe_argv(model_dir, tmp_path / 'out')) == 1
    err = capsys.readouterr().err
    assert f"node 1 waited 0 s for {tmp_path / 'out' / 'plan.json'}, which node 0 writes" in err
