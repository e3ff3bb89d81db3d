"""The fused Triton PLT loss (swift_plt.patch_level.loss_triton) against the torch reference (swift_plt.patch_level.loss._PatchCrossEntropy),
run on CPU in Triton's interpreter (TRITON_INTERPRET=1). Skipped when triton is not importable. The same checks on
real shapes on a GPU: tests/gpu/plt_triton_check.py."""
import os

os.environ.setdefault('TRITON_INTERPRET', '1')  # before the kernels are built (lazily, on first use)

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip('triton')

from harness.dist import free_port  # noqa: E402
from swift_plt.patch_level import loss as patch_loss  # noqa: E402
from swift_plt.patch_level import loss_triton  # noqa: E402

IGN = -100
pytestmark = pytest.mark.skipif(os.environ.get('TRITON_INTERPRET') != '1' and not torch.cuda.is_available(),
                                reason='needs TRITON_INTERPRET=1 or a GPU')
DEV = 'cuda' if torch.cuda.is_available() and os.environ.get('TRITON_INTERPRET') != '1' else 'cpu'


def make_case(seed, P, B, V, K, p_ignore=0.2, dtype=torch.bfloat16, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(P, B, V, generator=g) * scale).to(dtype)
    labels = torch.randint(0, V, (B, P * K), generator=g)
    labels[torch.rand(B, P * K, generator=g) < p_ignore] = IGN
    labels[:, :K] = IGN
    return logits.to(DEV), labels.to(DEV)


def run(impl, logits, labels, K, grad_w, block_fwd=None, block_bwd=None, **kw):
    """losses and logits.grad through plt_token_losses; block_fwd/_bwd: the kernels' vocab blocks (module globals)."""
    saved = loss_triton.BLOCK_FWD, loss_triton.BLOCK_BWD
    loss_triton.BLOCK_FWD, loss_triton.BLOCK_BWD = block_fwd or saved[0], block_bwd or saved[1]
    try:
        x = logits.clone().requires_grad_(True)
        losses = patch_loss.plt_token_losses(x, labels, K, impl=impl, **kw)
        (losses * grad_w).sum().backward()
    finally:
        loss_triton.BLOCK_FWD, loss_triton.BLOCK_BWD = saved
    return losses.detach(), x.grad


def check(logits, labels, K, seed=0, **kw):
    g = torch.Generator().manual_seed(seed + 1)
    grad_w = torch.rand(labels.shape, generator=g).to(labels.device)  # any upstream gradient, not only ones
    ref_l, ref_g = run('torch', logits, labels, K, grad_w)
    got_l, got_g = run('triton', logits, labels, K, grad_w, **kw)
    assert got_l.dtype == torch.float32 and got_g.dtype == logits.dtype
    torch.testing.assert_close(got_l, ref_l, rtol=1e-5, atol=1e-5)
    # both write the gradient in the logits' dtype from an fp32 value: allow one bf16 rounding step
    tol = dict(rtol=1e-2, atol=1e-5) if logits.dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(got_g.float(), ref_g.float(), **tol)
    assert torch.all(got_l[labels == IGN] == 0)
    return got_l, got_g


@pytest.mark.parametrize('K', [1, 2, 4, 8])
def test_triton_matches_reference_ignored_labels(K):
    # V not a multiple of the block (blocks of 32 and 64 -> several blocks + a partial one), P*B odd
    logits, labels = make_case(K, P=5, B=3, V=203, K=K)
    check(logits, labels, K, seed=K, block_fwd=32, block_bwd=64)


@pytest.mark.parametrize('V', [1, 7, 64, 65, 130])
def test_triton_odd_vocab_sizes_default_blocks(V):
    logits, labels = make_case(V, P=3, B=1, V=V, K=4)
    check(logits, labels, 4)
    logits, labels = make_case(V + 1, P=3, B=1, V=V, K=3)
    check(logits, labels, 3, block_fwd=16, block_bwd=16)


def test_triton_fp32_logits_and_extreme_values():
    logits, labels = make_case(3, P=4, B=2, V=50, K=2, dtype=torch.float32, scale=30.0)
    logits[0, 0, 7] = 1e4  # one dominating logit, and very negative ones
    logits[1, 1] = -1e4
    check(logits, labels, 2, block_fwd=16, block_bwd=16)


def test_triton_all_ignored_zero_loss_zero_grad():
    logits, _ = make_case(0, P=3, B=2, V=40, K=4)
    labels = torch.full((2, 12), IGN, device=DEV)
    got_l, got_g = check(logits, labels, 4, block_fwd=16)
    assert torch.all(got_l == 0) and torch.all(got_g == 0)


def test_triton_noncontiguous_logits():
    base, labels = make_case(5, P=4, B=3, V=37, K=2)
    logits = base.transpose(0, 1).contiguous().transpose(0, 1)  # [P, B, V] view with B-major storage
    assert not logits.is_contiguous()
    check(logits, labels, 2, block_fwd=16, block_bwd=16)


