"""swift_plt.critic.thd (the engine's padding removal) without a model: the layout's padding rules, packing and
unpacking of rows, ms-swift's PackedSeqParams of a packed row, micro-batches by token count."""
import random
from types import SimpleNamespace

import pytest
import torch

from harness.dist import spawn
from swift_plt.critic.thd import pack_rows, partition_by_tokens, unpack_rows


def _config(tp=1, sp=False, cp=1, backend='flash'):
    return SimpleNamespace(tensor_model_parallel_size=tp, sequence_parallel=sp, context_parallel_size=cp,
                           attention_backend=SimpleNamespace(name=backend), fp8=None, fp4=None, fp8_recipe='delayed')


MULTIPLES = [
    (dict(), (1, 1)),
    (dict(tp=2), (1, 1)),  # TP without SP: any length
    (dict(tp=2, sp=True), (1, 2)),  # SP: each rank holds T/TP tokens
    (dict(cp=2), (4, 4)),  # CP: each sequence a multiple of 2*CP (zigzag)
    (dict(tp=2, sp=True, cp=2), (4, 4)),  # T/CP a multiple of TP
    (dict(tp=4, sp=True, cp=2), (4, 8)),
    (dict(backend='fused'), (1, 64)),  # ms-swift pads for cuDNN fused attention
]


def _stack_worker(position_ids):
    """What needs swift.megatron (the CPU harness): the layout multiples and ms-swift's PackedSeqParams."""
    from swift_plt.critic.thd import layout_multiples, packed_seq_params
    psp = packed_seq_params(position_ids)
    return [layout_multiples(_config(**kw)) for kw, _ in MULTIPLES], {
        k: getattr(psp, k) for k in ('qkv_format', 'cu_seqlens_q', 'cu_seqlens_kv', 'max_seqlen_q', 'max_seqlen_kv')}


@pytest.fixture(scope='module')
def stack():
    ids, n = _rows([3, 6, 2], 6)
    p = pack_rows(ids, n, 2, 4)
    (res, ) = spawn(_stack_worker, 1, p['position_ids'])
    return p, res


def test_layout_multiples_follow_ms_swift_padding(stack):
    assert stack[1][0] == [expected for _, expected in MULTIPLES]


def _rows(lengths, S, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 100, (len(lengths), S), generator=g)
    for b, n in enumerate(lengths):
        ids[b, n:] = -1  # left-aligned rows: padding at the right (never packed)
    return ids, torch.tensor(lengths)


@pytest.mark.parametrize('seq_m, total_m', [(1, 1), (1, 2), (4, 4), (4, 8), (1, 64)])
def test_pack_rows_keeps_each_rows_tokens_in_its_own_sequence(seq_m, total_m):
    lengths, S = [7, 1, 12, 0, 5], 12
    ids, n = _rows(lengths, S)
    p = pack_rows(ids, n, seq_m, total_m)
    cu = p['cu_seqlens'].tolist()
    T = p['input_ids'].shape[1]
    assert T % total_m == 0 and cu[0] == 0 and cu[-1] == T and p['cu_seqlens'].dtype == torch.int32
    for b, L in enumerate(lengths):
        a, e = cu[b], cu[b + 1]
        assert (e - a) % seq_m == 0 and e - a >= max(L, 1)  # no empty sequence
        assert torch.equal(p['input_ids'][0, a:a + L], ids[b, :L])  # the row's tokens, in order
        assert (p['input_ids'][0, a + L:e] == 0).all()  # then its padding
        assert torch.equal(p['position_ids'][0, a:e], torch.arange(e - a))  # positions restart per row
    # only the layout's padding: each sequence rounded up, the total rounded up (by the last sequence)
    need = sum(-(-max(L, 1) // seq_m) * seq_m for L in lengths)
    assert T == -(-need // total_m) * total_m
    # back to rows: the model's per-token output lands on each row's tokens, 0 at padding
    out = unpack_rows(p['input_ids'][..., None].float(), p['cu_seqlens'], n, S)
    assert out.shape == (len(lengths), S, 1)
    real = torch.arange(S)[None] < n[:, None]
    assert torch.equal(out[..., 0][real], ids[real].float()) and (out[..., 0][~real] == 0).all()


def test_pack_rows_to_a_given_total_and_its_gradient():
    ids, n = _rows([3, 5], 6)
    p = pack_rows(ids, n, 4, 4, total=16)  # a pipeline without variable_seq_lengths: every micro-batch 16 tokens
    assert p['input_ids'].shape == (1, 16) and p['cu_seqlens'].tolist() == [0, 4, 16]
    with pytest.raises(ValueError, match='must be >= 12 and a multiple of 4'):
        pack_rows(ids, n, 4, 4, total=8)
    x = torch.randn(1, 16, requires_grad=True)
    unpack_rows(x, p['cu_seqlens'], n, 6).sum().backward()
    assert x.grad.tolist()[0] == [1] * 3 + [0] + [1] * 5 + [0] * 7  # gradient only through real tokens


def test_packed_seq_params_are_ms_swift_s_for_the_packed_row(stack):
    p, (_, psp) = stack
    assert psp['qkv_format'] == 'thd' and p['cu_seqlens'].tolist() == [0, 4, 10, 12]
    assert torch.equal(psp['cu_seqlens_q'], p['cu_seqlens']) and torch.equal(psp['cu_seqlens_kv'], p['cu_seqlens'])
    assert psp['max_seqlen_q'] == psp['max_seqlen_kv'] == 6 and isinstance(psp['max_seqlen_q'], int)


def test_partition_by_tokens_bounds_and_balances():
    rng = random.Random(0)
    for trial in range(200):
        lengths = [rng.choice([rng.randint(1, 40), rng.randint(1, 400)]) for _ in range(rng.randint(1, 24))]
        budget = rng.randint(20, 600)
        multiple = rng.choice([1, 2, 4])
        bins = partition_by_tokens(lengths, budget, multiple)
        assert sorted(i for b in bins for i in b) == list(range(len(lengths)))  # every row once
        assert all(b == sorted(b) and b for b in bins)
        assert [b[0] for b in bins] == sorted(b[0] for b in bins)
        for b in bins:  # within the budget, or a single row longer than it
            assert sum(lengths[i] for i in b) <= budget or len(b) == 1, (lengths, budget, bins)
        if len(bins) < len(lengths):
            assert len(bins) % multiple == 0
        assert len(bins) >= -(-sum(min(n, budget) for n in lengths) // budget) or len(bins) == len(lengths)
    # balanced: 4 rows of 10, 10, 10, 10 in 2 micro-batches of 20, not 30 + 10
    assert partition_by_tokens([10, 10, 10, 10], 30) == [[0, 2], [1, 3]]
    assert partition_by_tokens([50, 5, 5], 20) == [[0], [1, 2]]
    with pytest.raises(ValueError, match='must be >= 1'):
        partition_by_tokens([1], 0)
