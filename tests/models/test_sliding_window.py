"""Sliding windows at patch level (swift_plt.patch_level.window): W tokens -> ceil(W / K) patches, in HF's convention
(``sliding_window`` W) and in megatron's (``window_size`` (W - 1, 0), as mcore-bridge converts W), against masks built
by hand. The HF-side PLT model, CPU fp32, over GPT-OSS (window 6 tokens in every other layer, attention sinks) and
Qwen2 with ``use_sliding_window`` (window 6 in its second layer): K=4 loss and every gradient equal the brute force on
the family's model with sliding_window 2; K=1 is the family's model bit for bit, also after K=4 steps; the checkpoint
keeps the window in tokens. The Megatron side (GPT-OSS): tests/models/test_families_cpu.py."""
import json
import os
import random

import pytest
import torch

from harness.plt_cases import K, PAD, VOCAB, hf_plt_reference, make_batch, patch_level_hf_config, patch_level_window
from swift_plt.patch_level.window import patch_window, patch_window_size


def hf_mask(n, window):
    """[n, n] bool: query q sees key j iff j <= q and j > q - window (transformers' sliding_window_overlay)."""
    return torch.tensor([[j <= q and j > q - window for j in range(n)] for q in range(n)])


def megatron_mask(n, window_size):
    """[n, n] bool: query q sees key j iff q - left <= j <= q + right (TE's window_size; megatron's local path)."""
    left, right = window_size
    return torch.tensor([[q - left <= j <= q + right for j in range(n)] for q in range(n)])


def test_patch_window_covers_the_tokens_window_with_the_fewest_patches():
    """On random (W, K): ceil(W / K) is the smallest patch count whose tokens cover W; mcore-bridge's (W - 1, 0)
    and HF's W give one mask at K=1, and patch_window_size / patch_window give one mask at patch level."""
    rng = random.Random(0)
    for _ in range(200):
        w, k, n = rng.randint(1, 40), rng.randint(1, 8), rng.randint(1, 24)
        p = patch_window(w, k)
        assert p == min(q for q in range(1, w + 1) if q * k >= w)
        assert torch.equal(hf_mask(n, w), megatron_mask(n, (w - 1, 0)))  # upstream's conversion, K=1
        assert torch.equal(megatron_mask(n, patch_window_size((w - 1, 0), k)), hf_mask(n, p))
    assert patch_window(6, 1) == 6 and patch_window_size((5, 0), 1) == (5, 0)  # K=1: as it is
    assert patch_window(None, 4) is None and patch_window(0, 4) == 0 and patch_window_size(None, 4) is None
    assert patch_window_size((-1, 0), 4) == (-1, 0)  # no window


def test_patch_window_equals_the_reference_counted_from_token_positions():
    """The rule the product runs (ceil(W / K)) against the harness's reference (the patches that the W tokens ending
    at a patch's last token touch), which the parity tests load instead of the product's rule."""
    bad = [(w, k) for w in range(1, 41) for k in range(1, 9) if patch_window(w, k) != patch_level_window(w, k)]
    assert not bad, bad
    assert patch_level_window(6, 4) == 2 and patch_level_window(8, 4) == 2 and patch_level_window(9, 4) == 3


def test_a_window_that_looks_right_is_refused():
    with pytest.raises(ValueError, match=r'causal sliding windows \(right size 0\) only'):
        patch_window_size((5, 2), 4)
    with pytest.raises(ValueError, match='must be >= 1'):
        patch_window(-3, 4)


# ------------------------------------------------------------------------------------------------ HF side, GPT-OSS


# family -> config.json changes of its tiny model: a window of 6 tokens, shorter than the 32-token rows
WINDOWED = {'gpt_oss': {}, 'qwen2': dict(use_sliding_window=True, sliding_window=6, max_window_layers=1)}


@pytest.fixture(scope='module')
def dirs(tmp_path_factory):
    from swift_plt.tools.tiny_families import make_tiny_family, unavailable
    made = {}

    def get(family):
        if unavailable(family):
            pytest.skip(unavailable(family))
        if family not in made:
            made[family] = make_tiny_family(family, str(tmp_path_factory.mktemp(family)), vocab_size=VOCAB,
                                            **WINDOWED[family])
        return made[family]

    return get


