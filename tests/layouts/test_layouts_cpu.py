"""PLT (``llama3_2_plt``, K=4) and the critic (``llama3_2_critic``) in Megatron's parallel layouts, on CPU over gloo
(tests/harness): sequence parallel (TP=2 + SP), data parallel (DP=2), virtual pipeline (PP=2 x VPP=2) and TP=2+SP
with PP=2, each against the single-rank run on the same global batch.

One training step runs through ms-swift's own trainer code: ``MegatronTrainer.forward_step`` (``get_batch`` ->
``prepare_batch`` -> the PLT-patched ``get_batch_on_this_pp_rank``, the model, ``loss_func``) or
``MegatronCriticTrainer.forward_step``, on megatron's pipeline schedules (interleaved under VPP, ms-swift's p2p
settings), megatron DDP and ``finalize_model_grads`` with ``calculate_per_token_loss`` (ms-swift's default for
causal LMs: the token count is summed over DP and the gradients divided by it). Compared with the single-rank run:
the step-1 loss (rel <= 1e-5), every per-token output (losses / values), and every parameter's gradient, gathered
into HF layout by mcore-bridge's own exporter (relative L2 error per tensor <= 1e-5). fp32 throughout.

The single-rank run is itself checked against a brute-force PatchTrain loss written with plain transformers, so a
mistake common to all layouts (e.g. the first patch of a document counted as a target) fails too.

Padded batches only: packed/THD batches need Transformer Engine's attention (megatron's local attention refuses
``packed_seq_params``); they run on GPU in tests/gpu/layouts.sh. Sequence parallel on CPU uses the harness stand-in
P13 (tests/harness/patches.py: torch norms marked ``sequence_parallel`` like TE's), proven here at K=1 with the stock
GPT model against TP=1.
"""
import math

import pytest
import torch

from harness.dist import spawn
from harness.tiny import make_tiny_critic, make_tiny_llama

# one worker under `pytest -n` (.ci/run): the module-scoped single-rank runs are shared by most tests here
pytestmark = pytest.mark.xdist_group('layouts_cpu')

K = 4
S = 32  # a multiple of K * TP * 2: every layout below holds whole patches per rank
VOCAB = 512
PAD = 3
# 4 micro-batches of 2 padded rows; the real lengths are multiples of K (as the template pads documents) and give
# the two DP halves different token counts (12+32+24+8 vs 32+16+28+20 tokens: the mean of per-rank means != the
# global token mean, see test_dp_token_normalisation_is_sensitive)
LENS = [[12, 32], [24, 8], [32, 16], [28, 20]]
REL = 1e-5


def make_micro_batches(seed=0, critic=False):
    """Padded micro-batches exactly as ms-swift's megatron collator lays them out (input_ids, labels, position_ids,
    bool attention_mask [B, 1, S, S] with True = masked). PLT labels are token-aligned and NOT first-patch-masked:
    the PLT batch patch (get_batch_on_this_pp_rank) must mask them. Critic rows carry per-token ``returns``."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for lens in LENS:
        B = len(lens)
        input_ids = torch.full((B, S), PAD)
        labels = torch.full((B, S), -100)
        position_ids = torch.zeros(B, S, dtype=torch.long)
        mask = torch.tril(torch.ones(B, S, S, dtype=torch.bool)).view(B, 1, S, S)
        for b, n in enumerate(lens):
            ids = torch.randint(4, VOCAB, (n, ), generator=g)
            input_ids[b, :n] = ids
            labels[b, :n] = ids
            labels[b, :n][torch.rand(n, generator=g) < 0.15] = -100
            position_ids[b, :n] = torch.arange(n)
            mask[b, :, :, n:] = 0
        mb = dict(input_ids=input_ids, labels=labels, position_ids=position_ids, attention_mask=~mask)
        if critic:  # a response = the last half of each row; token-aligned returns like the critic template's
            labels[:] = -100
            returns = torch.zeros(B, S)
            for b, n in enumerate(lens):
                labels[b, n // 2:n] = input_ids[b, n // 2:n]
                returns[b, n // 2:n] = torch.rand(n - n // 2, generator=g) * 2 - 1
            mb['returns'] = returns
        out.append(mb)
    return out


def pack(micro_batches, multiple=2 * K * 2):
    """The same documents as padding-free (THD) micro-batches, laid out like ms-swift's packing collator: one row
    [1, T] per micro-batch, position_ids restarting at 0 per document, no attention mask; the row is padded to the
    collator's multiple with pad tokens at position 0 (one-token "documents", labels -100)."""
    out = []
    for mb, lens in zip(micro_batches, LENS):
        keys = ('input_ids', 'labels', 'position_ids') + (('returns', ) if 'returns' in mb else ())
        cat = {k: torch.cat([mb[k][b, :n] for b, n in enumerate(lens)]) for k in keys}
        pad = -cat['input_ids'].numel() % multiple
        fill = {'input_ids': PAD, 'labels': -100, 'position_ids': 0, 'returns': 0.0}
        out.append({k: torch.cat([v, v.new_full((pad, ), fill[k])])[None] for k, v in cat.items()})
    return out


