"""The two-stage recipe end to end on CPU (tests/harness): stage 1, an interrupted stage 1 resumed, stage 2 from the
stage-1 weights, the vanilla export of both stages; plain transformers loads the exports and their logits equal
the Megatron checkpoints'. One module-scoped run (~2 min): each test reads its part."""
import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest

from harness import spawn
from harness.cli import CPU_MEGATRON_ARGS, parse_logs, run_cli
from harness.dist import cpu_threads
from harness.tiny import make_jsonl, make_tiny_llama
from swift_plt.recipe.phases import PHASES

# one worker under `pytest -n` (.ci/run): the module-scoped recipe run (~2 min) is shared by every test here
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group('two_stage_cli')]
CPU_EXPORT_ARGS = ('--torch_dtype float32 --fp16 false --bf16 false --ddp_backend gloo --use_cpu_initialization true '
                   '--perform_initialization true --check_model false')


def recipe_argv(model, data, out, *extra, template='llama'):
    # N=3840, λ=0.8, T=64, G=4: stage 1 3072 tokens / (4*4*64) = 3 steps, stage 2 768 / (4*64) = 3 steps.
    # --stage1_batch sequences keeps stage 1 at 3 steps of 4 sequences (the default, G/K = 1 sequence per step,
    # would be 12 steps; its plan and commands are tested in test_two_stage_plan.py). template None: the model
    # type's default template.
    return ['swift-plt-two-stage', '--model', model, '--output_dir', out, '--tokens', '3840', '--lam', '0.8',
            '--max_length', '64', '--global_batch_size', '4', '--stage1_batch', 'sequences', '--dataset', data,
            *(['--template', template] if template else []), '--micro_batch_size', '2', '--lr', '1e-3',
            '--lr_warmup_iters', '0', '--logging_steps', '1', '--seed', '7', '--torch_dtype', 'float32', '--fp16',
            'false', '--bf16', 'false', '--dataset_num_proc', '1', '--dataloader_num_workers', '0', *CPU_MEGATRON_ARGS,
            '--export_args', CPU_EXPORT_ARGS, *extra]


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp('two_stage')
    model = make_tiny_llama(str(root / 'model'))
    data = make_jsonl(str(root / 'train.jsonl'), rows=64)
    out = str(root / 'out')
    argv = recipe_argv(model, data, out, '--stage1_args', '--save_steps 2')
    procs = {'stage1': run_cli(argv + ['--stage', '1'], timeout=900)}
    # interrupt stage 1 after its step-2 checkpoint: drop the final one, rerun -> resumes at step 3
    shutil.rmtree(os.path.join(out, 'stage1_patch', 'checkpoint-3'), ignore_errors=True)
    procs['stage1_resumed'] = run_cli(argv + ['--stage', '1'], timeout=900)
    procs['all'] = run_cli(argv, timeout=900)  # stage 1 complete -> stage 2 + export
    procs['export_stage1'] = run_cli(['swift-plt-export-vanilla', '--checkpoint', os.path.join(out, 'stage1_patch'),
                                      '--output_dir', os.path.join(out, 'hf_stage1'), *CPU_EXPORT_ARGS.split()],
                                     timeout=900)
    # reference for the hand-over: the recipe's own stage-2 command, started from the vanilla export of stage 1 (HF
    # weights, a fresh optimizer by construction) instead of `--mcore_model <stage 1> --finetune true`
    with open(os.path.join(out, 'logs', 'stage2.log')) as f:
        cmd = shlex.split(f.readline()[2:])
    i = cmd.index('--mcore_model')
    del cmd[i:i + 4]  # --mcore_model X --finetune true
    cmd[cmd.index('--model') + 1] = os.path.join(out, 'hf_stage1')
    cmd[cmd.index('--output_dir') + 1] = str(root / 'stage2_from_hf')
    procs['stage2_from_hf'] = run_cli(['megatron', *cmd[1:]], timeout=900)
    return {'out': out, 'model': model, 'procs': procs}


def test_stage1_trains_at_patch_level_and_resumes_where_it_stopped(run):
    first, resumed = run['procs']['stage1'], run['procs']['stage1_resumed']
    assert first.returncode == 0, first.stdout[-5000:]
    assert 'λ/K + 1 - λ = 0.4000' in first.stdout and '[stage2]' not in first.stdout
    assert 'swift-plt-two-stage: NPROC_PER_NODE=1 (from the environment)' in first.stdout  # the harness's, kept
    logs = parse_logs(first.stdout)
    assert [d['iteration'] for d in logs] == ['1/3', '2/3', '3/3']
    assert 'padding_to: 4' in first.stdout  # patch-level batches
    assert resumed.returncode == 0, resumed.stdout[-5000:]
    ck2 = os.path.join(run['out'], 'stage1_patch', 'checkpoint-2')
    assert f'[stage1] resume from {ck2}' in resumed.stdout
    again = parse_logs(resumed.stdout)
    assert [d['iteration'] for d in again] == ['3/3']  # steps 1-2 not redone
    # full state restored (weights, optimizer, LR schedule, RNG, data position): step 3 as if never interrupted
    for key in ('loss', 'grad_norm', 'learning_rate'):
        assert again[0][key] == pytest.approx(logs[2][key], rel=1e-5, abs=1e-9), (key, again[0], logs[2])


