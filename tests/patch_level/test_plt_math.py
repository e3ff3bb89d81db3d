"""swift_plt.patch_level against brute-force references written the obvious way, on random inputs."""
import io
import os

import pytest
import torch

from harness.dist import free_port
from swift_plt.patch_level import layout as patch_layout, loss as patch_loss
from swift_plt.patch_level.reference import patchtrain_loss, reference_loss

IGN = -100


def brute_pool(x, k):  # [S, B, H] -> [P, B, H], one patch at a time
    return torch.stack([sum(x[p * k + j] for j in range(k)) / k for p in range(x.shape[0] // k)])


def brute_patch_mask(seq_lens, S, k):  # True = masked, from the definition (causal over patches + padding)
    P = S // k
    m = torch.zeros(len(seq_lens), 1, P, P, dtype=torch.bool)
    for b, n in enumerate(seq_lens):
        for i in range(P):
            for j in range(P):
                has_real_token = j * k < n
                m[b, 0, i, j] = j > i or not has_real_token
    return m


def swift_token_mask(seq_lens, S):  # what ms-swift's collator builds for padded megatron batches
    m = torch.tril(torch.ones(len(seq_lens), S, S, dtype=torch.bool)).view(len(seq_lens), 1, S, S)
    for i, n in enumerate(seq_lens):
        m[i, :, :, n:] = 0
    return ~m


def plt_mean_loss(logits_bpv, labels, k):
    losses = patch_loss.plt_token_losses(logits_bpv.transpose(0, 1).contiguous(), labels, k)
    mask = labels != IGN
    return (losses * mask).sum() / mask.sum(), losses


@pytest.mark.parametrize('k', [1, 2, 4])
def test_pool_patches(k):
    x = torch.randn(4 * k * 3, 2, 5)
    torch.testing.assert_close(patch_layout.pool_patches(x, k), brute_pool(x, k))
    with pytest.raises(ValueError, match='not a multiple'):
        patch_layout.pool_patches(torch.randn(9, 2, 5), 4)


def test_patch_positions_and_alignment():
    k = 4
    # padded batch: two rows, documents of 8 and 4 tokens (already padded to multiples of K), 0-padded to 12
    pos = torch.tensor([list(range(8)) + [0] * 4, list(range(4)) + [0] * 8])
    assert patch_layout.patch_position_ids(pos, k).tolist() == [[0, 1, 0], [0, 0, 0]]
    patch_layout.check_patch_aligned(pos, k)
    # packed row: documents of 8, 4, 12 tokens + 8 pad tokens (position 0 each) -> patch docs 2, 1, 3, then 1,1
    packed = torch.tensor([list(range(8)) + list(range(4)) + list(range(12)) + [0] * 8])
    pp = patch_layout.patch_position_ids(packed, k)
    assert pp.tolist() == [[0, 1, 0, 0, 1, 2, 0, 0]]
    patch_layout.check_patch_aligned(packed, k)
    assert patch_layout.patch_cu_seqlens(pp).tolist() == [0, 2, 3, 6, 7, 8]
    # brute force cu_seqlens on random packings
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        docs = [int(x) * k for x in torch.randint(1, 5, (int(torch.randint(1, 5, (1, ), generator=g)), ), generator=g)]
        row = torch.tensor([sum((list(range(d)) for d in docs), [])])
        cu = [0]
        for d in docs:
            cu.append(cu[-1] + d // k)
        assert patch_layout.patch_cu_seqlens(patch_layout.patch_position_ids(row, k)).tolist() == cu


@pytest.mark.parametrize('bad', [
    list(range(6)) + list(range(6)),  # doc of 6 tokens: patch 2 = [4, 5, 0, 1]
    list(range(7)) + [0] + list(range(4)),  # doc of 7 then a doc: patch 2 = [4, 5, 6, 0]
    [0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 0, 0],  # 12 = 4 + 6 + 2
])
def test_check_patch_aligned_rejects_straddling(bad):
    with pytest.raises(ValueError, match='straddles two documents'):
        patch_layout.check_patch_aligned(torch.tensor([bad]), 4)


def test_check_patch_aligned_rejects_length():
    with pytest.raises(ValueError, match='not a multiple of patch_size 4'):
        patch_layout.check_patch_aligned(torch.arange(10)[None], 4)


def brute_patches_aligned(rows, k):  # the rule, patch by patch
    for row in rows:
        if len(row) % k:
            return False
        for p in range(len(row) // k):
            x = row[p * k:(p + 1) * k]
            document = x[0] % k == 0 and all(x[j] == x[0] + j for j in range(k))
            pad = all(v == 0 for v in x)
            if not (document or pad):
                return False
    return True


def random_position_rows(rng, k):
    """Packed rows of documents (aligned: whole patches, or not), pad documents (position 0), and point edits."""
    rows = []
    P = rng.randint(1, 6)
    for _ in range(rng.randint(1, 3)):
        r = []
        while len(r) < P * k:
            n = rng.randint(1, 3) * k if rng.random() < 0.7 else rng.randint(1, 3 * k)
            r += [0] * n if rng.random() < 0.3 else list(range(n))
        r = r[:P * k]
        if rng.random() < 0.3:
            i = rng.randrange(len(r))
            r[i] = rng.choice([0, 1, k - 1, k, k + 1, r[i] + 1, r[i] - 1, -k, -1])
        rows.append(r)
    return rows


def test_check_patch_aligned_and_mask_first_patch_match_brute_force():
    import random
    rng = random.Random(0)
    seen = {True: 0, False: 0}
    for _ in range(1500):
        k = rng.choice([1, 2, 3, 4, 8])
        rows = random_position_rows(rng, k)
        want = brute_patches_aligned(rows, k)
        seen[want] += 1
        pos = torch.tensor(rows)
        for got in (patch_layout.patches_aligned(pos.view(len(rows), -1, k), k),  # torch (the device path)
                    patch_layout.patches_aligned(pos.numpy().reshape(len(rows), -1, k), k)):  # numpy (the CPU path)
            assert got == want, (k, rows)
        if want:
            patch_layout.check_patch_aligned(pos, k)
        else:
            with pytest.raises(ValueError, match='straddles two documents'):
                patch_layout.check_patch_aligned(pos, k)
        labels = torch.randint(0, 50, pos.shape)
        expected = [[IGN if p < k else int(y) for p, y in zip(pr, yr)] for pr, yr in zip(rows, labels.tolist())]
        got = patch_layout.mask_first_patch(labels, pos, k)
        assert got.dtype == labels.dtype and got.tolist() == expected
        assert labels.masked_fill(pos < k, IGN).tolist() == expected  # the device path's formula
    assert min(seen.values()) > 300, seen  # both outcomes well covered


@pytest.mark.parametrize('k', [2, 4])
def test_patch_attention_mask_padded(k):
    S = 6 * k
    seq_lens = [S, 3 * k, 2 * k - 1, 1]  # real lengths before padding to S
    got = patch_layout.patch_attention_mask(swift_token_mask(seq_lens, S), k)
    assert torch.equal(got, brute_patch_mask(seq_lens, S, k))


def test_mask_first_patch():
    k = 3
    pos = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 1, 2, 0, 0, 0]])
    labels = torch.arange(12)[None] + 10
    out = patch_layout.mask_first_patch(labels, pos, k)
    expected = [IGN if int(p) < k else int(y) for p, y in zip(pos[0], labels[0])]
    assert out[0].tolist() == expected


@pytest.mark.parametrize('k', [1, 2, 4])
def test_loss_equals_patchtrain_without_ignored_labels(k):
    torch.manual_seed(k)
    B, P, V = 3, 5, 11
    logits = torch.randn(B, P, V, dtype=torch.float64)
    labels = torch.randint(0, V, (B, P * k))
    labels[:, :k] = IGN  # first patch: nothing predicts it (mask_first_patch)
    got, _ = plt_mean_loss(logits, labels, k)
    torch.testing.assert_close(got.double(), patchtrain_loss(logits, labels, k), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got.double(), reference_loss(logits, labels, k), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('seed', range(5))
def test_loss_with_ignored_labels_and_grad(seed):
    torch.manual_seed(seed)
    k, B, P, V = 4, 2, 6, 13
    logits = torch.randn(B, P, V, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, V, (B, P * k))
    labels[torch.rand(B, P * k) < 0.3] = IGN
    labels[:, :k] = IGN
    got, losses = plt_mean_loss(logits, labels, k)
    ref_logits = logits.detach().clone().requires_grad_(True)
    ref = reference_loss(ref_logits, labels, k)
    torch.testing.assert_close(got.double(), ref, rtol=1e-6, atol=1e-6)
    # first patch and ignored positions carry exactly 0
    assert torch.all(losses[labels == IGN] == 0)
    got.backward()
    ref.backward()
    torch.testing.assert_close(logits.grad, ref_logits.grad, rtol=1e-5, atol=1e-7)


def test_loss_all_targets_ignored_is_zero_with_zero_grad():
    logits = torch.randn(3, 2, 7, requires_grad=True)
    labels = torch.full((2, 12), IGN)
    losses = patch_loss.plt_token_losses(logits, labels, 4)
    assert torch.all(losses == 0)
    losses.sum().backward()
    assert torch.all(logits.grad == 0)


def test_loss_bf16_input_fp32_output():
    logits = torch.randn(4, 2, 9, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, 9, (2, 8))
    losses = patch_loss.plt_token_losses(logits, labels, 2)
    assert losses.dtype == torch.float32
    losses.sum().backward()
    assert logits.grad.dtype == torch.bfloat16
    ref = patch_loss.plt_token_losses(logits.detach().float(), labels, 2)
    torch.testing.assert_close(losses, ref)


def test_loss_shape_mismatch_is_clear():
    with pytest.raises(ValueError, match='do not match'):
        patch_loss.plt_token_losses(torch.randn(3, 2, 5), torch.zeros(2, 11, dtype=torch.long), 4)


def test_shift_patch_targets():
    k = 2
    labels = torch.arange(12).view(2, 6)
    t = patch_loss.shift_patch_targets(labels, k)  # [P, B, K]
    for p in range(3):
        for b in range(2):
            for j in range(k):
                expect = int(labels[b, (p + 1) * k + j]) if p < 2 else IGN
                assert int(t[p, b, j]) == expect


@pytest.mark.parametrize('upstream', [None, 1, 2, 8, 64, 128])
@pytest.mark.parametrize('k', [1, 2, 3, 4])
def test_patch_padding_to(upstream, k):
    got = patch_layout.patch_padding_to(upstream, k)
    if k == 1:
        assert got == upstream
        return
    assert got % k == 0 and (got // k) % (upstream or 1) == 0
    # smallest such multiple: brute force
    assert got == next(n for n in range(1, 10_000) if n % k == 0 and (n // k) % (upstream or 1) == 0)


def test_pad_to_multiple():
    for n in range(20):
        for k in range(1, 6):
            assert (n + patch_layout.pad_to_multiple(n, k)) % k == 0 and 0 <= patch_layout.pad_to_multiple(n, k) < k


# ---- vocab split across a real gloo group (2 ranks), against the full-vocab result ----


def _vocab_split_worker(rank, world, port, logits_full, labels, k, queue):
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    torch.distributed.init_process_group('gloo', rank=rank, world_size=world)
    try:
        V = logits_full.shape[-1]
        vl = V // world
        shard = logits_full[..., rank * vl:(rank + 1) * vl].clone().requires_grad_(True)
        losses = patch_loss.plt_token_losses(shard, labels, k, vocab_start=rank * vl, group=torch.distributed.group.WORLD)
        mask = labels != IGN
        ((losses * mask).sum() / mask.sum()).backward()
        # as bytes: a tensor put on a torch.multiprocessing queue travels as a file descriptor that the reader
        # fetches from this process, which may have exited by then (ConnectionResetError, seen under load)
        buf = io.BytesIO()
        torch.save((losses.detach(), shard.grad), buf)
        queue.put((rank, buf.getvalue()))
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize('world', [2, 3])
def test_loss_vocab_parallel_matches_full_vocab(world):
    torch.manual_seed(world)
    k, B, P, V = 4, 2, 5, 12
    logits = torch.randn(P, B, V)
    labels = torch.randint(0, V, (B, P * k))
    labels[torch.rand(B, P * k) < 0.2] = IGN
    labels[:, :k] = IGN
    full = logits.clone().requires_grad_(True)
    ref = patch_loss.plt_token_losses(full, labels, k)
    mask = labels != IGN
    ((ref * mask).sum() / mask.sum()).backward()

    ctx = torch.multiprocessing.get_context('spawn')
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_vocab_split_worker, args=(r, world, port, logits, labels, k, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict((r, torch.load(io.BytesIO(payload))) for r, payload in (queue.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    vl = V // world
    for r, (losses, grad) in results.items():
        torch.testing.assert_close(losses, ref.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grad, full.grad[..., r * vl:(r + 1) * vl], rtol=1e-5, atol=1e-7)
