"""``MegatronCritic`` (swift_plt.critic.engine) in-process on the real critic model on CPU (tests/harness):
compute_values == plain transformers LlamaForTokenClassification (padding handled), TP=2 and PP=2 (gloo) == 1 rank
for values and for an update step with megatron DDP + megatron optimizer (with 2 and 4 micro-batches against 1:
micro-batching does not change the step), updates lower the loss on a fixed batch, batch errors are clear.
Padding removal: in every layout (1 rank, TP2, TP2+SP, DP2, PP2, PP2xVPP2; CP2 in tests/layouts/test_layouts_cp_cpu.py)
the packed THD path (the default) and the packed path grouped by tokens equal the padded path (values, loss, every
gradient; fp32), and a mutation (the rows' sequences merged) changes the values."""
import pytest
import torch

from harness.critic_paths import assert_packed_equals_padded, packed_vs_padded
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
    attention_mask[3, -2:] = 0  # right-padded response (it ended early)
    input_ids[3, -2:] = 3
    response_returns = torch.rand(B, R, generator=g) * 2 - 1
    response_mask = torch.ones(B, R)
    response_mask[2, -3:] = 0  # no return for its last tokens
    response_mask[3, -2:] = 0  # its padding
    return input_ids, attention_mask, response_returns, response_mask


# rows of 12, 9, 12, 10 tokens -> micro-batches {0, 3}, {1, 2}: out of row order, 8 and 7 value tokens
MAX_TOKENS = 24


def _build(critic_dir, sp=False, vpp=None):
    """This rank's critic chunks (megatron DDP) and a megatron Adam, for the initialised parallel state."""
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    from harness.model import build_mcore_model
    tp, pp = ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size()
    extra = {'sequence_parallel': sp}
    if vpp:  # ms-swift under virtual pipeline: overlap_p2p_comm=True, batch_p2p_comm=False
        ps.set_virtual_pipeline_model_parallel_world_size(vpp)
        extra.update(virtual_pipeline_model_parallel_size=vpp, overlap_p2p_comm=True, batch_p2p_comm=False)
    models = build_mcore_model(critic_dir, mcore_model_type='llama3_2_critic', tp=tp, pp=pp, extra_config=extra)
    models = [DistributedDataParallel(config=m.config, ddp_config=DistributedDataParallelConfig(), module=m,
                                      disable_bucketing=i > 0) for i, m in enumerate(models)]
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer='adam', lr=LR, weight_decay=0.0, clip_grad=0.0, bf16=False, fp16=False), models)
    return models, optimizer


def _worker(critic_dir, mbs, steps, with_hf, layouts=('base', ), mutate_cu_seqlens=False):
    """``layouts`` after the first rebuild the model in the same ranks: 'sp' (sequence parallel on the TP group),
    'vpp2' (two virtual stages per pipeline rank), 'dp2' (parallel state re-initialised: every rank data
    parallel, each with its half of the rows)."""
    from megatron.core import parallel_state as ps

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
    full = {'input_ids': input_ids, 'attention_mask': attention_mask,
            'returns': response_to_values(response_returns, S), 'value_mask': response_to_values(response_mask, S)}
    for layout in layouts:
        rows = slice(None)
        if layout == 'dp2':
            ps.destroy_model_parallel()
            ps.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
            half = B // 2
            rows = slice(ps.get_data_parallel_rank() * half, (ps.get_data_parallel_rank() + 1) * half)
        models, optimizer = _build(critic_dir, sp=layout == 'sp', vpp=2 if layout == 'vpp2' else None)
        batch = {k: v[rows] for k, v in full.items()}
        res = {'rows': rows, 'paths': packed_vs_padded(models, optimizer, batch, mbs if layout != 'dp2' else 1,
                                                        MAX_TOKENS)}
        if layout == layouts[0]:
            critic = MegatronCritic(models, optimizer, micro_batch_size=mbs)
            res['values'] = critic.compute_values({k: batch[k] for k in ('input_ids', 'attention_mask')})
            res['metrics'], res['values_after'] = [], []
            for _ in range(steps):
                res['metrics'].append(critic.update_critic(batch))
                res['values_after'].append(critic.compute_values(batch))
        if mutate_cu_seqlens and layout == layouts[0]:  # mutation: the rows' sequences merged into one
            from swift_plt.critic import thd
            orig = thd.packed_seq_params

            def merged(position_ids, *a, **kw):
                psp = orig(position_ids, *a, **kw)
                psp.cu_seqlens_q = psp.cu_seqlens_kv = psp.cu_seqlens_q[[0, -1]]
                return psp

            thd.packed_seq_params = merged
            try:
                res['merged_values'] = critic.compute_values(batch)
            finally:
                thd.packed_seq_params = orig
        out[layout] = res
    return out


@pytest.fixture(scope='module')
def critic_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp('engine')
    # 4 layers: one per virtual stage at PP=2 x VPP=2
    return make_tiny_critic(str(root / 'critic'), make_tiny_llama(str(root / 'lm'), layers=4))


@pytest.fixture(scope='module')
def one_rank(critic_dir):
    (r, ) = spawn(_worker, 1, critic_dir, None, 3, True, ('base', ), True)
    return dict(r['base'], hf=r['hf'])