def test_data_report_beside_the_plan_with_loss_tokens_per_stage(run):
    """Stage 1's PLT data report is copied beside plan.json and turned into loss tokens per stage (no packing:
    3 steps x 4 sequences x mean loss tokens per document), after stage 1 runs and again when the recipe reruns."""
    with open(os.path.join(run['out'], 'plt_data_report.json')) as f:
        report = json.load(f)['train']
    with open(os.path.join(run['out'], 'stage1_patch', 'plt_data_report.json')) as f:
        assert json.load(f)['train'] == report
    want1 = 12 * report['loss_tokens'] // report['documents']
    want2 = 12 * report['loss_tokens_k1'] // report['documents']
    for name in ('stage1', 'all'):
        out = run['procs'][name].stdout
        assert f'stage 1 (patch level, patch_size=4): ~{want1:,} loss tokens' in out, out[-3000:]
        assert f'stage 2 (token level, patch_size=1): ~{want2:,} loss tokens' in out
    assert not os.path.exists(os.path.join(run['out'], 'stage2_token', 'plt_data_report.json'))  # K=1: no report


def test_rerun_skips_stage1_and_stage2_starts_from_its_weights_with_fresh_optimizer(run):
    proc = run['procs']['all']
    assert proc.returncode == 0, proc.stdout[-5000:]
    s1 = os.path.join(run['out'], 'stage1_patch', 'checkpoint-3')
    assert f'[stage1] skip (complete: {s1})' in proc.stdout
    assert f'Successfully loaded Megatron model weights from: {s1}' in proc.stdout
    logs = parse_logs(proc.stdout)
    # iteration and LR schedule restart: step 1 of 3 with the first-step learning rate of stage 1
    first_stage1 = parse_logs(run['procs']['stage1'].stdout)[0]
    assert [d['iteration'] for d in logs] == ['1/3', '2/3', '3/3']
    assert logs[0]['learning_rate'] == first_stage1['learning_rate']
    assert 'padding_to: 4' not in proc.stdout  # token level
    assert os.path.isdir(os.path.join(run['out'], 'hf'))
    with open(os.path.join(run['out'], 'plan.json')) as f:
        plan = json.load(f)
    assert (plan['stage1']['train_iters'], plan['stage2']['train_iters'], plan['lam']) == (3, 3, '4/5')


def test_handover_is_weights_only_and_lossless(run):
    """Stage 2 of the recipe == the same command started from the stage-1 weights exported to HF (fresh optimizer,
    LR schedule and iteration by construction): the same 3 steps (loss, grad norm, LR)."""
    ref = run['procs']['stage2_from_hf']
    assert ref.returncode == 0, ref.stdout[-5000:]
    got = parse_logs(run['procs']['all'].stdout)
    want = parse_logs(ref.stdout)
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        for key in ('loss', 'grad_norm', 'learning_rate'):
            assert g[key] == pytest.approx(w[key], rel=1e-5, abs=1e-9), (key, g, w)


@pytest.mark.parametrize('export', ['hf', 'hf_stage1'])
def test_exports_are_plain_llamas_for_plain_transformers(run, export):
    if export == 'hf_stage1':
        assert run['procs']['export_stage1'].returncode == 0, run['procs']['export_stage1'].stdout[-5000:]
    hf = os.path.join(run['out'], export)
    with open(os.path.join(hf, 'config.json')) as f:
        config = json.load(f)
    assert config['model_type'] == 'llama' and config['architectures'] == ['LlamaForCausalLM']
    assert 'patch_size' not in config and 'auto_map' not in config
    assert not os.path.exists(os.path.join(hf, 'args.json'))
    # a fresh interpreter without swift-plt (startup hook off): plain transformers, no remote code
    env = dict(os.environ, SWIFT_PLT_DISABLE='1', HF_HUB_OFFLINE='1', TRANSFORMERS_OFFLINE='1',
               OMP_NUM_THREADS=cpu_threads())
    proc = subprocess.run([sys.executable, '-m', 'swift_plt.recipe.export', '--check', hf], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)['class'] == 'transformers.models.llama.modeling_llama.LlamaForCausalLM'


