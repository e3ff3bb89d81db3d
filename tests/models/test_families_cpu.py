"""PLT on every structure of the mcore-bridge `gpt` families, for real on CPU (tests/harness), fp32: K=4 loss and
every gradient equal the brute-force PatchTrain formula on the family's own HF model; K=1 through PLT's model type is
the stock `gpt` model bit for bit."""
import pytest
import torch

from harness.dist import spawn
from harness.plt_cases import K, VOCAB, hf_plt_reference, make_batch, mcore_loss
from swift_plt.tools.tiny_families import make_tiny_family

pytestmark = pytest.mark.xdist_group('families_cpu')

DENSE = ['qwen2', 'qwen3']


@pytest.fixture(scope='module')
def batch():
    return make_batch()


@pytest.fixture(scope='module')
def family_dirs(tmp_path_factory):
    return {}


def family_dir(family_dirs, tmp_path_factory, family):
    if family not in family_dirs:
        family_dirs[family] = make_tiny_family(family, str(tmp_path_factory.mktemp(family)), vocab_size=VOCAB)
    return family_dirs[family]


def assert_grads_match(grads, ref, rtol=1e-4, atol=1e-6):
    missing = sorted(set(ref) - set(grads))
    assert not missing, f'no Megatron gradient for {missing}'
    for name, g in ref.items():
        torch.testing.assert_close(grads[name], g, rtol=rtol, atol=atol, msg=lambda m: f'{name}: {m}')


@pytest.mark.parametrize('family', DENSE)
def test_k4_loss_and_every_gradient_match_patchtrain(family, family_dirs, tmp_path_factory, batch):
    hf_dir = family_dir(family_dirs, tmp_path_factory, family)
    ref_loss, ref_grads = hf_plt_reference(hf_dir, batch)
    (out, ) = spawn(mcore_loss, 1, hf_dir, batch, K, 'gpt_plt', None, True)
    print(f'{family}: PLT loss megatron {out["loss"]!r}, brute force {ref_loss!r}; {len(ref_grads)} gradients')
    assert out['loss'] == pytest.approx(ref_loss, rel=1e-5)
    assert_grads_match(out['grads'], ref_grads)


@pytest.mark.parametrize('family', DENSE)
def test_k1_through_plt_model_type_is_stock_bit_for_bit(family, family_dirs, tmp_path_factory, batch):
    hf_dir = family_dir(family_dirs, tmp_path_factory, family)
    (plt1, ) = spawn(mcore_loss, 1, hf_dir, batch, 1, 'gpt_plt')
    (stock, ) = spawn(mcore_loss, 1, hf_dir, batch, 1, 'gpt')
    assert plt1['loss'] == stock['loss']
    assert torch.equal(plt1['emb_grad'], stock['emb_grad'])


@pytest.mark.parametrize('family', DENSE)
def test_tp2_equals_one_rank(family, family_dirs, tmp_path_factory, batch):
    hf_dir = family_dir(family_dirs, tmp_path_factory, family)
    (one, ) = spawn(mcore_loss, 1, hf_dir, batch, K, 'gpt_plt')
    outs = spawn(mcore_loss, 2, hf_dir, batch, K, 'gpt_plt', tp=2)
    assert all(o['loss'] == pytest.approx(one['loss'], rel=1e-6) for o in outs)
    grad = torch.cat([o['emb_grad'] for o in outs])
    torch.testing.assert_close(grad[:VOCAB], one['emb_grad'][:VOCAB], rtol=1e-5, atol=1e-7)