# ---------------------------------------------------------------------------------------------------- rank worker
def _step(hf_dir, model_type, k, micro_batches, vpp=None, sp=False, mutate=None, extra_config=None):
    packed = micro_batches[0]['input_ids'].shape[0] == 1 and 'attention_mask' not in micro_batches[0]
    """One training step (forward + backward + finalize_model_grads) of this rank on its DP share of
    ``micro_batches``; returns loss sums, per-token outputs and (rank 0) the full gradients in HF layout."""
    from types import SimpleNamespace

    from megatron.core import parallel_state as ps
    from megatron.core.distributed import (DistributedDataParallel, DistributedDataParallelConfig,
                                           finalize_model_grads)
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from harness.model import build_mcore_model
    from swift_plt.plugin.register import register_critic_mcore, register_mcore
    assert register_mcore() and register_critic_mcore()
    if mutate == 'no_first_patch_mask':  # mutation: the PLT batch patch forgets the first patch of each document
        import swift.megatron.trainers.utils as trainer_utils
        fn = trainer_utils.get_batch_on_this_pp_rank
        names = fn.__code__.co_freevars
        cell = fn.__closure__[names.index('mask_first_patch')]
        cell.cell_contents = lambda labels, position_ids, patch_size: labels
    if mutate == 'no_sp_norm_grad_reduce':  # mutation: the SP norm stand-in does not mark its weights
        from megatron.core.transformer import torch_norm
        orig_new = torch_norm.WrappedTorchNorm.__new__

        def new(klass, config, *a, **kw):
            norm = orig_new(klass, config, *a, **kw)
            for p in norm.parameters():
                p.sequence_parallel = False
            return norm

        torch_norm.WrappedTorchNorm.__new__ = staticmethod(new)

    tp, pp = ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size()
    dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    extra = {'sequence_parallel': sp, 'calculate_per_token_loss': True, **(extra_config or {})}
    if model_type.endswith('_plt'):
        extra['patch_size'] = k
    if model_type.endswith('_plt') and model_type != 'llama3_2_plt':  # gpt_plt, a hybrid family's <type>_plt
        from swift_plt.plugin.register import plt_model_meta
        plt_model_meta(model_type[:-len('_plt')])
    if vpp:  # ms-swift under virtual pipeline: overlap_p2p_comm=True, batch_p2p_comm=False (megatron_args.py)
        ps.set_virtual_pipeline_model_parallel_world_size(vpp)
        extra.update(virtual_pipeline_model_parallel_size=vpp, overlap_p2p_comm=True, batch_p2p_comm=False)
    models = build_mcore_model(hf_dir, mcore_model_type=model_type, tp=tp, pp=pp, extra_config=extra)
    config = models[0].config
    models = [
        DistributedDataParallel(config=m.config, ddp_config=DistributedDataParallelConfig(), module=m,
                                disable_bucketing=i > 0) for i, m in enumerate(models)
    ]
    for m in models:
        m.train()
    config.finalize_model_grads_func = finalize_model_grads  # as ms-swift's trainer sets it

    args = SimpleNamespace(
        task_type='causal_lm', patch_size=k, model_type=model_type, pipeline_model_parallel_size=pp,
        context_parallel_size=1, padding_free=packed, is_multimodal=False, enable_dft_loss=False,
        enable_channel_loss=False, value_clip_range=None, cp_partition_mode='zigzag')
    if model_type == 'llama3_2_critic':
        from swift_plt.critic.trainer import MegatronCriticTrainer as Trainer
    else:
        from swift.megatron.trainers import MegatronTrainer as Trainer
    trainer = Trainer.__new__(Trainer)  # only forward_step and what it calls: the trainer's args
    trainer.args = args

    per_rank = len(micro_batches) // dp
    mine = micro_batches[dp_rank * per_rank:(dp_rank + 1) * per_rank]
    outputs = []

    def forward_step(data_iterator, model):
        output, loss_func = trainer.forward_step(data_iterator, model)

        def keep(output_tensor):
            outputs.append(output_tensor.detach().float().squeeze(-1))
            return loss_func(output_tensor)

        return output, keep

    iters = [iter([dict(mb) for mb in mine]) for _ in models] if vpp else iter([dict(mb) for mb in mine])
    result = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=iters, model=models, num_microbatches=len(mine),
        seq_length=mine[0]['input_ids'].shape[1], micro_batch_size=mine[0]['input_ids'].shape[0], forward_only=False)
    out = {'dp_rank': dp_rank, 'outputs': outputs, 'chunks': len(models)}
    if result:  # last pipeline stage: [sum, count] per micro-batch, summed here and over DP (ms-swift's logging)
        loss = torch.stack([r['loss'] for r in result]).sum(0)
        torch.distributed.all_reduce(loss, group=ps.get_data_parallel_group(with_context_parallel=True))
        out['loss_sum'], out['tokens'] = float(loss[0]), float(loss[1])
    out['grads'] = _hf_grads([m.module for m in models])
    if torch.distributed.get_rank() != 0:
        out['grads'] = None
    return out


