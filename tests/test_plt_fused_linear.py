"""swift_plt.plt_fused_linear (fused LM head + PLT loss, chunked over rows) against the obvious reference: the full
fp32 logits and ``plt.patch_nll`` (itself checked here against a brute-force loop), values and the gradients of the
hidden states and the weight; the Triton path in Triton's interpreter (CPU) and on CUDA; the benchmark's CPU smoke
run."""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from swift_plt import plt
from swift_plt import plt_fused_linear as fl

IGN = -100
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_case(seed, N, H, V, K, dtype=torch.float32, p_ignore=0.25, device='cpu'):
    """hidden [N, H], weight [V, H] (scaled so logits are O(3)), targets [N, K] with some ignored, row 0 all
    ignored, and an upstream gradient [N, K] (any values, not only ones)."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=g)
    weight = torch.randn(V, H, generator=g) * (3.0 / math.sqrt(H))
    targets = torch.randint(0, V, (N, K), generator=g)
    targets[torch.rand(N, K, generator=g) < p_ignore] = IGN
    targets[0] = IGN
    up = torch.rand(N, K, generator=g) + 0.5
    return hidden.to(device, dtype), weight.to(device, dtype), targets.to(device), up.to(device)


def reference(hidden, weight, targets, up):
    """Full fp32 logits + plt.patch_nll (torch): loss [N, K] and fp32 grads of (loss * up).sum()."""
    h = hidden.detach().float().requires_grad_(True)
    w = weight.detach().float().requires_grad_(True)
    loss = plt.patch_nll((h @ w.t()).unsqueeze(1), targets.unsqueeze(1), impl='torch').squeeze(1)
    (loss * up).sum().backward()
    return loss.detach(), h.grad, w.grad


def fused(hidden, weight, targets, up, **kw):
    h = hidden.detach().clone().requires_grad_(True)
    w = weight.detach().clone().requires_grad_(True)
    loss = fl.fused_linear_patch_nll(h, w, targets, **kw)
    (loss * up).sum().backward()
    return loss.detach(), h.grad, w.grad


def scale(x):
    return x.float().abs().max().item()


def assert_matches(got, ref, rtol=1e-5, atol=1e-5, grad_tol=None):
    (gl, gh, gw), (rl, rh, rw) = got, ref
    assert gl.dtype == torch.float32
    torch.testing.assert_close(gl, rl, rtol=rtol, atol=atol)
    gt = grad_tol or dict(rtol=rtol, atol=atol)
    torch.testing.assert_close(gh.float(), rh, **gt)
    torch.testing.assert_close(gw.float(), rw, **gt)


def test_reference_matches_brute_force_loop():
    hidden, weight, targets, up = make_case(0, N=6, H=5, V=11, K=3)
    ref_l = reference(hidden, weight, targets, up)[0]
    logits = hidden.double() @ weight.double().t()
    for i in range(6):
        for k in range(3):
            t = int(targets[i, k])
            want = 0.0 if t == IGN else -torch.log_softmax(logits[i], -1)[t].item()
            assert abs(ref_l[i, k].item() - want) < 1e-5
    got_l = fl.fused_linear_patch_nll(hidden, weight, targets, chunk_rows=4)
    torch.testing.assert_close(got_l, ref_l, rtol=1e-5, atol=1e-5)


SPLITS = ['rows', 'vocab']


@pytest.mark.parametrize('split', SPLITS)
@pytest.mark.parametrize('K', [1, 2, 4, 8])
@pytest.mark.parametrize('chunk_rows', [1, 4, 13, 100, None])
def test_fp32_values_and_grads(K, chunk_rows, split):
    # N = 13 (not a multiple of 4), V = 37 (odd); chunk_rows 13 = N (one chunk), 100 > N, None = auto (one chunk);
    # vocab split: blocks of 2, 11, 37, 37, 37 columns
    case = make_case(K, N=13, H=16, V=37, K=K)
    assert_matches(fused(*case, chunk_rows=chunk_rows, impl='torch', backward_split=split), reference(*case))


@pytest.mark.parametrize('split', SPLITS)
def test_bf16_against_fp32_reference_and_unfused_bf16(split):
    """bf16 hidden/weight: the chunk logits are rounded to bf16 (as the unfused path's are), grad_logits too.
    Stated tolerance: loss within 0.03 abs + 1% of the fp32 reference on the same bf16 inputs; gradients within
    3% + 0.02 of the gradient's scale. Against the unfused bf16 path (bf16 logits + patch_nll) the loss is the
    same up to fp32 summation order."""
    hidden, weight, targets, up = make_case(3, N=45, H=64, V=301, K=4, dtype=torch.bfloat16)
    got = fused(hidden, weight, targets, up, chunk_rows=8, impl='torch', backward_split=split)
    ref = reference(hidden, weight, targets, up)
    gscale = dict(h=ref[1].abs().max().item(), w=ref[2].abs().max().item())
    torch.testing.assert_close(got[0], ref[0], rtol=1e-2, atol=3e-2)
    torch.testing.assert_close(got[1].float(), ref[1], rtol=3e-2, atol=2e-2 * gscale['h'])
    torch.testing.assert_close(got[2].float(), ref[2], rtol=3e-2, atol=2e-2 * gscale['w'])
    assert got[1].dtype == got[2].dtype == torch.bfloat16
    unfused = plt.patch_nll((hidden @ weight.t()).unsqueeze(1), targets.unsqueeze(1), impl='torch').squeeze(1)
    torch.testing.assert_close(got[0], unfused, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize('split,acc', [('rows', 2), ('vocab', 1)])
def test_bf16_accumulation_fp32_vs_bf16(split, acc):
    """Many chunks: fp32 accumulation of the accumulated gradient (grad_W for the row split, grad_hidden for the
    vocab split) is closer to the reference than accumulation in bf16."""
    hidden, weight, targets, up = make_case(4, N=64, H=32, V=97, K=2, dtype=torch.bfloat16)
    ref = reference(hidden, weight, targets, up)[acc]
    kw = dict(chunk_rows=2, impl='torch', backward_split=split)
    g32 = fused(hidden, weight, targets, up, accum_fp32=True, **kw)[acc].float()
    g16 = fused(hidden, weight, targets, up, accum_fp32=False, **kw)[acc].float()
    err32, err16 = (g32 - ref).abs().max().item(), (g16 - ref).abs().max().item()
    assert err32 < err16 and err32 < 0.02 * ref.abs().max().item()


def test_add_matmul_accumulates_into_fp32():
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(7, 5, generator=g).bfloat16(), torch.randn(5, 3, generator=g).bfloat16()
    acc = torch.randn(7, 3, generator=g)
    want = acc + a.float() @ b.float()
    fl.add_matmul_(acc, a, b)
    assert acc.dtype == torch.float32
    torch.testing.assert_close(acc, want, rtol=1e-2, atol=1e-2)
    acc16 = torch.zeros(7, 3, dtype=torch.bfloat16)
    fl.add_matmul_(acc16, a, b)
    fl.add_matmul_(acc16, a, b)
    torch.testing.assert_close(acc16.float(), 2 * (a.float() @ b.float()), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize('split', SPLITS)
def test_ignored_rows_zero_loss_and_grad(split):
    hidden, weight, targets, up = make_case(6, N=9, H=8, V=21, K=4)
    targets[3:5] = IGN
    loss, gh, gw = fused(hidden, weight, targets, up, chunk_rows=2, backward_split=split)
    assert torch.all(loss[targets == IGN] == 0) and torch.all(gh[3:5] == 0) and torch.all(gh[0] == 0)
    assert_matches((loss, gh, gw), reference(hidden, weight, targets, up))
    everything = torch.full_like(targets, IGN)
    loss, gh, gw = fused(hidden, weight, everything, up, chunk_rows=4, backward_split=split)
    assert torch.all(loss == 0) and torch.all(gh == 0) and torch.all(gw == 0)


def test_custom_ignore_index_and_leading_dims():
    hidden, weight, targets, up = make_case(7, N=12, H=8, V=30, K=2)
    ref = reference(hidden, weight, targets, up)
    marked = targets.masked_fill(targets == IGN, 5)  # 5 is also a vocabulary id: those targets are ignored too
    ref5 = reference(hidden, weight, marked.masked_fill(marked == 5, IGN), up)
    assert_matches(fused(hidden, weight, marked, up, ignore_index=5, chunk_rows=5), ref5)
    # [P, B, H] (Megatron layout) -> [P, B, K], the same numbers as the flat rows
    got = fl.fused_linear_patch_nll(hidden.view(4, 3, 8), weight, targets.view(4, 3, 2), chunk_rows=5)
    assert got.shape == (4, 3, 2)
    torch.testing.assert_close(got.view(12, 2), ref[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('split', SPLITS)
def test_frozen_weight_or_hidden(split):
    hidden, weight, targets, up = make_case(8, N=10, H=8, V=25, K=3)
    _, ref_h, ref_w = reference(hidden, weight, targets, up)
    h = hidden.clone().requires_grad_(True)
    (fl.fused_linear_patch_nll(h, weight, targets, chunk_rows=3, backward_split=split) * up).sum().backward()
    torch.testing.assert_close(h.grad, ref_h, rtol=1e-5, atol=1e-5)
    w = weight.clone().requires_grad_(True)
    (fl.fused_linear_patch_nll(hidden, w, targets, chunk_rows=3, backward_split=split) * up).sum().backward()
    torch.testing.assert_close(w.grad, ref_w, rtol=1e-5, atol=1e-5)


def test_bad_targets_raise_value_error():
    hidden, weight, targets, _ = make_case(9, N=5, H=4, V=10, K=2)
    for bad in (10, -1, -7):
        t = targets.clone()
        t[2, 1] = bad
        with pytest.raises(ValueError, match=f'target id {bad} is outside the vocabulary'):
            fl.fused_linear_patch_nll(hidden, weight, t)
        fl.fused_linear_patch_nll(hidden, weight, t, check_targets=False)  # no check: no error, no fault
    with pytest.raises(ValueError, match='target id -100'):  # -100 is not ignored when ignore_index is another id
        fl.fused_linear_patch_nll(hidden, weight, targets, ignore_index=-1)
    with pytest.raises(ValueError, match='do not match'):
        fl.fused_linear_patch_nll(hidden, weight[:, :3], targets)
    with pytest.raises(ValueError, match='leading dims'):
        fl.fused_linear_patch_nll(hidden, weight, targets[:4])
    with pytest.raises(ValueError, match='impl'):
        fl.fused_linear_patch_nll(hidden, weight, targets, impl='cuda')
    with pytest.raises(ValueError, match='backward_split'):
        fl.fused_linear_patch_nll(hidden, weight, targets, backward_split='cols')


def test_chunks_bound_the_logits(monkeypatch):
    """Every [rows, V] logits tensor the forward and backward touch has at most chunk_rows rows, and the chunks
    cover all N rows once per pass: the full logits are never formed."""
    seen = []
    stats, grad = fl._CHUNK_FNS['torch']

    def rec_stats(logits, t):
        seen.append(('fwd', logits.shape[0]))
        return stats(logits, t)

    def rec_grad(logits, lse, t, g, vocab_start=0):
        seen.append(('bwd', (*logits.shape, vocab_start)))
        return grad(logits, lse, t, g, vocab_start)

    monkeypatch.setitem(fl._CHUNK_FNS, 'torch', (rec_stats, rec_grad))
    case = make_case(10, N=23, H=8, V=19, K=2)
    fused(*case, chunk_rows=5, impl='torch')
    assert [r for p, r in seen if p == 'fwd'] == [5, 5, 5, 5, 3]
    assert [r for p, r in seen if p == 'bwd'] == [(5, 19, 0)] * 4 + [(3, 19, 0)]
    seen.clear()
    fused(*case, chunk_rows=5, impl='torch', backward_split='vocab')  # blocks of 5 * 19 // 23 = 4 columns
    assert [r for p, r in seen if p == 'bwd'] == [(23, 4, 0), (23, 4, 4), (23, 4, 8), (23, 4, 12), (23, 3, 16)]


def test_auto_chunk_rows():
    assert fl.auto_chunk_rows(128256) == 512  # 523 rows of fp32 logits fit 256 MiB -> multiple of 64
    assert fl.auto_chunk_rows(64) == 2**20  # 256 MiB / 256 B per row: already a multiple of 64
    assert fl.auto_chunk_rows(50) == 1342144  # 1342177 rounded down to a multiple of 64
    assert fl.auto_chunk_rows(10**9) == 1
    assert fl.auto_chunk_rows(2 * 2**20) == 32  # below 64 rows: not rounded
    assert fl.row_chunks(7, 3) == [(0, 3), (3, 6), (6, 7)] and fl.row_chunks(0, 3) == []
    assert fl.vocab_block_cols(2048, 128256, 512) == 32064 and fl.vocab_block_cols(8, 10, 100) == 10
    assert fl.vocab_block_cols(1000, 10, 1) == 1


# ---- Triton path: the interpreter on CPU (conftest sets TRITON_INTERPRET=1 without CUDA), the compiler on CUDA ----

def triton_runnable():
    from swift_plt.plt_triton import triton_available
    return triton_available() and (torch.cuda.is_available() or os.environ.get('TRITON_INTERPRET') == '1')


@pytest.mark.skipif(not triton_runnable(), reason='needs triton (and a GPU or TRITON_INTERPRET=1)')
@pytest.mark.parametrize('split', SPLITS)
@pytest.mark.parametrize('K', [1, 4])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_triton_matches_torch_small_blocks(monkeypatch, K, dtype, split):
    from swift_plt import plt_triton
    monkeypatch.setattr(plt_triton, 'BLOCK_FWD', 16)  # V = 37: several blocks and a partial one
    monkeypatch.setattr(plt_triton, 'BLOCK_BWD', 16)
    dev = 'cuda' if torch.cuda.is_available() and os.environ.get('TRITON_INTERPRET') != '1' else 'cpu'
    case = make_case(11 + K, N=11, H=16, V=37, K=K, dtype=dtype, device=dev)
    got = fused(*case, chunk_rows=4, impl='triton', backward_split=split)  # vocab split: 13-column blocks
    want = fused(*case, chunk_rows=4, impl='torch', backward_split=split)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    for i in (1, 2):  # bf16: grad_logits may round one ulp apart (other fp32 op order): 1% of the gradient's scale
        tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2 * scale(want[i]))
        torch.testing.assert_close(got[i].float(), want[i].float(), **tol)
    if dtype == torch.float32:
        assert_matches(got, reference(*case), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
@pytest.mark.parametrize('split', SPLITS)
def test_cuda_triton_matches_torch_and_reference(split):
    """Real shapes on a GPU: impl='triton' against impl='torch' (bf16, several chunks) and the fp32 reference."""
    assert fl.resolve_impl(None, torch.device('cuda')) == 'triton'
    case = make_case(12, N=1000, H=256, V=32003, K=4, dtype=torch.bfloat16, device='cuda')
    got = fused(*case, chunk_rows=300, impl=None, backward_split=split)
    want = fused(*case, chunk_rows=300, impl='torch', backward_split=split)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got[1].float(), want[1].float(), rtol=1e-2, atol=1e-3 * want[1].abs().max().item())
    torch.testing.assert_close(got[2].float(), want[2].float(), rtol=1e-2, atol=1e-3 * want[2].abs().max().item())
    ref = reference(*case)
    torch.testing.assert_close(got[0], ref[0], rtol=1e-2, atol=3e-2)
    torch.testing.assert_close(got[2].float(), ref[2], rtol=3e-2, atol=2e-2 * ref[2].abs().max().item())


def test_benchmark_cpu_smoke(tmp_path):
    out = tmp_path / 'bench.json'
    cmd = [sys.executable, os.path.join(REPO, 'benchmarks', 'fused_linear_plt_bench.py'), '--device', 'cpu', '--N',
           '24', '--H', '16', '--V', '101', '--K', '4', '--chunk_rows', '7', '--warmup', '1', '--iters', '2', '--json',
           str(out)]
    env = dict(os.environ, PYTHONPATH='')  # the script must find swift_plt from the repo by itself
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=str(tmp_path), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert 'ratio time fused/unfused = ' in res.stdout
    assert 'ratio peak extra memory fused/unfused = n/a' in res.stdout  # no memory numbers on CPU
    data = json.loads(out.read_text())
    assert data['rows']['fused']['fwd_bwd_ms_median'] > 0 and data['config']['N'] == 24
    assert data["max_abs_loss_diff_fused_vs_unfused"] < 1e-4  # same bf16 logits, other fp32 summation order
    for key, d in data['max_rel_grad_diff_vs_unfused'].items():  # bf16 gradients: a few roundings apart
        assert d['hidden'] < 0.03 and d['weight'] < 0.03, (key, d)
    assert set(data['rows']) == {'unfused', 'fused', 'fused_bf16acc', 'fused_vocab', 'torch_ce_k1', 'fused_k1'}
