"""``MegatronCritic`` (swift_plt.critic.engine) in-process on the real critic model on CPU (tests/harness):
compute_values == plain transformers LlamaForTokenClassification (padding handled), TP=2 and PP=2 (gloo) == 1 rank
for values and for an update step with megatron DDP + megatron optimizer (with 2 and 4 micro-batches against 1:
micro-batching does not change the step), updates lower the loss on a fixed batch, batch errors are clear."""
import pytest
import torch

from harness.dist import spawn
from harness.tiny import make_tiny_critic, make_tiny_llama

B, S, R = 4, 12, 5  # batch, sequence, response length (the last R tokens)
LR = 1e-4


def make_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, 512, (B, S), generator=g)
    attention_mask = torch.ones(B, S, dtype=torch.long)
    attention_mask[1, :3] = 0  # left-padded prompt (verl layout)
    input_ids[1, :3] = 3
    response_returns = torch.rand(B, R, generator=g) * 2 - 1
    response_mask = torch.ones(B, R)
    response_mask[2, -2:] = 0  # a response that ended early
    return input_ids, attention_mask, response_returns, response_mask


def _worker(critic_dir, mbs, steps, with_hf):
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    from harness.model import build_mcore_model
    from swift_plt.critic.engine import MegatronCritic, response_to_values
    from swift_plt.plugin.register import register_critic_mcore

    input_ids, attention_mask, response_returns, response_mask = make_batch()
    out = {}
    if with_hf:  # before any mcore model exists in this process (RoPE hazard)
        from transformers import AutoModelForTokenClassification
        hf = AutoModelForTokenClassification.from_pretrained(critic_dir, dtype=torch.float32).eval()
        with torch.no_grad():
            out['hf'] = [hf(input_ids=input_ids[b:b + 1, attention_mask[b].bool()]).logits[0, :, 0] for b in range(B)]
    assert register_critic_mcore()
    tp, pp = ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size()
    models = build_mcore_model(critic_dir, mcore_model_type='llama3_2_critic', tp=tp, pp=pp)
    models = [
        DistributedDataParallel(config=m.config, ddp_config=DistributedDataParallelConfig(), module=m) for m in models
    ]
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer='adam', lr=LR, weight_decay=0.0, clip_grad=0.0, bf16=False, fp16=False), models)
    critic = MegatronCritic(models, optimizer, micro_batch_size=mbs)
    batch = {'input_ids': input_ids, 'attention_mask': attention_mask}
    out['values'] = critic.compute_values(batch)
    batch.update(returns=response_to_values(response_returns, S), value_mask=response_to_values(response_mask, S))
    out['metrics'], out['values_after'] = [], []
    for _ in range(steps):
        out['metrics'].append(critic.update_critic(batch))
        out['values_after'].append(critic.compute_values(batch))
    return out


@pytest.fixture(scope='module')
def critic_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp('engine')
    return make_tiny_critic(str(root / 'critic'), make_tiny_llama(str(root / 'lm')))


@pytest.fixture(scope='module')
def one_rank(critic_dir):
    return spawn(_worker, 1, critic_dir, None, 3, True)[0]


def test_values_match_transformers_with_padding(one_rank):
    _, attention_mask, _, _ = make_batch()
    values = one_rank['values']
    assert values.shape == (B, S - 1)
    for b in range(B):
        real = attention_mask[b].nonzero().flatten()
        ref = one_rank['hf'][b][:-1]  # value of position t, t < last real token
        got = values[b, real[:-1]]
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


def test_update_lowers_loss_on_a_fixed_batch(one_rank):
    from swift_plt.critic.loss import value_loss
    from swift_plt.critic.engine import response_to_values
    _, _, response_returns, response_mask = make_batch()
    losses = [m['value_loss'] for m in one_rank['metrics']]
    print('value_loss per update', losses, [m['explained_variance'] for m in one_rank['metrics']])
    # metrics are of the batch before the step: step 1's value_loss is the loss of compute_values' output
    ref = value_loss(one_rank['values'], response_to_values(response_returns, S), response_to_values(response_mask, S))
    assert losses[0] == pytest.approx(float(ref), rel=1e-5)
    assert losses[2] < losses[1] < losses[0]
    assert one_rank['metrics'][0]['grad_norm'] > 0


def _close(a, b, rtol=1e-4, atol=1e-5):
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


@pytest.mark.slow
@pytest.mark.parametrize('tp, pp, mbs', [(2, 1, 2), (1, 2, 1)])
def test_tp2_pp2_match_one_rank(critic_dir, one_rank, tp, pp, mbs):
    """Also micro-batching: the 1-rank reference runs the batch as one micro-batch; here 2 (TP) and 4 (PP, so the
    pipeline really interleaves) micro-batches with unequal token counts, weighted by tokens: the same step."""
    results = spawn(_worker, 2, critic_dir, mbs, 1, False, tp=tp, pp=pp)
    for r in results:  # every rank returns the values and metrics (broadcast from the last stage)
        _close(r['values'], one_rank['values'])
        assert r['metrics'][0]['value_loss'] == pytest.approx(one_rank['metrics'][0]['value_loss'], rel=1e-5)
        assert r['metrics'][0]['grad_norm'] == pytest.approx(one_rank['metrics'][0]['grad_norm'], rel=1e-3)
        # after one Adam step the values still agree (the same update on every layout)
        _close(r['values_after'][0], one_rank['values_after'][0], rtol=1e-3, atol=1e-4)


def test_batch_errors_are_clear():
    from swift_plt.critic.engine import MegatronCritic
    critic = MegatronCritic.__new__(MegatronCritic)  # only the batch checks: no model needed
    critic.micro_batch_size = None
    ids = torch.zeros(2, 6, dtype=torch.long)
    with pytest.raises(ValueError, match=r'batch\["returns"\] is missing'):
        critic._check_batch({'input_ids': ids, 'value_mask': torch.ones(2, 5)}, forward_only=False)
    with pytest.raises(ValueError, match=r'must be value-aligned \[B, S-1\] = \(2, 5\).*response_to_values'):
        critic._check_batch({'input_ids': ids, 'returns': torch.ones(2, 3), 'value_mask': torch.ones(2, 3)}, False)
    with pytest.raises(ValueError, match=r'"old_values"\] must be value-aligned'):
        critic._check_batch({'input_ids': ids, 'returns': torch.ones(2, 5), 'value_mask': torch.ones(2, 5),
                             'old_values': torch.ones(2, 6)}, False)
    critic._check_batch({'input_ids': ids}, forward_only=True)
    critic.micro_batch_size = 3
    with pytest.raises(ValueError, match='not a multiple of micro_batch_size 3'):
        critic._micro_batches({'input_ids': ids})