def _hf_grads(chunks):
    """Every parameter's gradient in HF layout (full tensors, TP/PP/VPP gathered by mcore-bridge's exporter, the
    same code that writes HF checkpoints): the parameters' data is pointed at their DDP main_grad for the export."""
    saved = []
    for m in chunks:
        for p in m.parameters():
            saved.append((p, p.data))
            p.data = p.main_grad.view_as(p.data)
    try:
        return {k: v.clone() for k, v in chunks[0].config.bridge.export_weights(chunks, target_device='cpu')}
    finally:
        for p, data in saved:
            p.data = data


# ---------------------------------------------------------------------------------------------------- references
def brute_force_plt_loss(hf_dir, micro_batches, k):
    """PatchTrain with plain transformers (swift_plt.patch_level.reference), row by row on the real tokens: the
    mean NLL of all valid targets of the global batch (patch p predicts the K tokens of patch p+1, none patch 0)."""
    from transformers import AutoModelForCausalLM

    from swift_plt.patch_level.reference import padded_batch_nll
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation='eager')
    nll, count = 0.0, 0
    with torch.no_grad():
        for mb, lens in zip(micro_batches, LENS):
            s, c = padded_batch_nll(model, mb['input_ids'], mb['labels'], lens, k)
            nll, count = nll + float(s), count + c
    return nll / count, count


def _rel(a, b):
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def _loss(results):
    r = next(r for r in results if 'loss_sum' in r)
    assert all(x['loss_sum'] == r['loss_sum'] for x in results if 'loss_sum' in x)  # every last-stage rank
    return r['loss_sum'] / r['tokens'], r['tokens']


def _outputs_by_dp(results):
    """The per-token outputs of the last pipeline stage, micro-batches in DP-rank order (TP ranks agree)."""
    by_dp = {}
    for r in results:
        if r['outputs']:
            by_dp.setdefault(r['dp_rank'], r['outputs'])
    return [o for d in sorted(by_dp) for o in by_dp[d]]


