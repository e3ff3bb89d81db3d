"""The HF-side PLT model over each family's own ``*ForCausalLM`` (swift_plt.models.hf_causal_lm), CPU fp32: K=1 is
the family's model bit for bit; K=4 loss and every gradient equal the brute-force PatchTrain formula; MoE families
route patches and add their own load-balancing loss over them; saved as the plain family model."""
import json
import os

import pytest
import torch

from harness.plt_cases import K, PAD, VOCAB, hf_plt_reference, make_batch
from swift_plt.tools.tiny_families import make_tiny_family

FAMILIES = ['qwen2', 'qwen3', 'qwen3_moe', 'qwen2_moe', 'deepseek_v3', 'olmoe', 'glm4', 'minimax_m2', 'hy_v3',
            'qwen3_next', 'qwen3_5',
            'qwen3_5_moe', 'qwen3_vl']


@pytest.fixture(scope='module')
def batch():
    return make_batch()


class _Dirs(dict):
    """The families' tiny dirs, made on first use; a family this transformers has no class for skips (Qwen3.5 is
    in transformers 5.x, not 4.57)."""

    def __init__(self, factory):
        super().__init__()
        self.factory = factory

    def __missing__(self, family):
        from swift_plt.tools.tiny_families import unavailable
        if unavailable(family):
            pytest.skip(unavailable(family))
        self[family] = make_tiny_family(family, str(self.factory.mktemp(family)), vocab_size=VOCAB)
        return self[family]


@pytest.fixture(scope='module')
def dirs(tmp_path_factory):
    return _Dirs(tmp_path_factory)


def load(hf_dir, k, plt=True):
    from transformers import AutoConfig

    from swift_plt.models.hf_causal_lm import causal_lm_class, plt_auto_model_class
    config = AutoConfig.from_pretrained(hf_dir)
    if not plt:  # the family's own class (Qwen3.5: *ForConditionalGeneration, its vision tower kept)
        return causal_lm_class(config).from_pretrained(hf_dir, dtype=torch.float32, attn_implementation='eager')
    return plt_auto_model_class(k).from_pretrained(hf_dir, config=config, dtype=torch.float32,
                                                   attn_implementation='eager')


def trainer_call(model, batch, **kw):
    """As ms-swift's HF trainer calls it on a padded batch: ids, 2-D padding mask, token-aligned labels."""
    padding = (batch['input_ids'] != PAD).long()
    return model(input_ids=batch['input_ids'], attention_mask=padding, labels=batch['labels'], **kw)


@pytest.mark.parametrize('family', FAMILIES)
def test_k1_is_the_family_model_bit_for_bit(family, dirs, batch):
    ids = batch['input_ids']
    plt, plain = load(dirs[family], 1), load(dirs[family], 1, plt=False)
    assert type(plt).__name__ == 'PLT' + type(plain).__name__ and isinstance(plt, type(plain))
    a, b = plt(input_ids=ids, labels=ids), plain(input_ids=ids, labels=ids)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.loss, b.loss)


@pytest.mark.parametrize('family', FAMILIES)
def test_k4_loss_and_every_gradient_match_patchtrain(family, dirs, batch):
    ref_loss, ref_grads = hf_plt_reference(dirs[family], batch, K)
    model = load(dirs[family], K)
    loss = trainer_call(model, batch).loss
    loss.backward()
    # Qwen3.5's language model (in its *ForConditionalGeneration) = the reference's *ForCausalLM of its text config
    grads = {n.replace('model.language_model.', 'model.'): p.grad for n, p in model.named_parameters()
             if p.grad is not None}
    print(f'{family}: hf PLT {float(loss)!r}, brute force {ref_loss!r}, {len(ref_grads)} gradients')
    assert float(loss) == pytest.approx(ref_loss, rel=1e-5)
    assert set(grads) == set(ref_grads)
    for n, g in ref_grads.items():
        torch.testing.assert_close(grads[n], g, rtol=1e-4, atol=1e-6, msg=lambda m: f'{n}: {m}')


