"""swift_plt.critic.loss and the pure parts of swift_plt.critic.data against brute-force references written the
obvious way (python loops over elements, float64), on random inputs incl. empty masks and clip boundaries."""
import math

import pytest
import torch

from swift_plt.critic import data, loss

IGN = -100


def brute_value_loss(v, r, m, old=None, eps=None):
    """verl core_algos.compute_value_loss / TRL: 0.5 * token-mean of max((v-R)^2, (clip(v, old-eps, old+eps)-R)^2)."""
    total, n = 0.0, 0
    for b in range(v.shape[0]):
        for t in range(v.shape[1]):
            if not m[b, t]:
                continue
            vv, rr = float(v[b, t]), float(r[b, t])
            term = (vv - rr)**2
            if eps is not None:
                o = float(old[b, t])
                vc = min(max(vv, o - eps), o + eps)
                term = max(term, (vc - rr)**2)
            total += 0.5 * term
            n += 1
    return total / n if n else 0.0


def brute_ev(v, r, m):
    idx = [(b, t) for b in range(v.shape[0]) for t in range(v.shape[1]) if m[b, t]]
    rr = [float(r[i]) for i in idx]
    dd = [float(r[i]) - float(v[i]) for i in idx]

    def var(x):
        mu = sum(x) / len(x)
        return sum((a - mu)**2 for a in x) / (len(x) - 1)  # unbiased, as verl's masked_var: the factor cancels

    return 1 - var(dd) / var(rr)


def rand_case(seed, B=3, S=11, p=0.6):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(B, S, generator=g)
    r = torch.randn(B, S, generator=g)
    old = v + 0.3 * torch.randn(B, S, generator=g)
    m = torch.rand(B, S, generator=g) < p
    m[0] = False  # a fully masked row
    return v, r, old, m


@pytest.mark.parametrize('seed', range(5))
@pytest.mark.parametrize('eps', [None, 0.0, 0.1, 0.5, 10.0])
def test_value_loss_matches_brute_force(seed, eps):
    v, r, old, m = rand_case(seed)
    got = loss.value_loss(v, r, m, old if eps is not None else None, eps)
    assert float(got) == pytest.approx(brute_value_loss(v, r, m, old, eps), rel=1e-6, abs=1e-7)


def test_masked_entries_never_count_even_nan():
    v, r, old, m = rand_case(0)
    ref = loss.value_loss(v, r, m, old, 0.2)
    v2, r2, old2 = v.clone(), r.clone(), old.clone()
    v2[~m], r2[~m], old2[~m] = float('nan'), float('inf'), float('nan')
    v2.requires_grad_(True)
    got = loss.value_loss(v2, r2, m, old2, 0.2)
    assert float(got.detach()) == pytest.approx(float(ref), rel=1e-6)
    got.backward()
    assert torch.isfinite(v2.grad).all() and (v2.grad[~m] == 0).all()


def test_empty_mask_is_zero_with_zero_grad():
    v = torch.randn(2, 5, requires_grad=True)
    out = loss.value_loss(v, torch.randn(2, 5), torch.zeros(2, 5, dtype=torch.bool))
    out.backward()
    assert float(out) == 0.0 and (v.grad == 0).all()


def test_clip_boundaries():
    """At |v - old| <= eps the clipped loss is the plain MSE; outside it is the max with the clipped term."""
    old = torch.tensor([[0.0, 0.0, 0.0, 0.0]])
    v = torch.tensor([[0.2, -0.2, 0.5, 0.5]])
    r = torch.tensor([[1.0, 1.0, 1.0, -1.0]])
    m = torch.ones(1, 4, dtype=torch.bool)
    per = loss.value_losses(v, r, old, 0.2)
    # exactly on the boundary: clip(v) == v
    assert per[0, 0] == pytest.approx(0.5 * 0.8**2) and per[0, 1] == pytest.approx(0.5 * 1.2**2)
    # v moved towards R beyond eps: clipped value 0.2 is farther from R=1 -> the clipped term wins
    assert per[0, 2] == pytest.approx(0.5 * 0.8**2)
    # v moved away from R=-1: the unclipped term is larger
    assert per[0, 3] == pytest.approx(0.5 * 1.5**2)
    assert float(loss.clip_fraction(v, r, m, old, 0.2)) == pytest.approx(0.25)