def assert_same_step(results, ref, what, outputs=True, grad_rel=REL):
    """Loss, per-token outputs (same batch format only) and every gradient (within ``grad_rel``) of a layout == the
    single-rank run."""
    (ref_out, ) = ref
    loss, tokens = _loss(results)
    ref_loss, ref_tokens = _loss(ref)
    assert tokens == ref_tokens, f'{what}: token count {tokens} != {ref_tokens}'
    assert loss == pytest.approx(ref_loss, rel=REL), f'{what}: loss {loss!r} vs 1 rank {ref_loss!r}'
    outs, ref_outs = _outputs_by_dp(results), ref_out['outputs']
    assert len(outs) == len(ref_outs)
    for a, b in zip(outs, ref_outs if outputs else []):
        assert a.shape == b.shape and _rel(a, b) <= REL, f'{what}: per-token outputs differ (rel {_rel(a, b):.2e})'
    grads, ref_grads = results[0]['grads'], ref_out['grads']
    assert set(grads) == set(ref_grads), f'{what}: gradient keys differ'
    worst = max((_rel(grads[n], ref_grads[n]), n) for n in ref_grads)
    print(f'{what}: loss {loss!r} (1 rank {ref_loss!r}), {len(grads)} gradients, worst rel {worst[0]:.2e} '
          f'({worst[1]})')
    assert worst[0] <= grad_rel, f'{what}: gradient {worst[1]} differs from 1 rank: rel {worst[0]:.2e}'


# ---------------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope='module')
def hf_dir(tmp_path_factory):
    # 4 layers: one per virtual stage at PP=2 x VPP=2
    return make_tiny_llama(str(tmp_path_factory.mktemp('layouts')), vocab_size=VOCAB, layers=4)


@pytest.fixture(scope='module')
def critic_dir(tmp_path_factory, hf_dir):
    return make_tiny_critic(str(tmp_path_factory.mktemp('layouts_critic')), hf_dir)


@pytest.fixture(scope='module')
def batches():
    return make_micro_batches()


@pytest.fixture(scope='module')
def critic_batches():
    return make_micro_batches(seed=1, critic=True)


@pytest.fixture(scope='module')
def one_rank(hf_dir, batches):
    return spawn(_step, 1, hf_dir, 'llama3_2_plt', K, batches)


@pytest.fixture(scope='module')
def one_rank_packed(hf_dir, batches):
    return spawn(_step, 1, hf_dir, 'llama3_2_plt', K, pack(batches))


@pytest.fixture(scope='module')
def critic_one_rank(critic_dir, critic_batches):
    return spawn(_step, 1, critic_dir, 'llama3_2_critic', 1, critic_batches)


@pytest.fixture(scope='module')
def critic_one_rank_packed(critic_dir, critic_batches):
    return spawn(_step, 1, critic_dir, 'llama3_2_critic', 1, pack(critic_batches))


# ---------------------------------------------------------------------------------------------------- pure checks
def test_sp_slices_of_the_pooled_sequence_are_the_pooled_slices():
    """Under SP rank r holds tokens [r*S/TP, (r+1)*S/TP); with S a multiple of K*TP (patch_padding_to of
    ms-swift's SP multiple TP), pooling that slice gives rank r's slice of the full patch sequence, and the patch
    positions / padding mask chunks match. A length that is a multiple of K and of TP but not of K*TP is refused."""
    from swift_plt.patch_level.layout import check_sequence_parallel_length, patch_padding_to, pool_patches
    for tp in (2, 4):
        assert patch_padding_to(tp, K) == K * tp
        x = torch.randn(K * tp * 3, 2, 8, dtype=torch.float64)
        full = pool_patches(x, K)
        for r, (xs, ps_) in enumerate(zip(x.chunk(tp), full.chunk(tp))):
            assert torch.equal(pool_patches(xs, K), ps_), (tp, r)
    check_sequence_parallel_length(16, K, 2, True)
    with pytest.raises(ValueError, match=r'not a multiple of patch_size \* tensor_model_parallel_size = 4 \* 2'):
        check_sequence_parallel_length(12, K, 2, True)  # 12 = 3 patches: rank slices of 6 tokens straddle a patch
    check_sequence_parallel_length(12, K, 2, False)
    check_sequence_parallel_length(12, K, 1, True)


