"""Critic training under context parallel (CP), on CPU with fake CP ranks (CP attention itself is TE-only; the GPU
check is tests/gpu/critic_cp.sh).

What is checked against a brute-force reference written the obvious way:
  * the collator pads each row's returns/old_values like upstream pads its tokens under CP (per row, to a multiple
    of 2*CP, before packing), so the packed targets stay on their tokens;
  * the trainer's path (value_targets, then upstream's label roll and CP split of the batch, then
    ``split_targets_cp``) gives every fake CP rank the value/target pairs of its own positions: rank-local value
    masks equal the rank's rolled labels != -100 (the pairing the LM loss uses), the union over ranks of
    (position, return) pairs equals the CP=1 pairing (value at p-1 <- return of the response token at p), and the
    loss sums, token counts and metric sums of ``critic_loss_func`` add up over ranks to the CP=1 values.
"""
import copy
import random
from types import SimpleNamespace

import pytest
import torch

from harness.dist import spawn
from test_critic_data import template  # noqa: F401  (the shared template fixture)

IGN = -100


def _documents(rng, cp, n_docs):
    """Random packed documents, each padded (labels -100, returns 0) to a multiple of 2*cp as ms-swift's collator
    does under CP; token 0 of each document is never a response token."""
    labels, returns, old_values, cu = [], [], [], [0]
    for _ in range(n_docs):
        n = rng.randint(2, 13)
        lab = [IGN] + [rng.choice([IGN, 5, 7]) for _ in range(n - 1)]
        ret = [rng.uniform(-2, 2) if y != IGN else 0.0 for y in lab]
        old = [rng.uniform(-2, 2) if y != IGN else 0.0 for y in lab]
        pad = -n % (2 * cp)
        labels += lab + [IGN] * pad
        returns += ret + [0.0] * pad
        old_values += old + [0.0] * pad
        cu.append(len(labels))
    return labels, returns, old_values, cu


def _reference_pairs(labels, returns):
    """CP=1 pairing, the obvious way: the value at position p-1 is trained towards the return of response token p."""
    return {p - 1: returns[p] for p, y in enumerate(labels) if y != IGN}


def _cp_worker(cases):
    import megatron.core.parallel_state as ps

    from swift.megatron.trainers.utils import get_batch_on_this_pp_rank
    from swift.megatron.utils import get_batch_on_this_cp_rank
    from swift_plt.critic.data import value_targets
    from swift_plt.critic.trainer import critic_loss_func, split_targets_cp
    from mcore_bridge import split_cp_inputs

    out = []
    for case in cases:
        cp, mode, padding_free = case['cp'], case['mode'], case['padding_free']
        labels, returns, old = case['labels'], case['returns'], case['old_values']
        L = labels.shape[-1]
        values = case['values']
        full = value_targets(labels, returns, old)  # CP=1 (today's path)
        ref_loss = critic_loss_func(values[..., None], clip_range=0.2, **full)
        args = SimpleNamespace(task_type='causal_lm', pipeline_model_parallel_size=1, is_multimodal=False,
                               cp_partition_mode=mode)
        psp = SimpleNamespace(cu_seqlens_q=case['cu']) if padding_free else None
        ranks = []
        for rank in range(cp):
            ps.get_context_parallel_world_size = lambda cp=cp: cp
            ps.get_context_parallel_rank = lambda rank=rank: rank
            targets = value_targets(labels, returns, old)  # before the roll, as MegatronCriticTrainer does
            batch = get_batch_on_this_pp_rank(args, {'labels': labels.clone(), 'input_ids': case['positions']})
            batch['packed_seq_params'] = psp
            batch = get_batch_on_this_cp_rank(args, batch)  # upstream's split of labels/input_ids
            local = split_targets_cp(targets, psp, mode)
            kwargs = {'cp_partition_mode': 'contiguous'} if mode == 'contiguous' else {}
            local_values = split_cp_inputs(values, None if psp is None else psp.cu_seqlens_q, -1, **kwargs)
            loss = critic_loss_func(local_values[..., None], clip_range=0.2, **local)
            ranks.append({'labels': batch['labels'], 'positions': batch['input_ids'], 'loss': loss, **local})
        out.append({'ref_loss': ref_loss, 'ranks': ranks, 'L': L})
    return out


def _cases():
    rng = random.Random(0)
    cases = []
    for cp, mode, padding_free in [(2, 'zigzag', True), (4, 'zigzag', True), (2, 'contiguous', True),
                                   (2, 'zigzag', False), (4, 'zigzag', False)]:
        if padding_free:
            labels, returns, old, cu = _documents(rng, cp, 5)
            labels, returns, old = ([x] for x in (labels, returns, old))
        else:  # padded [B, S] rows, S a multiple of 2*cp
            rows = [_documents(rng, cp, 1) for _ in range(3)]
            S = max(len(r[0]) for r in rows)
            labels = [r[0] + [IGN] * (S - len(r[0])) for r in rows]
            returns = [r[1] + [0.0] * (S - len(r[1])) for r in rows]
            old = [r[2] + [0.0] * (S - len(r[2])) for r in rows]
            cu = None
        labels = torch.tensor(labels)
        B, L = labels.shape
        cases.append({
            'cp': cp, 'mode': mode, 'padding_free': padding_free, 'labels': labels,
            'returns': torch.tensor(returns), 'old_values': torch.tensor(old),
            'cu': None if cu is None else torch.tensor(cu, dtype=torch.int32),
            'positions': torch.arange(B * L).view(B, L),  # global index of each position (split like input_ids)
            'values': torch.randn(B, L, generator=torch.Generator().manual_seed(cp)),
        })
    return cases