@pytest.fixture(scope='module')
def batch():
    return make_batch()


def load(hf_dir, k):
    from transformers import AutoConfig

    from swift_plt.models.hf_causal_lm import plt_auto_model_class
    return plt_auto_model_class(k).from_pretrained(hf_dir, config=AutoConfig.from_pretrained(hf_dir),
                                                   dtype=torch.float32, attn_implementation='eager')


def trainer_loss(model, batch):
    """As ms-swift's HF trainer calls it on a padded batch: ids, 2-D padding mask, token-aligned labels."""
    return model(input_ids=batch['input_ids'], attention_mask=(batch['input_ids'] != PAD).long(),
                 labels=batch['labels']).loss


@pytest.mark.parametrize('family', list(WINDOWED))
def test_k4_loss_and_every_gradient_match_the_brute_force_with_the_window_in_patches(family, dirs, batch):
    hf_dir = dirs(family)
    assert patch_level_hf_config(hf_dir) == {'sliding_window': 2}
    ref_loss, ref_grads = hf_plt_reference(hf_dir, batch, **patch_level_hf_config(hf_dir))
    model = load(hf_dir, K)
    loss = trainer_loss(model, batch)
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    print(f'{family}: hf PLT {float(loss)!r}, brute force {ref_loss!r}, {len(ref_grads)} gradients')
    assert float(loss) == pytest.approx(ref_loss, rel=1e-5)
    assert set(grads) == set(ref_grads)
    assert any(n.endswith('.sinks') for n in grads) == (family == 'gpt_oss')
    for n, g in ref_grads.items():
        torch.testing.assert_close(grads[n], g, rtol=1e-4, atol=1e-6, msg=lambda m: f'{n}: {m}')


@pytest.mark.parametrize('family', list(WINDOWED))
def test_k4_with_the_window_left_in_tokens_fails(family, dirs, batch, monkeypatch):
    """The comparison above can fail on the window: without the conversion (W = 6 patches) the K=4 loss moves."""
    from swift_plt.models.hf_causal_lm import PLTCausalLM
    ref_loss, _ = hf_plt_reference(dirs(family), batch, **patch_level_hf_config(dirs(family)))
    monkeypatch.setattr(PLTCausalLM, '_sync_sliding_window', lambda self, k: None)
    with torch.no_grad():
        loss = float(trainer_loss(load(dirs(family), K), batch))
    print(f'{family}, window left at W: hf PLT {loss!r}, brute force {ref_loss!r}')
    assert loss != pytest.approx(ref_loss, rel=1e-4)


@pytest.mark.parametrize('family', list(WINDOWED))
def test_k1_is_the_family_model_bit_for_bit_also_after_k4(family, dirs, batch):
    """K=1 runs the family's forward with its window of 6 tokens, before and after the same model ran K=4."""
    from transformers import AutoModelForCausalLM
    plain = AutoModelForCausalLM.from_pretrained(dirs(family), dtype=torch.float32, attn_implementation='eager')
    model = load(dirs(family), 1)
    ids = batch['input_ids']
    with torch.no_grad():
        ref = plain(input_ids=ids, labels=ids)
        a = model(input_ids=ids, labels=ids)
        model.config.patch_size = K
        trainer_loss(model, batch)
        assert model.config.sliding_window == 2
        model.config.patch_size = 1
        b = model(input_ids=ids, labels=ids)
    windows = {m.sliding_window for m in model.modules() if getattr(m, 'sliding_window', None) is not None}
    assert model.config.sliding_window == 6 and windows == {6}
    for out in (a, b):
        assert torch.equal(out.logits, ref.logits) and torch.equal(out.loss, ref.loss)


def test_checkpoint_keeps_the_window_in_tokens(dirs, batch, tmp_path):
    model = load(dirs('gpt_oss'), K)
    with torch.no_grad():
        trainer_loss(model, batch)
    model.save_pretrained(tmp_path)
    with open(os.path.join(tmp_path, 'config.json')) as f:
        saved = json.load(f)
    assert saved['sliding_window'] == 6 and 'patch_size' not in saved
    # the training model goes on at patch level: config and every sliding layer at 2 patches
    windows = {m.sliding_window for m in model.modules() if getattr(m, 'sliding_window', None) is not None}
    assert model.config.sliding_window == 2 and windows == {2}