def test_dp_token_normalisation_is_sensitive():
    """The DP halves of the batch carry different numbers of target tokens, so a per-rank mean averaged over DP
    would not be the global token mean: the DP test below can tell them apart."""
    from swift_plt.patch_level.layout import mask_first_patch
    counts = []
    for mb in make_micro_batches():
        counts.append(int((mask_first_patch(mb['labels'], mb['position_ids'], K) != -100).sum()))
    half = len(counts) // 2
    assert sum(counts[:half]) != sum(counts[half:])


# ---------------------------------------------------------------------------------------------------- the layouts
def test_one_rank_equals_brute_force_patchtrain(hf_dir, batches, one_rank):
    ref_loss, count = brute_force_plt_loss(hf_dir, batches, K)
    loss, tokens = _loss(one_rank)
    print(f'1 rank: loss {loss!r}, brute force {ref_loss!r} over {count} targets')
    assert tokens == count
    assert loss == pytest.approx(ref_loss, rel=REL)


@pytest.mark.slow
def test_sp_stand_in_k1_stock_gpt_tp2_sp_equals_tp1(hf_dir, batches):
    """The harness stand-in itself (P13): the stock mcore-bridge GPT model (K=1, no swift-plt code on the model
    path) at TP=2 + sequence parallel == TP=1: loss, per-token losses, every gradient (final/attention/MLP norms
    included: they are only right if their SP gradients are summed over TP)."""
    ref = spawn(_step, 1, hf_dir, 'gpt', 1, batches)
    assert_same_step(spawn(_step, 2, hf_dir, 'gpt', 1, batches, None, True, tp=2), ref, 'gpt K=1 TP2+SP')


def test_thd_stand_in_k1_stock_gpt_packed_equals_padded(hf_dir, batches):
    """The harness stand-in P14 (THD attention as a block-diagonal causal mask): the stock GPT model (K=1) on the
    packed micro-batches == on the same documents as padded rows: loss and every gradient. (Each document's first
    label is -100 here: upstream rolls the labels over the whole packed row, so a document's last token would
    otherwise target the next document's first token, which a padded row does not have.)"""
    batches = [dict(mb, labels=mb['labels'].clone()) for mb in batches]
    for mb in batches:
        mb['labels'][:, 0] = -100
    ref = spawn(_step, 1, hf_dir, 'gpt', 1, batches)
    assert_same_step(spawn(_step, 1, hf_dir, 'gpt', 1, pack(batches)), ref, 'gpt K=1 packed', outputs=False)


def test_plt_packed_equals_padded_one_rank(one_rank_packed, one_rank):
    """PLT K=4 on THD batches (patch-level cu_seqlens; pad "documents" of one token at the end) == padded rows."""
    assert_same_step(one_rank_packed, one_rank, f'PLT K={K} packed vs padded', outputs=False)


@pytest.fixture(scope='module')
def mla_dir(tmp_path_factory):
    from swift_plt.tools.tiny_families import make_tiny_family
    return make_tiny_family('deepseek_v3', str(tmp_path_factory.mktemp('mla')), vocab_size=VOCAB)


def test_mla_moe_padded_and_packed_equal_brute_force(mla_dir, batches):
    """DeepSeek-V3 shape (MLA + MoE, K=4) through ms-swift's trainer step: padded rows give the brute-force loss,
    packed (THD) rows the same step; in THD, MLA's decoupled RoPE is indexed by the patch positions of each document
    (token positions there fail this test)."""
    no_aux = {'moe_aux_loss_coeff': 0.0}
    ref_loss, count = brute_force_plt_loss(mla_dir, batches, K)
    padded = spawn(_step, 1, mla_dir, 'gpt_plt', K, batches, None, False, None, no_aux)
    loss, tokens = _loss(padded)
    print(f'deepseek_v3 1 rank: loss {loss!r}, brute force {ref_loss!r} over {count} targets')
    assert tokens == count and loss == pytest.approx(ref_loss, rel=REL)
    packed = spawn(_step, 1, mla_dir, 'gpt_plt', K, pack(batches), None, False, None, no_aux)
    assert_same_step(packed, padded, 'deepseek_v3 PLT packed vs padded', outputs=False)


