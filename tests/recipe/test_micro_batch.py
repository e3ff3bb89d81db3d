"""The stages' micro batches (swift_plt/recipe/micro_batch.py), pure logic: the memory estimate against the measured
calibration points and transformers' parameter counts, stage 1's choice on the Llama-3.2-1B config (80 / 32 / 24
GiB, DP 1 and 2, recompute dropped / kept / added), the user's overrides, and a stage's micro batch lowered instead
of dropping GPUs; the recipe's dry run prints and applies both."""
import json
import os
import sys

import pytest

from swift_plt.recipe import cli
from swift_plt.recipe.micro_batch import (FULL, FULL_RECOMPUTE, GIB, NONE, Layout, ModelShape, activation_bytes,
                                          estimate_bytes, fitting_micro_batch, pick_stage1_micro_batch, static_bytes)
from swift_plt.recipe.stages import plan_steps, stage_launch
from test_two_stage_launch import opts_plan

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'gpu'))
import make_family_configs as mfc  # noqa: E402  (the published config.json dicts; stdlib only)

LLAMA = mfc.LLAMA32_1B
FUSED = ['--attention_backend', 'fused']
FULL_OF_BOTH = ['--recompute_granularity', 'full', '--recompute_method', 'uniform', '--recompute_num_layers', '1']


# ---------------------------------------------------------------------------------------------- the estimate
def test_estimate_reproduces_the_measured_peaks():
    """One H100 80GB, Llama-3.2-1B config, bf16, fused attention, MBS 8, T=2048 positions, packing (peak allocated,
    benchmarks/throughput/README.md): stock K=1 58.2 GiB (estimate 60.6, +4.2 %), PLT K=4 44.9 GiB (45.0, +0.2 %);
    PLT K=4 at MBS 16: 67.8 GiB (69.2, +2.1 %)."""
    shape, layout = ModelShape.from_config(LLAMA), Layout.from_argv(FUSED, LLAMA)
    stock = estimate_bytes(shape, layout, 2048, 1, 8, 1) / GIB
    plt4 = estimate_bytes(shape, layout, 2048, 4, 8, 1) / GIB
    assert stock == pytest.approx(58.2, rel=0.05) and plt4 == pytest.approx(44.9, rel=0.05)
    assert (round(stock, 1), round(plt4, 1)) == (60.6, 45.0)
    assert estimate_bytes(shape, layout, 2048, 4, 16, 1) / GIB == pytest.approx(67.8, rel=0.05)
    # static 18 bytes per parameter (20.7 GiB); per sequence stock ~5.0 GiB, K=4 ~3.0 (measured 4.7 and 3.0)
    assert static_bytes(shape, layout, 1) == 18 * shape.params and round(shape.params / 1e9, 3) == 1.236
    assert activation_bytes(shape, layout, 2048, 1) / GIB == pytest.approx(4.99, abs=0.01)
    assert activation_bytes(shape, layout, 2048, 4) / GIB == pytest.approx(3.03, abs=0.01)


@pytest.mark.parametrize('name, params', [('llama-3.2-1b', 1.236e9), ('qwen3-30b-a3b-cut', 3.115e9),
                                          ('deepseek-v3-cut', 4.309e9), ('ernie-4.5-21b-a3b-cut', 2.758e9)])
def test_parameter_count_matches_transformers(name, params):
    """Dense, MoE, MLA + MoE with dense first layers: transformers' counts (tests/gpu/test_family_configs_cpu.py)."""
    assert ModelShape.from_config(mfc.family_config(name)).params == pytest.approx(params, rel=1e-3)


def test_static_memory_follows_the_layout():
    shape = ModelShape.from_config(LLAMA)
    flags = ('', '--use_distributed_optimizer false', '--tensor_model_parallel_size 2', '--torch_dtype float32')
    at = {argv: static_bytes(shape, Layout.from_argv(argv.split()), 2) / shape.params for argv in flags}
    assert at[''] == 2 + 4 + 12 / 2  # ms-swift's default distributed optimizer shards Adam's 12 bytes over DP 2
    assert at['--use_distributed_optimizer false'] == 18
    assert at['--tensor_model_parallel_size 2'] == pytest.approx(12 / 2)
    assert at['--torch_dtype float32'] == 4 + 4 + 8 / 2  # no master copy


def test_recompute_and_unfused_attention_change_the_activations():
    shape, layout = ModelShape.from_config(LLAMA), Layout.from_argv(FUSED, LLAMA)
    assert activation_bytes(shape, layout, 2048, 4, FULL) < 0.3 * activation_bytes(shape, layout, 2048, 4, NONE)
    assert layout.recompute.granularity == 'selective' and not layout.recompute.given  # ms-swift's default
    unfused = Layout.from_argv(['--attention_backend', 'unfused'])
    assert activation_bytes(shape, unfused, 2048, 4) == activation_bytes(shape, layout, 2048, 4)  # selective: none
    assert activation_bytes(shape, unfused, 2048, 4, NONE) > activation_bytes(shape, layout, 2048, 4, NONE)