def test_values_match_transformers_with_padding(one_rank):
    _, attention_mask, _, _ = make_batch()
    values = one_rank['values']
    assert values.shape == (B, S - 1)
    for b in range(B):
        real = attention_mask[b].nonzero().flatten()
        ref = one_rank['hf'][b][:-1]  # value of position t, t < last real token
        got = values[b, real[:-1]]
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


def test_packed_equals_padded_one_rank(one_rank):
    """Rows without their padding as THD sequences (the default), also grouped by tokens out of row order: the
    padded path's values, loss and every gradient."""
    assert_packed_equals_padded(one_rank['paths'], '1 rank')


def test_mutation_merged_sequences_change_values(one_rank):
    """Mutation: the rows packed as one sequence (cu_seqlens [0, T]): rows after the first attend to the rows
    before them and their values change (the CPU attention honours cu_seqlens), the first row's do not."""
    merged, values = one_rank['merged_values'], one_rank['values_after'][-1]
    diff = (merged - values).abs().amax(1)
    print('merged cu_seqlens: max |d| per row', diff.tolist())
    assert diff[0] <= 1e-6 and (diff[1:] > 1e-3).all()


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
@pytest.mark.parametrize('tp, pp, mbs, layouts', [(2, 1, 2, ('tp2', 'sp', 'dp2')), (1, 2, 1, ('pp2', 'vpp2'))],
                         ids=['tp2_sp_dp2', 'pp2_vpp2'])
def test_tp2_pp2_match_one_rank(critic_dir, one_rank, tp, pp, mbs, layouts):
    """Also micro-batching: the 1-rank reference runs the batch as one micro-batch; here 2 (TP) and 4 (PP, so the
    pipeline really interleaves) micro-batches with unequal token counts, weighted by tokens: the same step.
    In the same ranks, rebuilt: TP2 + sequence parallel, DP2 (each rank half the rows), PP2 x VPP2; in every layout
    the packed paths equal the padded path (values, loss, gradients) and the values equal 1 rank's."""
    results = spawn(_worker, 2, critic_dir, mbs, 1, False, layouts, tp=tp, pp=pp)
    for r in results:  # every rank returns the values and metrics (broadcast from the last stage)
        first = r[layouts[0]]
        _close(first['values'], one_rank['values'])
        assert first['metrics'][0]['value_loss'] == pytest.approx(one_rank['metrics'][0]['value_loss'], rel=1e-5)
        assert first['metrics'][0]['grad_norm'] == pytest.approx(one_rank['metrics'][0]['grad_norm'], rel=1e-3)
        # after one Adam step the values still agree (the same update on every layout)
        _close(first['values_after'][0], one_rank['values_after'][0], rtol=1e-3, atol=1e-4)
        for layout in layouts:
            res = r[layout]
            assert_packed_equals_padded(res['paths'], layout)
            ref = one_rank['paths']['padded']
            _close(res['paths']['packed']['values'], ref['values'][res['rows']])
            if layout != 'dp2' and res['paths']['padded']['loss'] is not None:  # DP: each rank's own rows
                assert res['paths']['padded']['loss'] == pytest.approx(ref['loss'], rel=1e-5), layout


def test_batch_errors_are_clear():
    from swift_plt.critic.batch import check_batch, check_positions
    from swift_plt.critic.engine import MegatronCritic
    critic = MegatronCritic.__new__(MegatronCritic)  # only the micro-batch checks: no model needed
    critic.micro_batch_size = None
    ids = torch.zeros(2, 6, dtype=torch.long)
    with pytest.raises(ValueError, match=r'batch\["returns"\] is missing'):
        check_batch({'input_ids': ids, 'value_mask': torch.ones(2, 5)}, forward_only=False)
    with pytest.raises(ValueError, match=r'must be value-aligned \[B, S-1\] = \(2, 5\).*response_to_values'):
        check_batch({'input_ids': ids, 'returns': torch.ones(2, 3), 'value_mask': torch.ones(2, 3)}, False)
    with pytest.raises(ValueError, match=r'"old_values"\] must be value-aligned'):
        check_batch({'input_ids': ids, 'returns': torch.ones(2, 5), 'value_mask': torch.ones(2, 5),
                     'old_values': torch.ones(2, 6)}, False)
    check_batch({'input_ids': ids}, forward_only=True)
    pos = torch.arange(6)[None].repeat(2, 1)
    mask = torch.ones(2, 6, dtype=torch.long)
    check_positions({'position_ids': pos, 'attention_mask': mask})
    pos[1, 4] = 0  # a row whose positions restart (e.g. two documents in one row): not one THD sequence
    with pytest.raises(ValueError, match=r'position_ids"\] row 1 is not 0, 1, ..., n-1.*remove_padding=False'):
        check_positions({'position_ids': pos, 'attention_mask': mask})
    with pytest.raises(ValueError, match=r'max_tokens_per_micro_batch=...\) groups packed rows by tokens'):
        MegatronCritic([None], max_tokens_per_micro_batch=8, remove_padding=False)
    critic.micro_batch_size, critic.max_tokens_per_micro_batch = 3, None
    with pytest.raises(ValueError, match='not a multiple of micro_batch_size 3'):
        critic._micro_batches({'input_ids': ids})