def _logits_worker(model_dir, pairs, input_ids, mcore_model_type='gpt'):
    """Per (mcore checkpoint, HF export): logits of the Megatron model (mcore-bridge type ``mcore_model_type``) with
    the checkpoint's weights (loaded by ms-swift's own load_mcore_checkpoint, weights only) and of the HF export
    (transformers), fp32."""
    from types import SimpleNamespace

    from harness import build_mcore_model, hf_logits, mcore_logits
    from swift.megatron.utils import load_mcore_checkpoint
    results = []
    for ckpt, hf in pairs:
        models = build_mcore_model(model_dir, mcore_model_type=mcore_model_type, load_weights=False)
        args = SimpleNamespace(mcore_model=ckpt, tuner_type='full', finetune=True, no_load_optim=True,
                               no_load_rng=True, no_save_optim=True, no_save_rng=True, tensor_model_parallel_size=1,
                               pipeline_model_parallel_size=1, use_megatron_fsdp=False, fp16=False, bf16=False,
                               data_parallel_random_init=False)
        load_mcore_checkpoint(args, models, load_arg='mcore_model')
        results.append((mcore_logits(models, input_ids), hf_logits(hf, input_ids)))
    return results


def test_export_logits_equal_the_megatron_checkpoints(run):
    import torch
    out = run['out']
    ck1, ck2 = os.path.join(out, 'stage1_patch', 'checkpoint-3'), os.path.join(out, 'stage2_token', 'checkpoint-3')
    ids = torch.randint(4, 512, (2, 24), generator=torch.Generator().manual_seed(0))
    pairs = [(ck2, os.path.join(out, 'hf')), (ck1, os.path.join(out, 'hf_stage1')), (ck1, os.path.join(out, 'hf'))]
    (mg2, hf2), (mg1, hf1), (mg1_again, hf2_again) = spawn(_logits_worker, 1, run['model'], pairs, ids)[0]
    for mg, hf in ((mg2, hf2), (mg1, hf1)):
        diff = (mg - hf).abs().max().item()
        rel = diff / hf.abs().max().item()
        print(f'max abs diff {diff:.3g}, rel {rel:.3g}')
        assert diff < 1e-4 and rel < 1e-5
    # the comparison can fail: stage 2 changed the weights, so the stage-1 checkpoint does not match the final export
    assert (mg1_again - hf2_again).abs().max().item() > 1e-3


def test_end_of_run_summary_and_loss_plot(run):
    """The runner's report after the run that finished (stage 1 from two earlier invocations, one resumed; stage 2):
    steps and tokens per stage, training-loop time within the invocations' wall time, tokens/s and patches/s."""
    out = run['out']
    proc = run['procs']['all']
    text = open(os.path.join(out, 'summary.txt')).read()
    assert text in proc.stdout  # printed too
    assert 'stage 1 (patch level, K=4, max_length=256, micro_batch_size=2): 3/3 steps, 3,072 tokens' in text
    assert 'stage 2 (token level, K=1, max_length=64, micro_batch_size=2): 3/3 steps, 768 tokens' in text
    s1_line, s2_line = [line for line in text.splitlines() if line.startswith('  stage ')]
    assert 'patches/s' in s1_line and 'patches/s' not in s2_line
    rows = json.load(open(os.path.join(out, 'summary.json')))
    for r in rows:
        assert 0 < r['train_seconds'] < r['wall_seconds'], r  # the loop is part of the invocations
        assert r['tokens_per_s'] == pytest.approx(r['tokens'] / r['train_seconds'])
    assert rows[0]['patches_per_s'] == pytest.approx(rows[0]['tokens_per_s'] / 4)
    # stage 1 ran twice (3 steps, then step 3 again after the resume from checkpoint-2): both invocations recorded
    invocations = [json.loads(line) for line in open(os.path.join(out, 'logs', 'stage1.time.jsonl'))]
    assert [r['start_iteration'] for r in invocations] == [0, 2] and invocations[1]['log_line'] > 0
    assert open(os.path.join(out, 'loss_curves.png'), 'rb').read(8) == b'\x89PNG\r\n\x1a\n'
    # every ms-swift milestone was seen (the log lines phases.MILESTONES matches): all phases, adding up to the wall
    for r in rows:
        assert list(r['phases']) == [name for name, _ in PHASES if name != 'wait'], r['phases']
        assert sum(r['phases'].values()) == pytest.approx(r['wall_seconds'], abs=1.0)
    assert 'wall clock: start-up ' in text and "the export's " in text