@pytest.mark.parametrize('family', ['qwen3_moe', 'qwen2_moe', 'olmoe', 'minimax_m2', 'qwen3_next', 'qwen3_5_moe'])
def test_moe_routes_patches_and_adds_its_aux_loss_over_them(family, dirs, batch):
    """The router sees B*P patch rows (not B*S tokens); aux_loss is the family's load-balancing loss over the real
    patches; the loss is the PLT loss plus router_aux_loss_coef * aux_loss, as the family's forward adds it."""
    import sys
    model = load(dirs[family], K)
    out = trainer_call(model, batch, output_router_logits=True)
    B, S = batch['input_ids'].shape
    assert all(r.shape[0] == B * (S // K) for r in out.router_logits)
    patch_mask = (batch['input_ids'] != PAD).long()[:, ::K]
    func = sys.modules[type(model).plain_class().__module__].load_balancing_loss_func
    router = getattr(model.config, 'text_config', model.config)  # Qwen3.5: the text config holds them
    expected = func(out.router_logits, router.num_experts, router.num_experts_per_tok, patch_mask)
    torch.testing.assert_close(out.aux_loss, expected)
    plain = trainer_call(model, batch, output_router_logits=False)
    assert float(plain.loss + router.router_aux_loss_coef * out.aux_loss) == pytest.approx(float(out.loss), rel=1e-6)
    assert 0 < router.router_aux_loss_coef


@pytest.mark.parametrize('family', ['qwen3', 'qwen3_moe', 'deepseek_v3'])
def test_saved_as_the_plain_family_model(family, dirs, tmp_path):
    from transformers import AutoModelForCausalLM
    model = load(dirs[family], K)
    model.save_pretrained(tmp_path)
    with open(os.path.join(tmp_path, 'config.json')) as f:
        config = json.load(f)
    plain = type(model).plain_class()
    assert config['architectures'] == [plain.__name__] and 'patch_size' not in config
    assert type(AutoModelForCausalLM.from_pretrained(tmp_path)) is plain
    assert model.config.patch_size == K  # the training model keeps its K


def test_qwen3_5_saved_as_its_conditional_generation_model_with_the_vision_tower(dirs, tmp_path):
    """Qwen3.5 at K > 1 trains its language model on text; the checkpoint is the family's multimodal class, its vision
    weights bit for bit the input's."""
    from safetensors.torch import load_file
    model = load(dirs['qwen3_5'], K)
    model.save_pretrained(tmp_path)
    with open(os.path.join(tmp_path, 'config.json')) as f:
        assert json.load(f)['architectures'] == ['Qwen3_5ForConditionalGeneration']
    before = load_file(os.path.join(dirs['qwen3_5'], 'model.safetensors'))
    after = load_file(os.path.join(tmp_path, 'model.safetensors'))
    visual = [n for n in before if '.visual.' in n]
    assert visual and all(torch.equal(before[n], after[n]) for n in visual)


def test_generate_refuses_at_k_gt_1(dirs):
    model = load(dirs['qwen3'], K)
    with pytest.raises(NotImplementedError, match=r'does not generate token by token.*plain model \(Qwen3ForCausalLM'):
        model.generate(torch.tensor([[5, 6, 7, 8]]), max_new_tokens=2)


def test_packed_row_varlen_kwargs_reach_the_decoder_at_patch_level(dirs):
    """A packed row (one row, documents restarting at position 0) with the varlen kwargs ms-swift's multimodal
    collator adds: the decoder gets the documents' patch boundaries (cu_seq_lens / K) and max lengths / K."""
    model = load(dirs['qwen3_next'], K)
    seen = {}
    forward = model.model.forward

    def spy(*args, **kw):
        seen.update(kw)
        return forward(*args, **kw)

    model.model.forward = spy
    lens = [8, 12, 4]  # tokens of three documents, each a multiple of K
    pos = torch.cat([torch.arange(n) for n in lens])[None]
    ids = torch.randint(4, VOCAB, pos.shape, generator=torch.Generator().manual_seed(0))
    cu = torch.tensor([0, 8, 20, 24], dtype=torch.int32)
    model(input_ids=ids, position_ids=pos, labels=ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=12,
          max_length_k=12)
    assert seen['cu_seq_lens_q'].tolist() == seen['cu_seq_lens_k'].tolist() == [0, 2, 5, 6]
    assert seen['cu_seq_lens_q'].dtype == torch.int32 and seen['max_length_q'] == seen['max_length_k'] == 3
    assert seen['position_ids'].tolist() == [[0, 1, 0, 1, 2, 0]]


def test_packed_row_of_a_hybrid_gets_its_patch_boundaries(dirs):
    """A packed row without varlen kwargs (ms-swift's text collator gives positions only): the hybrid's decoder is
    handed the documents' patch boundaries (what fla's varlen kernels restart on; where they would not run, packed rows
    are refused: test_hf_hybrid_packing.py); a dense family gets nothing it did not get before."""
    lens = [8, 12, 4]
    pos = torch.cat([torch.arange(n) for n in lens])[None]
    ids = torch.randint(4, VOCAB, pos.shape, generator=torch.Generator().manual_seed(0))
    for family, expected in (('qwen3_next', [0, 2, 5, 6]), ('qwen3', None)):
        model = load(dirs[family], K)
        seen = {}
        forward = model.model.forward
        model.model.forward = lambda *a, **kw: (seen.update(kw), forward(*a, **kw))[1]
        model(input_ids=ids, position_ids=pos, labels=ids)
        got = seen.get('cu_seq_lens_q')
        assert (got.tolist() if got is not None else None) == expected, family
        if expected:
            assert seen['max_length_q'] == 3 and seen['cu_seq_lens_k'].tolist() == expected
