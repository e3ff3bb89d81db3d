"""The PLT mcore-bridge GPTModel for real on CPU (tests/harness): loss and gradients against a brute-force PLT
reference built from plain transformers on the same HF weights (fp32), TP=2 and PP=2 over gloo against TP=PP=1,
and K=1 against the stock mcore-bridge GPT model."""
import pytest
import torch

from harness import plt_cases
from harness.dist import spawn
from harness.plt_cases import K, PAD, VOCAB, make_batch, mcore_loss
from harness.tiny import make_tiny_llama

# one worker under `pytest -n` (.ci/run): the module-scoped reference and Megatron runs are shared
pytestmark = pytest.mark.xdist_group('plt_model_cpu')

EMB = 'model.embed_tokens.weight'


def hf_plt_reference(hf_dir, batch, k):
    """(loss, input-embedding gradient) of the brute force (harness.plt_cases)."""
    loss, grads = plt_cases.hf_plt_reference(hf_dir, batch, k)
    return loss, grads[EMB]


@pytest.fixture(scope='module')
def hf_dir(tmp_path_factory):
    return make_tiny_llama(str(tmp_path_factory.mktemp('tiny')), vocab_size=VOCAB)


@pytest.fixture(scope='module')
def batch():
    return make_batch()


@pytest.fixture(scope='module')
def reference(hf_dir, batch):
    return hf_plt_reference(hf_dir, batch, K)


@pytest.fixture(scope='module')
def mcore_plt(hf_dir, batch):
    (out, ) = spawn(mcore_loss, 1, hf_dir, batch, K, 'llama3_2_plt')
    return out


def test_plt_loss_and_grad_match_hf_reference(mcore_plt, reference):
    ref_loss, ref_grad = reference
    assert mcore_plt['loss'] == pytest.approx(ref_loss, rel=1e-5)
    torch.testing.assert_close(mcore_plt['emb_grad'], ref_grad, rtol=1e-4, atol=1e-6)


def hf_plt_model_loss(hf_dir, batch, k):
    """The HF-side model (swift_plt.models.hf_llama) as ms-swift's HF trainer calls it on a padded batch: token ids,
    2-D padding mask, token-aligned labels (no position_ids: the collator gives none)."""
    from transformers import AutoConfig

    from swift_plt.models.hf_llama import PLTLlamaForCausalLM
    config = AutoConfig.from_pretrained(hf_dir)
    config.patch_size = k
    model = PLTLlamaForCausalLM.from_pretrained(hf_dir, config=config, dtype=torch.float32)
    padding = (batch['input_ids'] != PAD).long()  # 1 = real token (the pad id only in the padding here)
    loss = model(input_ids=batch['input_ids'], attention_mask=padding, labels=batch['labels']).loss
    loss.backward()
    return float(loss), model.model.embed_tokens.weight.grad.clone()


def test_backend_parity_hf_model_megatron_and_patchtrain_formula(hf_dir, batch, reference, mcore_plt):
    """Same weights, same batch (fp32): HF-side PLT model == Megatron PLT model == brute-force PatchTrain formula,
    loss and input-embedding gradient."""
    ref_loss, ref_grad = reference
    hf_loss, hf_grad = hf_plt_model_loss(hf_dir, batch, K)
    print(f'PLT loss: hf model {hf_loss!r}, megatron {mcore_plt["loss"]!r}, brute force {ref_loss!r}')
    assert hf_loss == pytest.approx(ref_loss, rel=1e-5)
    assert hf_loss == pytest.approx(mcore_plt['loss'], rel=1e-5)
    torch.testing.assert_close(hf_grad, ref_grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(hf_grad, mcore_plt['emb_grad'], rtol=1e-4, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize('tp, pp', [(2, 1), (1, 2)])
def test_plt_tp2_pp2_match_reference(hf_dir, batch, reference, tp, pp):
    outs = spawn(mcore_loss, 2, hf_dir, batch, K, 'llama3_2_plt', tp=tp, pp=pp)
    losses = [o['loss'] for o in outs if 'loss' in o]
    assert losses and all(x == pytest.approx(reference[0], rel=1e-5) for x in losses)
    if tp == 2:  # vocab-sharded embedding gradients: concatenated they are the full one
        grad = torch.cat([o['emb_grad'] for o in outs])
        torch.testing.assert_close(grad[:VOCAB], reference[1], rtol=1e-4, atol=1e-6)


def test_k1_plt_model_is_stock_gpt_bit_for_bit(hf_dir, batch):
    """K=1 llama3_2_plt runs upstream code: same loss and gradient bits as mcore-bridge's stock GPT model."""
    (plt1, ) = spawn(mcore_loss, 1, hf_dir, batch, 1, 'llama3_2_plt')
    (stock, ) = spawn(mcore_loss, 1, hf_dir, batch, 1, 'gpt')
    assert plt1['loss'] == stock['loss']
    assert torch.equal(plt1['emb_grad'], stock['emb_grad'])


def test_backend_parity_tied_embeddings(tmp_path, batch):
    """Llama-3.2-1B/3B tie the output layer to the embedding: HF PLT model == Megatron PLT model (shared
    embedding/output weight, its gradient the sum of both uses) == brute force, loss and gradient."""
    tied_dir = make_tiny_llama(str(tmp_path), vocab_size=VOCAB, tie_word_embeddings=True)
    ref_loss, ref_grad = hf_plt_reference(tied_dir, batch, K)
    hf_loss, hf_grad = hf_plt_model_loss(tied_dir, batch, K)
    (mc, ) = spawn(mcore_loss, 1, tied_dir, batch, K, 'llama3_2_plt')
    print(f'tied PLT loss: hf model {hf_loss!r}, megatron {mc["loss"]!r}, brute force {ref_loss!r}')
    assert hf_loss == pytest.approx(ref_loss, rel=1e-5) and mc['loss'] == pytest.approx(ref_loss, rel=1e-5)
    torch.testing.assert_close(hf_grad, ref_grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(mc['emb_grad'], ref_grad, rtol=1e-4, atol=1e-6)
