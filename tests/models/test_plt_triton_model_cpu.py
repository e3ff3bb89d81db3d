"""The fused Triton PLT loss inside the real Megatron PLT model (PLTGPTModel.compute_language_model_loss, which asks
for the in-place gradient), on CPU in Triton's interpreter: loss and input-embedding gradient equal the brute-force
PatchTrain reference, with tied embeddings (the output layer's weight is the embedding) and at TP=2 (vocab-parallel
kernel, the same all-reduces). Skipped when triton is not importable."""
import os

os.environ.setdefault('TRITON_INTERPRET', '1')  # inherited by the spawned ranks: must be set before triton's import

import pytest  # noqa: E402
import torch

pytest.importorskip('triton')
pytestmark = pytest.mark.skipif(os.environ.get('TRITON_INTERPRET') != '1', reason='needs TRITON_INTERPRET=1')

from harness.dist import spawn  # noqa: E402
from harness.tiny import make_tiny_llama  # noqa: E402
from harness.plt_cases import K, VOCAB, make_batch  # noqa: E402
from test_plt_model_cpu import hf_plt_reference  # noqa: E402


def _mcore_loss_triton(hf_dir, batch, k, model_type):
    """In a spawned rank: force the kernel (interpreter) and record how the model calls it."""
    assert os.environ.get('TRITON_INTERPRET') == '1'
    from swift_plt.patch_level import loss as patch_loss, loss_triton
    calls = []
    real = loss_triton.patch_cross_entropy_triton

    def spy(logits, target, vocab_start, group, inplace_grad):
        calls.append({'inplace_grad': inplace_grad, 'vocab_start': vocab_start, 'group': group is not None,
                      'non_leaf': logits.grad_fn is not None})
        return real(logits, target, vocab_start, group, inplace_grad)

    loss_triton.patch_cross_entropy_triton = spy
    patch_loss.fused_loss_enabled = lambda logits: True  # as on CUDA
    from harness.plt_cases import mcore_loss
    out = mcore_loss(hf_dir, batch, k, model_type)
    out['calls'] = calls
    return out


@pytest.fixture(scope='module')
def tied_dir(tmp_path_factory):
    return make_tiny_llama(str(tmp_path_factory.mktemp('tiny_tied')), vocab_size=VOCAB, tie_word_embeddings=True)


@pytest.fixture(scope='module')
def batch():
    return make_batch()


@pytest.fixture(scope='module')
def reference(tied_dir, batch):
    return hf_plt_reference(tied_dir, batch, K)


def test_kernel_in_model_in_place_grad_tied(tied_dir, batch, reference):
    (out, ) = spawn(_mcore_loss_triton, 1, tied_dir, batch, K, 'llama3_2_plt')
    assert out['calls'] == [{'inplace_grad': True, 'vocab_start': 0, 'group': False, 'non_leaf': True}]
    assert out['loss'] == pytest.approx(reference[0], rel=1e-5)
    torch.testing.assert_close(out['emb_grad'], reference[1], rtol=1e-4, atol=1e-6)


def test_kernel_in_model_tp2(tied_dir, batch, reference):
    outs = spawn(_mcore_loss_triton, 2, tied_dir, batch, K, 'llama3_2_plt', tp=2, pp=1)
    assert sorted(c['vocab_start'] for o in outs for c in o['calls']) == [0, VOCAB // 2]
    assert all(c['group'] and c['inplace_grad'] for o in outs for c in o['calls'])
    assert all(o['loss'] == pytest.approx(reference[0], rel=1e-5) for o in outs)
    grad = torch.cat([o['emb_grad'] for o in outs])  # vocab-sharded embedding (and tied output layer)
    torch.testing.assert_close(grad[:VOCAB], reference[1], rtol=1e-4, atol=1e-6)
