"""swift_plt.patch_level.reference (the brute-force PatchTrain loss every test and GPU check compares with): against
PatchTrain's own formula, a small case computed by hand, mutations that must fail, and PatchTrain's forward."""
import math

import pytest
import torch

from swift_plt.patch_level.reference import patch_logits, patchtrain_loss, reference_loss, reference_nll, token_nll

IGN = -100


def random_case(k, seed, B=3, P=5, V=11):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, P, V, dtype=torch.float64, generator=g), torch.randint(0, V, (B, P * k), generator=g)


@pytest.mark.parametrize('k', [1, 2, 3, 4])
def test_equals_patchtrain_formula_without_ignored_labels(k):
    logits, labels = random_case(k, seed=k)
    ref_logits = logits.clone().requires_grad_(True)
    pt_logits = logits.clone().requires_grad_(True)
    total, count = reference_nll(ref_logits, labels, k)
    assert count == 3 * 4 * k  # every (row, patch 0..P-2, k)
    ref, pt = total / count, patchtrain_loss(pt_logits, labels, k)
    torch.testing.assert_close(ref, pt, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(reference_loss(logits, labels, k), ref, rtol=0, atol=0)
    ref.backward()
    pt.backward()
    torch.testing.assert_close(ref_logits.grad, pt_logits.grad, rtol=1e-12, atol=1e-12)


# by hand: K=2, P=3, V=3, softmax(logits[b, p]) = PROBS[p] in both rows (the last patch predicts nothing)
PROBS = [[0.5, 0.25, 0.25], [0.1, 0.2, 0.7], [0.6, 0.3, 0.1]]
LABELS = [[1, 2, 0, IGN, 2, 1],  # patch 0 (labels 1, 2) is nobody's target; targets 0 | 2, 1
          [0, 0, IGN, 1, IGN, 0]]  # targets 1 | 0
# token-aligned NLL: position (p+1)K + k holds -log PROBS[p][label]
HAND_TOKENS = [[0, 0, -math.log(0.5), 0, -math.log(0.7), -math.log(0.2)],
               [0, 0, 0, -math.log(0.25), 0, -math.log(0.1)]]
HAND_SUM, HAND_COUNT = -math.log(0.5 * 0.7 * 0.2 * 0.25 * 0.1), 5


def hand_case():
    logits = torch.tensor(PROBS, dtype=torch.float64).log().expand(2, 3, 3) + torch.tensor([[[1.0]], [[-2.0]]])
    return logits, torch.tensor(LABELS)


def test_ignored_labels_hand_computed():
    logits, labels = hand_case()
    torch.testing.assert_close(token_nll(logits, labels, 2), torch.tensor(HAND_TOKENS, dtype=torch.float64))
    total, count = reference_nll(logits, labels, 2)
    assert count == HAND_COUNT
    assert float(total) == pytest.approx(HAND_SUM, rel=1e-12)
    assert float(reference_loss(logits, labels, 2)) == pytest.approx(HAND_SUM / HAND_COUNT, rel=1e-12)
    # PatchTrain's formula averages each k's column on its own: with ignored labels (here 2 and 3 targets) it is not
    # the mean over the (patch, k) pairs
    by_k = [(-math.log(0.5) - math.log(0.7)) / 2, (-math.log(0.25) - math.log(0.2) - math.log(0.1)) / 3]
    assert float(patchtrain_loss(logits, labels, 2)) == pytest.approx(sum(by_k) / 2, rel=1e-12)
    assert sum(by_k) / 2 != pytest.approx(HAND_SUM / HAND_COUNT, rel=1e-3)


@pytest.mark.parametrize('k', [1, 2, 4])
def test_mutations_fail(k):
    """Targets one token early, or patch p scored on its own tokens: the checks above must fail."""
    logits, labels = random_case(k, seed=10 + k)
    for mutant in (labels.roll(1, dims=1), labels.roll(k, dims=1)):  # mutant[:, (p+1)K + j] = labels one / K early
        with pytest.raises(AssertionError):
            torch.testing.assert_close(reference_loss(logits, mutant, k), patchtrain_loss(logits, labels, k),
                                       rtol=1e-12, atol=1e-12)
    hand_logits, hand_labels = hand_case()
    total, count = reference_nll(hand_logits, hand_labels.roll(1, dims=1), 2)
    assert float(total) != pytest.approx(HAND_SUM, rel=1e-3)
    # a reference that also counted the first patch (every label != -100: 9 of them) would miss HAND_COUNT
    assert int((hand_labels != IGN).sum()) != HAND_COUNT


def test_shape_mismatch_is_clear():
    with pytest.raises(ValueError, match='do not match'):
        token_nll(torch.randn(2, 3, 5), torch.zeros(2, 11, dtype=torch.long), 4)


def test_patch_logits_is_patchtrain_forward():
    """K=1: the stock HF forward. K=3 on tokens repeated 3 times: the mean of 3 equal embeddings at patch positions
    0..P-1 is the stock forward on the unrepeated tokens (token positions 0, 3, 6, ... would differ)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from swift_plt.compat.transformers import hf_rope_guard
    config = LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, initializer_range=0.5)  # logits far from 0
    torch.manual_seed(0)
    with hf_rope_guard():
        model = LlamaForCausalLM(config).double().eval()
    ids = torch.randint(0, 40, (2, 6))
    with torch.no_grad():
        stock = model(input_ids=ids).logits
        torch.testing.assert_close(patch_logits(model, ids, 1), stock, rtol=1e-12, atol=1e-12)
        repeated = ids.repeat_interleave(3, dim=1)
        got = patch_logits(model, repeated, 3)
        torch.testing.assert_close(got, stock, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(patch_logits(model, repeated[1:], 3), got[1:], rtol=1e-12, atol=1e-12)  # one row
        token_positions = model(input_ids=ids, position_ids=torch.arange(6).expand(2, 6) * 3).logits
        assert float((token_positions - stock).abs().max()) > 1e-2