@pytest.mark.slow
@pytest.mark.parametrize('layout', ['tp2_sp', 'dp2_pp2_vpp2'])
def test_plt_packed_layout_equals_one_rank(hf_dir, batches, one_rank_packed, layout):
    """Packed (THD) batches: TP=2+SP (2 ranks), and DP=2 x PP=2 x VPP=2 (4 ranks)."""
    world, kwargs, vpp, sp = {'tp2_sp': (2, dict(tp=2), None, True),
                              'dp2_pp2_vpp2': (4, dict(pp=2), 2, False)}[layout]
    results = spawn(_step, world, hf_dir, 'llama3_2_plt', K, pack(batches), vpp, sp, **kwargs)
    assert_same_step(results, one_rank_packed, f'PLT K={K} packed {layout}')


@pytest.mark.slow
@pytest.mark.parametrize('layout', ['tp2_sp', 'dp2', 'pp2_vpp2'])
def test_plt_layout_equals_one_rank(hf_dir, batches, one_rank, layout):
    kwargs = {'tp2_sp': dict(tp=2), 'dp2': dict(), 'pp2_vpp2': dict(pp=2)}[layout]
    vpp, sp = {'tp2_sp': (None, True), 'dp2': (None, False), 'pp2_vpp2': (2, False)}[layout]
    results = spawn(_step, 2, hf_dir, 'llama3_2_plt', K, batches, vpp, sp, **kwargs)
    assert all(r['chunks'] == (vpp or 1) for r in results)  # VPP: two model chunks on each rank
    assert_same_step(results, one_rank, f'PLT K={K} {layout}')


@pytest.mark.slow
def test_plt_tp2_sp_pp2_equals_one_rank(hf_dir, batches, one_rank):
    results = spawn(_step, 4, hf_dir, 'llama3_2_plt', K, batches, None, True, tp=2, pp=2)
    assert_same_step(results, one_rank, f'PLT K={K} TP2+SP+PP2')


@pytest.mark.slow
def test_critic_dp2_equals_one_rank(critic_dir, critic_batches, critic_one_rank):
    """llama3_2_critic through MegatronCriticTrainer.forward_step: values (per token), value loss and gradients.
    (PP x VPP for the critic: the packed DP2 x PP2 x VPP2 test below.)"""
    results = spawn(_step, 2, critic_dir, 'llama3_2_critic', 1, critic_batches)
    assert_same_step(results, critic_one_rank, 'critic dp2')


def test_critic_packed_equals_padded_one_rank(critic_batches, critic_one_rank_packed, critic_one_rank):
    """The critic on THD rows (``--packing true``) == the same documents as padded rows: value loss, token count,
    every gradient. Meaningful: no document starts with a response token, so no value target crosses a boundary."""
    for mb, lens in zip(critic_batches, LENS):
        assert all(mb['labels'][b, 0] == -100 and (mb['labels'][b, :n] != -100).any() for b, n in enumerate(lens))
    assert_same_step(critic_one_rank_packed, critic_one_rank, 'critic packed vs padded', outputs=False)


@pytest.mark.slow
@pytest.mark.parametrize('layout', ['tp2_sp', 'dp2_pp2_vpp2'])
def test_critic_packed_layout_equals_one_rank(critic_dir, critic_batches, critic_one_rank_packed, layout):
    """Packed (THD) critic batches through MegatronCriticTrainer.forward_step: TP=2+SP (2 ranks), and
    DP=2 x PP=2 x VPP=2 (4 ranks), against the packed single-rank run (per-token values included)."""
    world, kwargs, vpp, sp = {'tp2_sp': (2, dict(tp=2), None, True),
                              'dp2_pp2_vpp2': (4, dict(pp=2), 2, False)}[layout]
    results = spawn(_step, world, critic_dir, 'llama3_2_critic', 1, pack(critic_batches), vpp, sp, **kwargs)
    assert all(r['chunks'] == (vpp or 1) for r in results)
    assert_same_step(results, critic_one_rank_packed, f'critic packed {layout}')