@pytest.fixture(scope='module')
def cp_results():
    cases = _cases()
    (out, ) = spawn(_cp_worker, 1, cases)
    return cases, out


def test_cp_split_pairs_equal_the_cp1_pairing(cp_results):
    for case, res in zip(*cp_results):
        name = (case['cp'], case['mode'], case['padding_free'])
        B, L = case['labels'].shape
        ref = {}
        for b in range(B):
            ref.update({b * L + p: r for p, r in _reference_pairs(case['labels'][b].tolist(),
                                                                     case['returns'][b].tolist()).items()})
        ref_old = {}
        for b in range(B):
            old = case['old_values'][b].tolist()
            ref_old.update({b * L + p - 1: old[p] for p, y in enumerate(case['labels'][b].tolist()) if y != IGN})
        got, got_old, seen = {}, {}, []
        for rank in res['ranks']:
            mask = rank['value_mask']
            assert mask.shape == rank['labels'].shape == rank['returns'].shape, name
            # the value at a rank's position i is paired with the same next token as upstream's rolled label i
            assert torch.equal(mask, rank['labels'] != IGN), name
            pos = rank['positions'][mask].tolist()
            got.update(zip(pos, rank['returns'][mask].tolist()))
            got_old.update(zip(pos, rank['old_values'][mask].tolist()))
            seen += rank['positions'].flatten().tolist()
        assert sorted(seen) == list(range(B * L)), name  # the ranks partition the positions
        assert got.keys() == ref.keys() and all(abs(got[k] - ref[k]) < 1e-6 for k in ref), name
        assert got_old.keys() == ref_old.keys() and all(abs(got_old[k] - ref_old[k]) < 1e-6 for k in ref), name


def test_cp_loss_sums_over_ranks_equal_cp1(cp_results):
    for case, res in zip(*cp_results):
        name = (case['cp'], case['mode'], case['padding_free'])
        ref_sum, ref_n, ref_metrics = res['ref_loss']
        assert ref_n > 0, name
        assert sum(int(r['loss'][1]) for r in res['ranks']) == int(ref_n), name
        got = sum(r['loss'][0] for r in res['ranks'])
        assert torch.allclose(got, ref_sum, rtol=1e-5, atol=1e-6), (name, got, ref_sum)
        for k, v in ref_metrics.items():
            s = sum(r['loss'][2][k] for r in res['ranks'])
            assert torch.allclose(s, v, rtol=1e-5, atol=1e-5), (name, k, s, v)


@pytest.mark.parametrize('cp', [1, 2, 4])
@pytest.mark.parametrize('padding_free', [True, False])
def test_collated_targets_stay_on_their_tokens_under_cp(template, cp, padding_free):
    tpl = copy.copy(template)
    tpl.critic_clipped = True
    tpl.sequence_parallel_size = cp  # what ms-swift sets from --context_parallel_size
    tpl.padding_free = padding_free
    rows = [({'token_ids': [300, 301, 302]}, [1.0, 2.0, 3.0]), ({'token_ids': [310]}, [4.0]),
            ({'token_ids': [320, 321]}, [5.0, 6.0])]
    encoded = []
    for ids, rets in rows:
        row = {'messages': [{'role': 'user', 'content': 'Where?'}, {'role': 'assistant', 'content': ids}],
               'add_eos': False, 'returns': rets, 'old_values': [r / 2 for r in rets]}
        encoded.append(tpl.encode(row, return_length=True))
    batch = tpl.data_collator(copy.deepcopy(encoded), padding_to=2 * cp)
    labels, ids = batch['labels'], batch['input_ids']
    assert batch['returns'].shape == labels.shape == ids.shape
    if cp > 1 and padding_free:  # upstream padded each row before packing: the rows do not just abut
        assert labels.shape[-1] >= sum(-(-len(e['input_ids']) // (2 * cp)) * 2 * cp for e in encoded)
    # brute force: each response token carries its own row's return, in order
    expected = {}
    for (tok_ids, rets) in rows:
        expected.update(dict(zip(tok_ids['token_ids'], rets)))
    for key, scale in (('returns', 1.0), ('old_values', 0.5)):
        for tok, r, y in zip(ids.flatten().tolist(), batch[key].flatten().tolist(), labels.flatten().tolist()):
            if y != IGN:
                assert tok in expected and abs(r - expected[tok] * scale) < 1e-6, (key, tok, r)
            else:
                assert r == 0.0, (key, tok, r)


def test_engine_under_context_parallel_needs_ddp_for_updates():
    """The engine runs under CP (tests/layouts/test_layouts_cp_cpu.py: CP=2 == 1 rank); updates need megatron DDP, which
    sums the CP ranks' gradients: a bare model with an optimizer is refused with what to do."""
    from swift_plt.critic.engine import MegatronCritic
    model = torch.nn.Linear(1, 1)
    model.config = SimpleNamespace(context_parallel_size=2, grad_scale_func=None, finalize_model_grads_func=None)
    with pytest.raises(ValueError, match=r'context parallel \(context_parallel_size=2\) trains a megatron DDP'):
        MegatronCritic([model], torch.optim.SGD(model.parameters(), lr=0.1))
    MegatronCritic([model])  # values only (no optimizer): accepted
    model.config.context_parallel_size = 1
    MegatronCritic([model], torch.optim.SGD(model.parameters(), lr=0.1))  # without CP: accepted