def test_gradient_matches_finite_differences():
    v, r, old, m = rand_case(3, B=2, S=6, p=0.8)
    v = v.double().requires_grad_(True)
    for eps in (None, 0.2):
        f = lambda x: loss.value_loss(x, r.double(), m, old.double() if eps is not None else None, eps)  # noqa
        assert torch.autograd.gradcheck(f, (v, ), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize('seed', range(4))
def test_explained_variance_and_metrics(seed):
    v, r, old, m = rand_case(seed)
    assert float(loss.explained_variance(v, r, m)) == pytest.approx(brute_ev(v, r, m), rel=1e-5)
    got = loss.value_metrics(v, r, m)
    idx = m.nonzero(as_tuple=True)
    assert got['value_mean'] == pytest.approx(float(v[idx].double().mean()), rel=1e-5)
    assert got['returns_mean'] == pytest.approx(float(r[idx].double().mean()), rel=1e-5)
    assert got['value_loss'] == pytest.approx(brute_value_loss(v, r, m), rel=1e-5)
    assert float(loss.explained_variance(r, r, m)) == pytest.approx(1.0)  # perfect critic


def test_stats_are_additive_over_micro_batches():
    v, r, _, m = rand_case(7, B=4)
    whole = loss.value_stats(v, r, m)
    parts = [loss.value_stats(v[i:i + 1], r[i:i + 1], m[i:i + 1]) for i in range(4)]
    for k in loss.STAT_KEYS:
        assert float(sum(p[k] for p in parts)) == pytest.approx(float(whole[k]), rel=1e-5, abs=1e-6)


def test_clip_needs_both_old_values_and_range():
    v, r, old, m = rand_case(0)
    with pytest.raises(ValueError, match='needs both old_values and clip_range'):
        loss.value_loss(v, r, m, old, None)
    with pytest.raises(ValueError, match='needs both'):
        loss.value_loss(v, r, m, None, 0.2)


# ---- data: encoding, collation, alignment ----------------------------------------------------------------------


def enc(labels):
    return {'input_ids': list(range(100, 100 + len(labels))), 'labels': list(labels)}


def test_reward_broadcasts_to_response_tokens():
    e = data.encode_targets(enc([IGN, IGN, 7, 8, 9]), {'reward': 2.5}, clipped=False)
    assert e['returns'] == [0.0, 0.0, 2.5, 2.5, 2.5] and 'old_values' not in e


def test_returns_and_old_values_scatter_to_response_tokens():
    e = data.encode_targets(enc([IGN, 5, IGN, 7, 8]), {'returns': [1, 2, 3], 'old_values': [.1, .2, .3]}, True)
    assert e['returns'] == [0.0, 1.0, 0.0, 2.0, 3.0]
    assert e['old_values'] == [0.0, 0.1, 0.0, 0.2, 0.3]


@pytest.mark.parametrize('row, clipped, message', [
    ({}, False, 'has neither "returns"'),
    ({'returns': [1.0, 2.0], 'reward': 1.0}, False, 'both "returns" and "reward"'),
    ({'returns': [1.0, 2.0]}, False, '"returns" has 2 values but the response has 3 tokens'),
    ({'returns': [1.0, 2.0, 3.0, 4.0]}, False, '"returns" has 4 values but the response has 3 tokens'),
    ({'returns': 'abc'}, False, '"returns" must be a list of numbers'),
    ({'returns': [1.0, float('nan'), 2.0]}, False, 'NaN/inf'),
    ({'reward': 'good'}, False, '"reward" must be a finite number'),
    ({'reward': 1.0}, True, '--value_clip_range needs "old_values"'),
    ({'reward': 1.0, 'old_values': [0.0, 0.0, 0.0]}, False, 'only the PPO clipped value loss uses'),
    ({'reward': 1.0, 'old_values': [0.0, 0.0]}, True, '"old_values" has 2 values but the response has 3 tokens'),
])
def test_bad_rows_are_refused_with_a_message(row, clipped, message):
    with pytest.raises(data.CriticDataError, match=message.replace('(', r'\(').replace('"', '"')):
        data.encode_targets(enc([IGN, IGN, 7, 8, 9]), row, clipped)


def test_row_without_response_is_refused():
    with pytest.raises(data.CriticDataError, match='no response tokens'):
        data.encode_targets(enc([IGN, IGN]), {'reward': 1.0}, False)


def test_collate_padded_and_padding_free():
    rows = [[1.0, 2.0], [3.0, 4.0, 5.0]]
    assert data.collate_token_lists(rows, 4, padding_free=False).tolist() == [[1, 2, 0, 0], [3, 4, 5, 0]]
    assert data.collate_token_lists(rows, 6, padding_free=True).tolist() == [[1, 2, 3, 4, 5, 0]]
    with pytest.raises(ValueError):
        data.collate_token_lists(rows, 2, padding_free=False)


def test_value_alignment_is_verl_alignment():
    """Value at position t targets the return of token t+1; for a response of R tokens at the end of S tokens, the
    value-aligned [B, S] targets sit at positions S-R-1 .. S-2 (verl's values[:, -R-1:-1])."""
    S, R = 8, 3
    labels = torch.full((1, S), IGN)
    labels[0, S - R:] = 1
    returns = torch.zeros(1, S)
    returns[0, S - R:] = torch.tensor([10., 20., 30.])
    t = data.value_targets(labels, returns)
    assert t['value_mask'][0].nonzero().flatten().tolist() == list(range(S - R - 1, S - 1))
    assert t['returns'][0, S - R - 1:S - 1].tolist() == [10., 20., 30.]
    assert not t['value_mask'][0, -1]  # nothing wraps around
    # brute force over random labels: mask[t] == (labels[t+1] != -100)
    g = torch.Generator().manual_seed(0)
    labels = torch.where(torch.rand(4, 9, generator=g) < 0.5, torch.tensor(IGN), torch.tensor(3))
    mask = data.value_targets(labels, torch.zeros(4, 9))['value_mask']
    for b in range(4):
        for t in range(9):
            assert bool(mask[b, t]) == (t + 1 < 9 and int(labels[b, t + 1]) != IGN)


def test_engine_response_to_values_matches_verl_slice():
    from swift_plt.critic.engine import response_to_values
    S, R = 9, 4
    resp = torch.arange(2 * R, dtype=torch.float32).view(2, R)
    full = response_to_values(resp, S)  # [B, S-1]
    out = torch.zeros(2, S)  # the model's [B, S] output, where verl reads the response values
    out[:, :-1] = full
    assert torch.equal(out[:, -R - 1:-1], resp)
    assert math.isclose(float(full[:, :S - 1 - R].abs().sum()), 0.0)


def test_explained_variance_is_nan_without_return_variance():
    v, _, _, m = rand_case(1)
    assert math.isnan(float(loss.explained_variance(v, torch.full_like(v, 1.0), m)))
    assert math.isnan(float(loss.explained_variance(v, torch.zeros_like(v), m)))


def rand_spans(seed, B=5, S=10):
    g = torch.Generator().manual_seed(seed)
    am = torch.zeros(B, S, dtype=torch.long)
    for b in range(B):
        n = int(torch.randint(2, S + 1, (1, ), generator=g))
        s0 = int(torch.randint(0, S - n + 1, (1, ), generator=g))
        am[b, s0:s0 + n] = 1
    return torch.randint(4, 100, (B, S), generator=g), am


@pytest.mark.parametrize('seed', range(4))
def test_engine_left_align_brute_force(seed):
    """Each row's token span moves to position 0 (padding right), value-aligned tensors move with their tokens, and
    unalign_values puts values back (0 where the token or the next token is padding)."""
    from swift_plt.critic.engine import left_align, unalign_values
    ids, am = rand_spans(seed)
    B, S = ids.shape
    valid = torch.zeros(B, S - 1, dtype=torch.bool)
    for b in range(B):
        for t in range(S - 1):
            valid[b, t] = bool(am[b, t] and am[b, t + 1])
    returns = torch.randn(B, S - 1)
    out, start = left_align({'input_ids': ids, 'attention_mask': am, 'returns': returns, 'value_mask': valid})
    for b in range(B):
        real = [int(x) for x, m in zip(ids[b], am[b]) if m]
        n = len(real)
        assert out['input_ids'][b, :n].tolist() == real and out['attention_mask'][b].tolist() == [1] * n + [0] * (S - n)
        assert out['position_ids'][b, :n].tolist() == list(range(n))
        s0 = int(start[b])
        for t in range(S - 1):
            if valid[b, t]:  # value position t (state after token t) -> t - s0
                assert bool(out['value_mask'][b, t - s0]) and float(out['returns'][b, t - s0]) == float(returns[b, t])
        assert int(out['value_mask'][b].sum()) == int(valid[b].sum())
    back = unalign_values(out['returns'], start, am)
    assert torch.equal(back, torch.where(valid, returns, torch.zeros_like(returns)))


def test_engine_left_align_errors():
    from swift_plt.critic.engine import left_align
    ids = torch.zeros(2, 6, dtype=torch.long)
    with pytest.raises(ValueError, match='row 1 has padding between tokens'):
        left_align({'input_ids': ids, 'attention_mask': torch.tensor([[1] * 6, [1, 1, 0, 1, 1, 0]])})
    am = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6])
    vm = torch.zeros(2, 5)
    vm[0, 1] = 1  # state after a padding token
    with pytest.raises(ValueError, match='row 0 marks a value position whose token or next token is padding'):
        left_align({'input_ids': ids, 'attention_mask': am, 'value_mask': vm})
