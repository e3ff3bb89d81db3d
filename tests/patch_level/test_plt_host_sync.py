"""The patch-level PackedSeqParams built without a device sync (max_seqlen from the token-level host int) equal the
ones computed from the patch cu_seqlens (the former, syncing path), on packed rows built by ms-swift's own
``get_packed_seq_params`` (documents padded to multiples of K, then trailing one-token pad documents)."""
import types

import pytest
import torch
from harness.host_sync import count_host_syncs


@pytest.fixture(scope='module')
def model_mod():
    import harness
    harness.install()
    from swift.megatron.utils.utils import get_packed_seq_params
    from swift_plt.models import megatron_gpt as model
    return model, get_packed_seq_params


@pytest.mark.parametrize('k', [2, 3, 4, 8])
def test_patch_packed_seq_params_host_max_equals_device_max(model_mod, k):
    model, get_packed_seq_params = model_mod
    from swift_plt.patch_level.layout import patch_position_ids
    args = types.SimpleNamespace(cp_partition_mode=None)
    g = torch.Generator().manual_seed(k)
    for trial in range(30):
        n_docs = int(torch.randint(1, 6, (1, ), generator=g))
        docs = [int(x) * k for x in torch.randint(1, 9, (n_docs, ), generator=g)]
        pad = k * int(torch.randint(0, 4, (1, ), generator=g))  # trailing padding, position 0 each (upstream)
        if trial == 0:
            docs, pad = [k], 3 * k  # the longest "document" is a pad patch
        pos = torch.tensor([sum((list(range(d)) for d in docs), []) + [0] * pad])
        token_params = get_packed_seq_params(args, pos)
        assert isinstance(token_params.max_seqlen_q, int)
        pp = patch_position_ids(pos, k)
        fast = model.patch_packed_seq_params(token_params, pp, k)
        slow = model.patch_packed_seq_params(token_params, pp)  # max from the patch cu_seqlens (device sync)
        assert fast.max_seqlen_q == fast.max_seqlen_kv == slow.max_seqlen_q
        assert torch.equal(fast.cu_seqlens_q, slow.cu_seqlens_q)
        assert slow.max_seqlen_q == max([d // k for d in docs] + ([1] if pad else []))
        assert token_params.max_seqlen_q == max(docs + ([1] if pad else []))  # the token object is unchanged


@pytest.mark.parametrize('k, cp', [(2, 2), (4, 2), (4, 4)])
def test_cp_patch_packed_seq_params_host_max(model_mod, k, cp):
    """Context parallel: every packed document is a multiple of 2*CP*K tokens, so the patch-level max_seqlen is the
    token-level host int // K, equal to the max of the patch cu_seqlens (the syncing fallback, a non-int max)."""
    model, get_packed_seq_params = model_mod
    args = types.SimpleNamespace(cp_partition_mode=None)
    g = torch.Generator().manual_seed(k * cp)
    for _ in range(20):
        docs = [int(x) * 2 * cp * k for x in torch.randint(1, 5, (int(torch.randint(1, 5, (1, ), generator=g)), ),
                                                           generator=g)]
        pos = torch.tensor([sum((list(range(d)) for d in docs), [])])
        token_params = get_packed_seq_params(args, pos)
        assert isinstance(token_params.max_seqlen_q, int)
        fast = model.patch_packed_seq_params_cp(token_params, k)
        token_params.max_seqlen_q = token_params.max_seqlen_kv = None  # no host int: computed on the device
        slow = model.patch_packed_seq_params_cp(token_params, k)
        assert fast.max_seqlen_q == fast.max_seqlen_kv == slow.max_seqlen_q == slow.max_seqlen_kv == max(docs) // k
        assert torch.equal(fast.cu_seqlens_q, slow.cu_seqlens_q)


@pytest.mark.parametrize('k, cp', [(4, 2), (2, 4)])
def test_cp_patch_packed_seq_params_has_no_host_sync(model_mod, monkeypatch, k, cp):
    """Review #4: the CP THD boundaries go to patch level without a device-to-host copy (q, kv and the padded
    variants; the alignment is checked on the CPU batch before, in get_batch_on_this_pp_rank). The counter itself
    is checked on the former form of the check, bool((cu % K != 0).any())."""
    model, get_packed_seq_params = model_mod
    args = types.SimpleNamespace(cp_partition_mode=None)
    docs = [2 * cp * k * n for n in (3, 1, 2)]
    token_params = get_packed_seq_params(args, torch.tensor([sum((list(range(d)) for d in docs), [])]))
    token_params.cu_seqlens_q_padded = token_params.cu_seqlens_kv_padded = token_params.cu_seqlens_q  # as on NPU
    calls = count_host_syncs(monkeypatch)
    params = model.patch_packed_seq_params_cp(token_params, k)
    assert calls == []
    bool((token_params.cu_seqlens_q % k != 0).any())
    assert calls and set(calls) == {'__bool__'}, calls
    monkeypatch.undo()
    want = torch.tensor([0] + [sum(docs[:i + 1]) // k for i in range(len(docs))], dtype=torch.int32)
    for name in ('cu_seqlens_q', 'cu_seqlens_kv', 'cu_seqlens_q_padded', 'cu_seqlens_kv_padded'):
        assert getattr(params, name).dtype == torch.int32 and torch.equal(getattr(params, name), want), name
    assert params.max_seqlen_q == params.max_seqlen_kv == max(docs) // k