# ---------------------------------------------------------------------------------------------------- mutations
@pytest.mark.slow
def test_mutation_sp_norm_grads_not_reduced_fails(hf_dir, batches, one_rank):
    """Mutation: the SP norm weights not marked sequence_parallel (their gradients stay per-rank partial sums)."""
    results = spawn(_step, 2, hf_dir, 'llama3_2_plt', K, batches, None, True, 'no_sp_norm_grad_reduce', tp=2)
    with pytest.raises(AssertionError, match='layernorm|norm'):
        assert_same_step(results, one_rank, 'mutated')


@pytest.mark.slow
def test_mutation_first_patch_counted_fails_dp(hf_dir, batches):
    """Mutation: the first patch of each document not masked in the batch patch: the DP loss no longer equals the
    brute-force PatchTrain loss (its token count includes targets nothing predicts)."""
    results = spawn(_step, 2, hf_dir, 'llama3_2_plt', K, batches, None, False, 'no_first_patch_mask')
    loss, tokens = _loss(results)
    ref_loss, count = brute_force_plt_loss(hf_dir, batches, K)
    assert tokens != count and not math.isclose(loss, ref_loss, rel_tol=REL)


@pytest.mark.slow
def test_mutation_critic_packed_returns_shifted_fails(critic_dir, critic_batches, critic_one_rank):
    """Mutation: the packed returns shifted by one position (each value trained on its neighbour's return)."""
    packed = pack(critic_batches)
    for mb in packed:
        mb['returns'] = torch.roll(mb['returns'], 1, dims=-1)
    results = spawn(_step, 1, critic_dir, 'llama3_2_critic', 1, packed)
    with pytest.raises(AssertionError, match='loss'):
        assert_same_step(results, critic_one_rank, 'mutated', outputs=False)


# ---------------------------------------------------------------------------------------------------- streaming data
STREAM_ROWS = [{'messages': [{'role': 'assistant', 'content': text}]}
               for text in ['the quick brown fox jumps', 'a', 'over the lazy dog, twice over the lazy dog',
                            'hello world', 'an old wooden chair by the garden wall', 'seven apples'] * 3]


@pytest.fixture(scope='module')
def template(tmp_path_factory):
    model_dir = make_tiny_llama(str(tmp_path_factory.mktemp('tiny_tpl')))
    from swift_plt.plugin.register import register_swift
    register_swift()
    from swift.model import get_model_processor
    from swift.template import get_template
    _, processor = get_model_processor(model_dir, model_type='llama3_2_plt', load_model=False, download_model=False)
    tpl = get_template(processor, template_type='llama', use_chat_template=False, max_length=64, loss_scale='all')
    tpl.set_mode('train')
    tpl.patch_size = K  # what swift_plt/plugin/patches/swift_pipelines_train_sft.py sets for --patch_size 4
    return tpl