@pytest.mark.parametrize('config, message', [({'model_type': 'llama'}, 'config.json has no hidden_size'),
                                             (dict(LLAMA, intermediate_size=None), 'has no intermediate_size')])
def test_config_without_the_shape_is_refused(config, message):
    with pytest.raises(ValueError, match=message):
        ModelShape.from_config(config)


# ---------------------------------------------------------------------------------------------- stage 1's choice
def choice(gib, dp, argv=(), asked=8, g1=64):
    """Llama-3.2-1B, K=4, T=2048 (stage 1: 8192 tokens), G1 = 64 sequences per step, --micro_batch_size ``asked``."""
    shape, layout = ModelShape.from_config(LLAMA), Layout.from_argv(FUSED + list(argv), LLAMA)
    return pick_stage1_micro_batch(shape, layout, 2048, 4, g1 // dp, dp, asked, gib * GIB, (layout, asked, dp))


@pytest.mark.parametrize('gib, dp, mbs, recompute', [
    (80, 1, 16, []),  # 69.2 GiB of 72 (measured: 67.8 GiB, ran)
    (80, 2, 16, []),  # distributed optimizer: 13.8 GiB static, 62.3 at 16
    (32, 1, 2, []),  # 8 does not fit: smaller micro batch, no recompute
    (24, 2, 2, []),
    (24, 1, 1, list(FULL_RECOMPUTE)),  # static 20.7 GiB > 90 % of 24: full recompute at 1 (may still not fit)
])
def test_stage1_choice_on_the_1b_config(gib, dp, mbs, recompute):
    c = choice(gib, dp)
    assert c.micro_batch_size == mbs and list(c.flags) == ['--micro_batch_size', str(mbs)] + recompute
    assert c.estimate <= c.budget == 0.9 * gib * GIB or recompute
    assert c.reason.startswith(f'stage 1: {" ".join(c.flags)} (')
    assert f'at K=4; stage 2 (K=1) at --micro_batch_size 8: est. ' in c.reason


def test_stage1_choice_says_why():
    assert 'the largest that fits; est. 69.2 GiB of 80.0 GiB (budget 90%)' in choice(80, 1).reason
    assert '--micro_batch_size 8 does not fit: est. 45.0 GiB' in choice(32, 1).reason
    reason = choice(24, 1).reason
    assert 'without recompute --micro_batch_size 1 needs est. 23.7 GiB; est. 21.5 GiB of 24.0 GiB' in reason


@pytest.mark.parametrize('gib, dp, flags', [
    (80, 1, ['--micro_batch_size', '16', '--recompute_granularity', 'none']),  # fits without: dropped
    (32, 1, ['--micro_batch_size', '8']),  # without it only 2 fits: the user's full kept at 8
    (24, 2, ['--micro_batch_size', '8']),
    (24, 1, ['--micro_batch_size', '1']),  # only with recompute: the user's full kept, at 1
])
def test_recompute_of_both_stages_is_dropped_where_stage1_fits_without(gib, dp, flags):
    c = choice(gib, dp, FULL_OF_BOTH)
    assert list(c.flags) == flags
    assert ('--recompute_granularity full of both stages is dropped' in c.reason) == ('none' in flags)


def test_fitting_micro_batch():
    assert [fitting_micro_batch(n, 2) for n in (1, 2, 3, 4)] == [1, 2, 1, 2]
    assert fitting_micro_batch(12, 5) == 4 and fitting_micro_batch(12, 0) == 1


# ---------------------------------------------------------------------------------------------- in the recipe
@pytest.fixture
def llama_1b(tmp_path):
    d = tmp_path / 'llama_1b'
    d.mkdir()
    (d / 'config.json').write_text(json.dumps(LLAMA))
    return str(d)


def argv_1b(model, out, *extra):
    """N=2B, K=4, T=2048, G=256: stage 1 takes G/K = 64 sequences of 8192 tokens per step."""
    return ['--model', model, '--output_dir', str(out), '--tokens', '2B', '--max_length', '2048',
            '--global_batch_size', '256', '--dataset', 'd.jsonl', '--micro_batch_size', '8', *FUSED, *extra]


def launch_of(model, out, *extra, gpus=1, memory=80 * GIB, environ=None):
    """The recipe's launch, with stage 2 started early where the recipe would (cli.early_stage2 on one node)."""
    opts, plan = opts_plan(argv_1b(model, out, *extra))
    early = cli.early_stage2(opts, plan_steps(opts, plan), multi=False)
    return stage_launch(opts, plan, environ or {}, lambda: gpus, lambda: memory, early)


def test_recipe_applies_the_choice_to_stage1_only(llama_1b, tmp_path):
    launch = launch_of(llama_1b, tmp_path / 'o', gpus=2)
    assert launch.env == {'NPROC_PER_NODE': '2'} and launch.stage_args == {1: ['--micro_batch_size', '16']}
    assert launch.stage_notes[1].startswith('stage 1: --micro_batch_size 16 (the largest that fits; est. 62.3 GiB')
    opts, plan = opts_plan(argv_1b(llama_1b, tmp_path / 'o'))
    steps = {s.name: s.cmd for s in plan_steps(opts, plan, launch.env, None, launch.stage_args)}
    assert steps['stage1'][-2:] == ['--micro_batch_size', '16']  # last: it wins over --micro_batch_size 8
    assert steps['stage2'][-2:] == FUSED and steps['stage2'].count('--micro_batch_size') == 1


@pytest.mark.parametrize('extra, note', [
    (['--stage1_args', '--micro_batch_size 4'], 'stage 1: --micro_batch_size 4; not sized from GPU memory: '
     '--micro_batch_size from --stage1_args (est. 32.8 GiB of 80.0 GiB at K=4)'),
    (['--stage1_args', '--recompute_granularity full --recompute_method uniform --recompute_num_layers 1'],
     'not sized from GPU memory: --recompute_granularity, --recompute_method, --recompute_num_layers from '
     '--stage1_args'),
    (['--stage1_micro_batch', 'keep'], 'stage 1: --micro_batch_size 8; not sized from GPU memory: '
     '--stage1_micro_batch keep'),
])
def test_user_choice_wins_and_is_reported(llama_1b, tmp_path, extra, note):
    launch = launch_of(llama_1b, tmp_path / 'o', *extra)
    assert launch.stage_args == {} and note in launch.stage_notes[1]


def test_nothing_to_size_keeps_the_micro_batch(llama_1b, model_dir, tmp_path):
    assert launch_of(llama_1b, tmp_path / 'o', memory=None).stage_notes[1] == (
        'stage 1: --micro_batch_size 8; not sized from GPU memory: no CUDA device here')
    launch = launch_of(model_dir, tmp_path / 'o')  # config.json with a model_type only
    assert launch.stage_args == {} and launch.stage_notes[1] == (
        'stage 1: --micro_batch_size 8; not sized from GPU memory: cannot estimate it (config.json has no '
        'hidden_size, num_hidden_layers, num_attention_heads, vocab_size)')
    launch = launch_of(llama_1b, tmp_path / 'o', environ={'NPROC_PER_NODE': 'auto'})
    assert launch.stage_args == {} and 'the data-parallel size is not known' in launch.stage_notes[1]


# ---------------------------------------------------------------------------------------------- every GPU
def small_argv(model, out, *extra):
    """N=240K, K=4, T=256, G=8: stage 1 takes 2 sequences per step, stage 2 8."""
    return ['--model', model, '--output_dir', str(out), '--tokens', '240K', '--max_length', '256',
            '--global_batch_size', '8', '--dataset', 'd.jsonl', *extra]


def test_two_gpus_lower_stage1_micro_batch_instead_of_dropping_one(model_dir, tmp_path):
    """The case that ran both stages on one GPU: G1 = 2, --micro_batch_size 2, 2 GPUs."""
    opts, plan = opts_plan(small_argv(model_dir, tmp_path / 'o', '--micro_batch_size', '2'))
    launch = stage_launch(opts, plan, {}, lambda: 2)
    assert launch.env == {'NPROC_PER_NODE': '2'} and launch.stage_args == {1: ['--micro_batch_size', '1']}
    assert launch.stage_notes[1] == ('stage 1: --micro_batch_size 1, not 2: its --global_batch_size 2 gives each of '
                                     'its 2 data-parallel ranks 1 sequence per step; not sized from GPU memory: no '
                                     'CUDA device here')
    assert 2 not in launch.stage_args  # stage 2: 8 sequences over 2 ranks, 2 per micro batch


def test_global_batch_that_does_not_split_still_falls_back_to_fewer_gpus(model_dir, tmp_path):
    opts, plan = opts_plan(small_argv(model_dir, tmp_path / 'o', '--global_batch_size', '12'))  # G1 = 3
    launch = stage_launch(opts, plan, {}, lambda: 2)
    assert launch.env == {'NPROC_PER_NODE': '1'} and launch.stage_args == {}
    assert ('2 processes would not fit: stage 1: its --global_batch_size 3 is not a multiple of data-parallel size 2, '
            'not even at --micro_batch_size 1') in launch.note


def test_user_process_count_is_kept(model_dir, tmp_path):
    opts, plan = opts_plan(small_argv(model_dir, tmp_path / 'o'))
    launch = stage_launch(opts, plan, {'NPROC_PER_NODE': '2'}, None)
    assert launch.env == {} and launch.world_size == 2 and launch.stage_args == {}


def test_dry_run_prints_and_applies_both(llama_1b, model_dir, tmp_path, capsys, monkeypatch):
    """--stage 1: the commands of stage 1 only (the export's check would import transformers: seconds)."""
    for k in ('NPROC_PER_NODE', 'NNODES'):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr('swift_plt.recipe.stages.gpu_count', lambda: 2)
    assert cli.main(small_argv(model_dir, tmp_path / 'a', '--micro_batch_size', '2', '--stage', '1', '--dry_run')) == 0
    out = capsys.readouterr().out
    assert 'NPROC_PER_NODE=2 (2 visible GPUs; set NPROC_PER_NODE to override)' in out
    assert 'swift-plt-two-stage: stage 1: --micro_batch_size 1, not 2: ' in out
    assert '--micro_batch_size 2 --micro_batch_size 1\n' in out  # the last one wins
    monkeypatch.setattr('swift_plt.recipe.stages.gpu_memory', lambda: 80 * GIB)
    assert cli.main(argv_1b(llama_1b, tmp_path / 'b', *FULL_OF_BOTH, '--stage', '1', '--dry_run')) == 0
    out = capsys.readouterr().out
    assert ('swift-plt-two-stage: stage 1: --micro_batch_size 16 --recompute_granularity none (the largest that '
            'fits; the --recompute_granularity full of both stages is dropped: stage 1 fits without it; est. 62.3 GiB '
            'of 80.0 GiB (budget 90%) at K=4; stage 2 (K=1) at --micro_batch_size 8: est. 35.7 GiB; to choose: '
            '--stage1_args "--micro_batch_size N" or --stage1_micro_batch keep)\n') in out
    assert '--recompute_num_layers 1 --micro_batch_size 16 --recompute_granularity none\n' in out


def test_stage2_started_early_takes_its_share_of_stage1s_budget(llama_1b, tmp_path):
    """At 77.5 GiB, MBS 16 (est. 69.2 GiB) fits 90 % of the GPU but not once stage 2's process, started beside
    stage 1, holds its 1.5 GiB: MBS 8 then; one after the other (--stage2_start after), 16."""
    early = launch_of(llama_1b, tmp_path / 'o', memory=int(77.5 * GIB))
    assert early.stage_args == {1: ['--micro_batch_size', '8']}
    assert '(budget 90% less 1.5 GiB for stage 2 started beside it)' in early.stage_notes[1]
    after = launch_of(llama_1b, tmp_path / 'o', '--stage2_start', 'after', memory=int(77.5 * GIB))
    assert after.stage_args == {1: ['--micro_batch_size', '16']} and 'less' not in after.stage_notes[1]
    alone = launch_of(llama_1b, tmp_path / 'o', '--stage', '1', memory=int(77.5 * GIB))  # stage 2 not in this run
    assert alone.stage_args == {1: ['--micro_batch_size', '16']}


def test_stage1_sized_to_its_memory_gets_expandable_segments(llama_1b, tmp_path):
    """The allocator setting goes to stage 1 only, only where its micro batch was sized from memory, never over the
    user's own PYTORCH_CUDA_ALLOC_CONF."""
    launch = launch_of(llama_1b, tmp_path / 'o')
    assert launch.stage_env == {1: {'PYTORCH_CUDA_ALLOC_CONF': 'expandable_segments:True'}}
    opts, plan = opts_plan(argv_1b(llama_1b, tmp_path / 'o'))
    steps = {s.name: s.env for s in plan_steps(opts, plan, launch.env, None, launch.stage_args, launch.stage_env)}
    assert steps['stage1'] == {'NPROC_PER_NODE': '1', 'PYTORCH_CUDA_ALLOC_CONF': 'expandable_segments:True'}
    assert steps['stage2'] == {'NPROC_PER_NODE': '1'}
    assert launch_of(llama_1b, tmp_path / 'o', environ={'PYTORCH_CUDA_ALLOC_CONF': 'x'}).stage_env == {}
    assert launch_of(llama_1b, tmp_path / 'o', '--stage1_micro_batch', 'keep').stage_env == {}
    assert launch_of(llama_1b, tmp_path / 'o', memory=None).stage_env == {}
