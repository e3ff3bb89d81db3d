"""The PLT mcore-bridge GPTModel for real on CPU (tests/harness): loss and gradients against a brute-force PLT
reference built from plain transformers on the same HF weights (fp32), TP=2 and PP=2 over gloo against TP=PP=1,
and K=1 against the stock mcore-bridge GPT model."""
import pytest
import torch

from harness.dist import spawn
from harness.tiny import make_tiny_llama

# one worker under `pytest -n` (.ci/run): the module-scoped reference and Megatron runs are shared
pytestmark = pytest.mark.xdist_group('plt_model_cpu')

K = 4
S = 32
LENS = [32, 20]  # real lengths (multiples of K, as the template pads them); row 1 is padded to S
VOCAB = 512


def make_batch(seed=0):
    """A padded batch exactly as ms-swift's megatron collator + the PLT batch patch build it."""
    from swift_plt.patch_level.layout import mask_first_patch
    g = torch.Generator().manual_seed(seed)
    B = len(LENS)
    input_ids = torch.full((B, S), 3)  # pad id
    labels = torch.full((B, S), -100)
    position_ids = torch.zeros(B, S, dtype=torch.long)
    mask = torch.tril(torch.ones(B, S, S, dtype=torch.bool)).view(B, 1, S, S)
    for b, n in enumerate(LENS):
        ids = torch.randint(4, VOCAB, (n, ), generator=g)
        input_ids[b, :n] = ids
        labels[b, :n] = ids
        labels[b, :n][torch.rand(n, generator=g) < 0.15] = -100  # some ignored targets
        position_ids[b, :n] = torch.arange(n)
        mask[b, :, :, n:] = 0
    labels = mask_first_patch(labels, position_ids, K)
    return dict(input_ids=input_ids, labels=labels, position_ids=position_ids, attention_mask=~mask)


def hf_plt_reference(hf_dir, batch, k):
    """Brute force (swift_plt.patch_level.reference): each row on its own real tokens with plain transformers.
    Returns (loss, grad of the input embedding matrix)."""
    from transformers import LlamaForCausalLM

    from swift_plt.patch_level.reference import padded_batch_nll
    model = LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    model.zero_grad()
    nll, count = padded_batch_nll(model, batch['input_ids'], batch['labels'], LENS, k)
    loss = nll / count
    loss.backward()
    return float(loss), model.model.embed_tokens.weight.grad.clone()


def _mcore_loss(hf_dir, batch, k, model_type, backward):
    """Runs in each spawned rank: forward(+backward) through megatron's pipeline schedule, ms-swift's loss form."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from harness.model import build_mcore_model
    from swift_plt.plugin.register import register_mcore
    assert register_mcore()
    extra = {'patch_size': k} if model_type == 'llama3_2_plt' else None
    model = build_mcore_model(hf_dir, mcore_model_type=model_type, tp=_tp(), pp=_pp(), extra_config=extra)[0]
    labels = batch['labels']
    if k == 1:  # token-level: ms-swift rolls the labels (the PLT batch patch skips that only at K > 1)
        labels = torch.roll(labels, -1, dims=-1)

    def forward_step(data_iterator, model):
        data = next(data_iterator)
        output = model(input_ids=data['input_ids'], position_ids=data['position_ids'],
                       attention_mask=data['attention_mask'], labels=labels)

        def loss_func(output_tensor):  # ms-swift MegatronTrainer.loss_func, normalised here
            mask = labels != -100
            total = torch.sum(output_tensor.float() * mask)
            return total / mask.sum(), {'loss': torch.stack([total.detach(), mask.sum().float()])}

        return output, loss_func

    if backward:
        model.train()
    result = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=iter([batch]), model=[model], num_microbatches=1,
        seq_length=S, micro_batch_size=len(LENS), forward_only=not backward)
    out = {}
    if result:
        total, count = result[0]['loss']
        out['loss'] = float(total / count)
    if backward and model.pre_process:
        out['emb_grad'] = model.embedding.word_embeddings.weight.grad.clone()
    return out


def _tp():
    from megatron.core import parallel_state
    return parallel_state.get_tensor_model_parallel_world_size()


def _pp():
    from megatron.core import parallel_state
    return parallel_state.get_pipeline_model_parallel_world_size()


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
    (out, ) = spawn(_mcore_loss, 1, hf_dir, batch, K, 'llama3_2_plt', True)
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
    padding = (batch['input_ids'] != 3).long()  # 1 = real token (pad id 3 only in the padding here)
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


@pytest.mark.parametrize('tp, pp', [(2, 1), (1, 2)])
def test_plt_tp2_pp2_match_reference(hf_dir, batch, reference, tp, pp):
    outs = spawn(_mcore_loss, 2, hf_dir, batch, K, 'llama3_2_plt', True, tp=tp, pp=pp)
    losses = [o['loss'] for o in outs if 'loss' in o]
    assert losses and all(x == pytest.approx(reference[0], rel=1e-5) for x in losses)
    if tp == 2:  # vocab-sharded embedding gradients: concatenated they are the full one
        grad = torch.cat([o['emb_grad'] for o in outs])
        torch.testing.assert_close(grad[:VOCAB], reference[1], rtol=1e-4, atol=1e-6)


def test_k1_plt_model_is_stock_gpt_bit_for_bit(hf_dir, batch):
    """K=1 llama3_2_plt runs upstream code: same loss and gradient bits as mcore-bridge's stock GPT model."""
    (plt1, ) = spawn(_mcore_loss, 1, hf_dir, batch, 1, 'llama3_2_plt', True)
    (stock, ) = spawn(_mcore_loss, 1, hf_dir, batch, 1, 'gpt', True)
    assert plt1['loss'] == stock['loss']
    assert torch.equal(plt1['emb_grad'], stock['emb_grad'])


def test_backend_parity_tied_embeddings(tmp_path, batch):
    """Llama-3.2-1B/3B tie the output layer to the embedding: HF PLT model == Megatron PLT model (shared
    embedding/output weight, its gradient the sum of both uses) == brute force, loss and gradient."""
    tied_dir = make_tiny_llama(str(tmp_path), vocab_size=VOCAB, tie_word_embeddings=True)
    ref_loss, ref_grad = hf_plt_reference(tied_dir, batch, K)
    hf_loss, hf_grad = hf_plt_model_loss(tied_dir, batch, K)
    (mc, ) = spawn(_mcore_loss, 1, tied_dir, batch, K, 'llama3_2_plt', True)
    print(f'tied PLT loss: hf model {hf_loss!r}, megatron {mc["loss"]!r}, brute force {ref_loss!r}')
    assert hf_loss == pytest.approx(ref_loss, rel=1e-5) and mc['loss'] == pytest.approx(ref_loss, rel=1e-5)
    torch.testing.assert_close(hf_grad, ref_grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(mc['emb_grad'], ref_grad, rtol=1e-4, atol=1e-6)