def test_streaming_paths_pad_every_document_to_k(template):
    """ms-swift's two streaming data paths (swift/pipelines/train/sft.py: EncodePreprocessor for --streaming,
    IterablePackingDataset for --streaming --packing, whose worker processes get the template with its
    patch_size) encode through the patched Template._encode_truncated: every document a multiple of K with its
    first patch masked, and every packed row patch-aligned (the check the PLT batch patch runs before the model)."""
    from datasets import Dataset, IterableDataset
    from swift.dataset import EncodePreprocessor
    from swift.dataset.packing import IterablePackingDataset

    from swift_plt.patch_level.layout import check_patch_aligned
    stream = Dataset.from_list(STREAM_ROWS).to_iterable_dataset()
    encoded = list(EncodePreprocessor(template=template)(stream, num_proc=1, strict=True))
    assert isinstance(EncodePreprocessor(template=template)(stream, num_proc=1), IterableDataset)
    assert len(encoded) == len(STREAM_ROWS)
    for e in encoded:
        assert len(e['input_ids']) % K == 0 and e['length'] == len(e['input_ids']) and e['labels'][:K] == [-100] * K
    packed = IterablePackingDataset(template, Dataset.from_list(STREAM_ROWS).to_iterable_dataset(), num_proc=1,
                                    packing_length=64, strict=True)
    try:
        rows = list(packed)
    finally:
        for w in packed.workers:
            w.terminate()
    assert sum(len(r) for r in rows) == len(STREAM_ROWS) and any(len(r) > 1 for r in rows)  # really packed
    template.use_megatron = True  # as ms-swift's Megatron pipelines set it: the collator pads to padding_to
    for row in rows:
        assert all(len(e['input_ids']) % K == 0 for e in row)
        batch = template.data_collator(row, padding_to=K * 2)  # the packing collator, TP2+SP multiple
        assert batch['input_ids'].shape[-1] % (K * 2) == 0
        check_patch_aligned(batch['position_ids'], K)


# ---------------------------------------------------------------------------------------------------- stock CLI
@pytest.fixture(scope='module')
def cli_tiny(tmp_path_factory):
    from harness.tiny import make_jsonl
    root = tmp_path_factory.mktemp('layouts_cli')
    return make_tiny_llama(str(root / 'model')), make_jsonl(str(root / 'train.jsonl'), rows=64)


def _megatron_pt(cli_tiny, out_dir, nproc, *extra):
    import os

    from harness.cli import CPU_MEGATRON_ARGS, run_cli
    model, data = cli_tiny
    custom = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'custom_model', 'llama.py')
    argv = ['megatron', 'pt', '--model', model, '--model_type', 'llama3_2_plt', '--template', 'llama',
            '--custom_register_path', custom, '--dataset', data, '--max_length', '64', '--patch_size', str(K),
            '--train_iters', '3', '--micro_batch_size', '2', '--global_batch_size', '4', '--lr', '1e-3',
            '--lr_warmup_iters', '0', '--logging_steps', '1', '--seed', '7', '--torch_dtype', 'float32', '--fp16',
            'false', '--bf16', 'false', '--save_steps', '1000', '--no_save_optim', 'true', '--no_save_rng', 'true',
            '--save_safetensors', 'false', '--dataset_num_proc', '1', '--dataloader_num_workers', '0',
            '--output_dir', str(out_dir), *CPU_MEGATRON_ARGS, *extra]
    return run_cli(argv, nproc=nproc, timeout=900)


# TP2+SP through the CLI: the streaming/packing test below (against one rank); the padding rule (K*TP with SP) of
# padded batches: tests/plugin/test_patches_megatron.py (get_padding_to patched vs original)


@pytest.mark.slow
def test_cli_streaming_packing_tp2_sp_equals_one_rank(cli_tiny, tmp_path):
    """The reference command in miniature: `--streaming true --packing true` (THD through the harness stand-in P14)
    at TP=2 + SP vs 1 rank: same data stream (DP=1 both), fp32 loss of every step and grad norm within 1e-5."""
    from harness.cli import parse_logs
    stream = ('--streaming', 'true', '--packing', 'true')
    one = _megatron_pt(cli_tiny, tmp_path / 'one', 1, *stream)
    tp2 = _megatron_pt(cli_tiny, tmp_path / 'tp2', 2, *stream, '--tensor_model_parallel_size', '2',
                       '--sequence_parallel', 'true')
    assert one.returncode == 0, one.stdout[-5000:]
    assert tp2.returncode == 0, tp2.stdout[-5000:]
    a, b = parse_logs(one.stdout), parse_logs(tp2.stdout)
    print('1 rank', [(d['loss'], d['grad_norm']) for d in a], 'TP2+SP', [(d['loss'], d['grad_norm']) for d in b])
    assert len(a) == len(b) == 3
    for x, y in zip(a, b):
        assert y['loss'] == pytest.approx(x['loss'], rel=REL) and y['grad_norm'] == pytest.approx(x['grad_norm'],
                                                                                                  rel=REL)