def test_triton_inplace_grad_writes_into_logits_storage():
    logits, labels = make_case(6, P=4, B=2, V=45, K=4)
    grad_w = torch.ones(labels.shape, device=labels.device)
    _, ref_g = run('torch', logits, labels, 4, grad_w)
    leaf = logits.clone().requires_grad_(True)
    act = leaf * 1  # an activation no autograd node keeps (like the output layer's output)
    losses = patch_loss.plt_token_losses(act, labels, 4, impl='triton', inplace_grad=True)
    seen = {}
    act.register_hook(lambda g: seen.__setitem__('ptr', g.data_ptr()))
    losses.sum().backward()
    assert seen['ptr'] == act.data_ptr()  # the gradient lives in the logits' storage
    torch.testing.assert_close(leaf.grad.float(), ref_g.float(), rtol=1e-2, atol=1e-5)
    # without inplace_grad the caller's logits are left untouched
    x = logits.clone().requires_grad_(True)
    patch_loss.plt_token_losses(x, labels, 4, impl='triton').sum().backward()
    assert torch.equal(x.detach(), logits)


def test_dispatch_and_opt_out(monkeypatch):
    cpu = torch.zeros(2, 1, 5)
    assert not patch_loss.fused_loss_enabled(cpu)  # CPU: torch reference
    with pytest.raises(ValueError, match='impl'):
        patch_loss.plt_token_losses(torch.zeros(2, 1, 5), torch.zeros(1, 4, dtype=torch.long), 2, impl='cuda')
    if torch.cuda.is_available():
        x = torch.zeros(2, 1, 5, device='cuda')
        assert patch_loss.fused_loss_enabled(x)
        monkeypatch.setenv('SWIFT_PLT_FUSED_LOSS', '0')
        assert not patch_loss.fused_loss_enabled(x)


def test_auto_dispatch_uses_triton_on_cuda(monkeypatch):
    """impl=None picks the kernel exactly when fused_loss_enabled says so (mocked: no GPU needed)."""
    calls = []
    real = loss_triton.patch_cross_entropy_triton
    monkeypatch.setattr(loss_triton, 'patch_cross_entropy_triton', lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(patch_loss, 'fused_loss_enabled', lambda logits: True)
    logits, labels = make_case(1, P=3, B=1, V=20, K=2)
    patch_loss.plt_token_losses(logits, labels, 2)
    assert calls == [1]
    monkeypatch.setattr(patch_loss, 'fused_loss_enabled', lambda logits: False)
    patch_loss.plt_token_losses(logits, labels, 2)
    assert calls == [1]


# ---- vocab-parallel: 2 gloo ranks, each runs the kernel on its vocab slice (interpreter) ----


def _tp_worker(rank, world, port, logits_full, labels, grad_w, k, queue):
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), TRITON_INTERPRET='1')
    torch.distributed.init_process_group('gloo', rank=rank, world_size=world)
    try:
        vl = logits_full.shape[-1] // world
        shard = logits_full[..., rank * vl:(rank + 1) * vl].clone().requires_grad_(True)
        losses = patch_loss.plt_token_losses(shard, labels, k, vocab_start=rank * vl, group=torch.distributed.group.WORLD,
                                      impl='triton')
        (losses * grad_w).sum().backward()
        # numpy arrays are pickled by value: torch tensors would travel through shared memory, which is gone if this
        # process exits before the parent reads them (seen as ConnectionResetError / FileNotFoundError)
        queue.put((rank, losses.detach().numpy(), shard.grad.numpy()))
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.skipif(DEV != 'cpu', reason='gloo ranks on CPU tensors (interpreter)')
def test_triton_vocab_parallel_matches_reference():
    world, k = 2, 4
    # rank 1's slice holds the largest logits of some rows, rank 0's of others: the MAX all-reduce matters
    logits, labels = make_case(11, P=5, B=3, V=2 * 41, K=k, dtype=torch.float32, scale=5.0)
    logits[0, :, 50] += 40.0
    logits[1, :, 3] += 40.0
    grad_w = torch.rand(labels.shape, generator=torch.Generator().manual_seed(3))
    ref_l, ref_g = run('torch', logits, labels, k, grad_w)
    ctx = torch.multiprocessing.get_context('spawn')
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_tp_worker, args=(r, world, port, logits, labels, grad_w, k, queue)) for r in range(world)]
    for p in procs:
        p.start()
    res = dict((r, (torch.from_numpy(l), torch.from_numpy(g))) for r, l, g in (queue.get(timeout=300) for _ in procs))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    vl = logits.shape[-1] // world
    for r in range(world):
        torch.testing.assert_close(res[r][0], ref_l, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(res[r][1], ref_g[..., r * vl:(r + 1) * vl], rtol=1e-5, atol=1e-7)
