"""Critic training through the stock `megatron sft` CLI on CPU (tests/harness): the value loss falls on a learnable
target and a run resumed from the mcore checkpoint continues it exactly, the clipped loss runs on per-token returns +
old values and --packing true trains on the same rows exactly as padded rows, bad input fails before step 1 with its
message."""
import glob
import json
import math
import os

import pytest

from harness.cli import CPU_MEGATRON_ARGS, parse_logs, run_cli
from harness.critic_rows import write_critic_jsonl
from harness.tiny import make_tiny_llama

pytestmark = pytest.mark.slow
CUSTOM_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'custom_model', 'llama.py')


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp('critic_cli')
    return make_tiny_llama(str(root / 'model')), root


def critic_sft(model, data, out_dir, *extra, iters=10, nproc=1, lr='5e-3'):
    argv = ['megatron', 'sft', '--model', model, '--model_type', 'llama3_2_critic', '--template', 'chatml',
            '--custom_register_path', CUSTOM_MODEL, '--dataset', data, '--max_length', '128',
            '--train_iters', str(iters), '--micro_batch_size', '4', '--global_batch_size', '8',
            '--lr', lr, '--lr_warmup_iters', '0', '--lr_decay_style', 'constant', '--logging_steps', '1',
            '--seed', '7', '--torch_dtype', 'float32', '--fp16', 'false', '--bf16', 'false',
            '--save_steps', '1000', '--no_save_optim', 'true', '--no_save_rng', 'true', '--save_safetensors', 'false',
            '--dataset_num_proc', '1', '--dataloader_num_workers', '0', '--output_dir', str(out_dir),
            *CPU_MEGATRON_ARGS, *extra]  # yapf: disable
    return run_cli(argv, nproc=nproc, timeout=900)


def test_value_loss_falls_and_resume_continues(tiny, tmp_path):
    """10 steps on scalar rewards (checkpoint with optimizer at step 5); then a run resumed from that mcore
    checkpoint (--mcore_model ... --finetune false) reproduces steps 6-10 (fp32 on CPU: exactly), head included."""
    model, root = tiny
    data = write_critic_jsonl(root / 'reward.jsonl')
    keep = ('--save_steps', '5', '--no_save_optim', 'false', '--no_save_rng', 'false')
    proc = critic_sft(model, data, tmp_path / 'full', *keep)
    assert proc.returncode == 0, proc.stdout[-5000:]
    logs = parse_logs(proc.stdout)
    assert len(logs) == 10, proc.stdout[-3000:]
    losses = [d['value_loss'] for d in logs]
    print('value_loss', losses, 'explained_variance', [d['explained_variance'] for d in logs],
          'value_mean', [d['value_mean'] for d in logs])
    assert all(d['loss'] == d['value_loss'] for d in logs)
    # the value head starts at zero (causal-LM checkpoint): step 1 is 0.5 * mean(R^2) over response tokens
    assert logs[0]['value_mean'] == 0.0 and 0.3 < losses[0] < 0.8
    # batches differ (rewards 0.5 / 1.5), so compare the first two steps with the last three
    assert sum(losses[-3:]) / 3 < 0.5 * sum(losses[:2]) / 2
    assert logs[-1]['value_mean'] > 0.6
    assert all(math.isfinite(d['explained_variance']) for d in logs)
    assert all(0.4 < d['returns_mean'] < 1.6 for d in logs)

    (ckpt, ) = glob.glob(str(tmp_path / 'full' / '*' / 'checkpoint-5'))
    # the resumed run keeps the save flags: with --no_save_optim true ms-swift 4.6 fails to load the saved optimizer
    # state (KeyError 'params', seen on CPU)
    resumed = critic_sft(model, data, tmp_path / 'resumed', *keep, '--mcore_model', ckpt, '--finetune', 'false')
    assert resumed.returncode == 0, resumed.stdout[-5000:]
    keys = ('iteration', 'value_loss', 'value_mean', 'explained_variance')
    assert [{k: d[k] for k in keys} for d in parse_logs(resumed.stdout)] == [{k: d[k] for k in keys}
                                                                              for d in logs[5:]]


def test_clipped_value_loss_on_per_token_returns_packed_equals_padded(tiny, tmp_path):
    """The clipped loss on per-token returns + old values, padded rows (--padding_free false), every step the whole
    dataset (32 rows); then --packing true with all rows in one pack (THD, one sequence per row): the same rows, so
    the same value loss, clipfrac and explained variance at every step (fp32): each row's returns and old values
    stay with its tokens, and no target crosses a document boundary."""
    model, root = tiny
    data = write_critic_jsonl(root / 'returns.jsonl', kind='returns', rows=32)
    proc = critic_sft(model, data, tmp_path / 'padded', '--value_clip_range', '0.2', '--padding_free', 'false',
                      '--global_batch_size', '32', iters=3)
    assert proc.returncode == 0, proc.stdout[-5000:]
    logs = parse_logs(proc.stdout)
    assert len(logs) == 3 and all(math.isfinite(d['value_loss']) for d in logs), proc.stdout[-3000:]
    assert all(0.0 <= d['value_clipfrac'] <= 1.0 for d in logs)
    # --attention_backend local: ms-swift turns padding-free (THD) off under 'unfused' (_check_padding_free), and
    # --packing would then collate the pack's rows padded; 'local' is megatron's local attention, as 'unfused' here
    packed = critic_sft(model, data, tmp_path / 'packed', '--value_clip_range', '0.2', '--packing', 'true',
                        '--packing_length', '2048', '--micro_batch_size', '1', '--global_batch_size', '1',
                        '--attention_backend', 'local', iters=3)
    assert packed.returncode == 0, packed.stdout[-5000:]
    assert 'not supported in padding-free mode' not in packed.stdout  # really THD
    packed_logs = parse_logs(packed.stdout)
    keys = ('value_loss', 'value_clipfrac', 'explained_variance', 'value_mean', 'returns_mean')
    print('padded', [{k: d[k] for k in keys} for d in logs], '\npacked', [{k: d[k] for k in keys} for d in packed_logs])
    assert len(packed_logs) == 3
    for a, b in zip(packed_logs, logs):
        assert a['grad_norm'] == pytest.approx(b['grad_norm'], rel=1e-5)
        for k in keys:  # explained variance: 1 - Var/Var from fp32 sums (cancellation), so absolute
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-4 if k == 'explained_variance' else 1e-7), (k, a, b)


# Every data error is tested at the template (tests/critic/test_critic_data.py); here one data error and one argument error
# show that they reach the CLI user before step 1 (each CLI run costs ~20 s on CPU).
@pytest.mark.parametrize('kind, extra, message', [
    ('misaligned', [], '"returns" has 3 values but the response has'),
    ('reward', ['--patch_size', '4'], '`llama3_2_critic` is a critic (value head), trained token by token'),
])
def test_bad_input_fails_before_step_1(tiny, tmp_path, kind, extra, message):
    model, root = tiny
    if kind == 'misaligned':
        data = tmp_path / f'{kind}.jsonl'
        row = {'messages': [{'role': 'user', 'content': 'good day'}, {'role': 'assistant', 'content': 'the red door'}],
               'returns': [1.0, 1.0, 1.0]}
        with open(data, 'w') as f:
            for _ in range(8):
                f.write(json.dumps(row) + '\n')
    else:
        data = write_critic_jsonl(root / f'{kind}.jsonl', kind=kind)
    proc = critic_sft(model, str(data), tmp_path, *extra, iters=2)
    assert proc.returncode != 0
    assert message in proc.stdout, proc.stdout[-3000:]
    assert not parse_logs(proc.stdout)
