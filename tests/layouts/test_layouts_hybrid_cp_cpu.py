"""Context parallel (CP=2, zigzag) for the Gated-DeltaNet hybrids (qwen3_next, qwen3_5, qwen3_5_moe) at K=4 on
megatron-core >= 0.18, on CPU over gloo (tests/harness: fla's kernels as per-document torch loops, P22; the CP
attention stand-in for the full-attention layers, harness/cp_attention.py).

The whole model (PLT's model over mcore-bridge's ``GatedDeltaNet``, whose CP is megatron-core's all-to-all: each CP
rank gets the whole patch sequence of 1/CP of the heads, per document for THD), ms-swift's batch preparation and CP
split (``prepare_batch``: labels rolled by K, zigzag split), megatron DDP, the pipeline schedule and ms-swift's loss
form at CP=2 against 1 rank on the same global batch: loss and every gradient, fp32, packed rows whose documents end
mid-row (every document padded to 2*CP*K tokens, as the plugin's data path pads it) and padded rows. A mutation
(the Gated DeltaNet's recurrence run over each rank's local slice, without the all-to-all) shows the comparison
fails.

On megatron-core < 0.18 (no CP in its Gated DeltaNet) the model tests skip, and the refusal is asserted instead.
Also the data path: the CP padding of Qwen3.5's per-token ``mm_token_type_ids`` (the GPU failure `The shape of the
mask [224] ... indexed tensor [220]`).
"""
from types import SimpleNamespace

import pytest
import torch

from harness.dist import spawn
from swift_plt.families import HYBRID_MCORE_TYPES
from swift_plt.tools.tiny_families import HYBRID_FAMILIES, make_tiny_family, unavailable

pytestmark = pytest.mark.xdist_group('layouts_hybrid_cp_cpu')

K = 4
CP = 2
VOCAB = 512
PAD = 3
IGN = -100
M = 2 * CP * K  # every document (packed) or row (padded) is a multiple of 2*CP*K tokens
DOC_LENS = [12, 28, 20, 8, 36]  # real tokens; each padded to a multiple of M: 16, 32, 32, 16, 48 -> [1, 144]
ROW_LENS = [40, 20]  # padded rows of 48 tokens
# as tests/layouts/test_layouts_hybrid_cpu.py: the per-head decay parameters sum through the whole recurrence
GRAD_REL = 5e-5
LOSS_REL = 1e-5
NO_AUX = {'moe_aux_loss_coeff': 0.0}
MULTIMODAL = ('qwen3_5', 'qwen3_5_moe')  # ms-swift's is_multimodal: input_ids not split, the wrapper splits embeds


def mcore_has_gdn_cp() -> bool:
    from swift_plt.compat.versions import gdn_context_parallel_problem
    return gdn_context_parallel_problem() is None


def _batches(seed=0, mrope=False):
    """A packed micro-batch [1, 144] (5 documents, each padded to 2*CP*K with pad tokens at continuing positions,
    labels -100, as the plugin pads them at encode time) and a padded one [2, 48] (right padding, bool mask)."""
    g = torch.Generator().manual_seed(seed)

    def doc(n):
        ids = torch.randint(4, VOCAB, (n, ), generator=g)
        labels = ids.clone()
        labels[torch.rand(n, generator=g) < 0.15] = IGN
        return ids, labels

    ids, labels, pos = [], [], []
    for n in DOC_LENS:
        i, lab = doc(n)
        pad = -n % M
        ids.append(torch.cat([i, torch.full((pad, ), PAD)]))
        labels.append(torch.cat([lab, torch.full((pad, ), IGN)]))
        pos.append(torch.arange(n + pad))
    packed = dict(input_ids=torch.cat(ids)[None], labels=torch.cat(labels)[None], position_ids=torch.cat(pos)[None])
    S = 48
    input_ids = torch.full((len(ROW_LENS), S), PAD)
    row_labels = torch.full((len(ROW_LENS), S), IGN)
    keep = torch.tril(torch.ones(len(ROW_LENS), S, S, dtype=torch.bool)).view(len(ROW_LENS), 1, S, S)
    for b, n in enumerate(ROW_LENS):
        input_ids[b, :n], row_labels[b, :n] = doc(n)
        keep[b, :, :, n:] = False
    padded = dict(input_ids=input_ids, labels=row_labels, position_ids=torch.arange(S).repeat(len(ROW_LENS), 1),
                  attention_mask=~keep)
    cases = [('packed', packed), ('padded', padded)]
    if mrope:  # as Qwen3.5's template collates text: [3, B, S] mRoPE ids (the text positions thrice) + text ids
        for _, batch in cases:
            batch['text_position_ids'] = batch['position_ids']
            batch['position_ids'] = batch['position_ids'][None].expand(3, -1, -1).clone()
    return cases


def _args(cp, padding_free, multimodal):
    return SimpleNamespace(task_type='causal_lm', patch_size=K, context_parallel_size=cp, padding_free=padding_free,
                           cp_partition_mode='zigzag', pipeline_model_parallel_size=1, is_multimodal=multimodal)


def _run_gdn_on_local_slice(cp):
    """Mutation: mcore-bridge's Gated DeltaNet runs as at CP=1 on each rank's local (zigzag) slice, all heads, no
    all-to-all, THD boundaries those of the local slice (each document's two chunks taken as one sequence)."""
    import copy

    import mcore_bridge.model.modules.gated_delta_net as gdn
    orig = gdn.GatedDeltaNet.forward

    def forward(self, *args, **kwargs):
        psp = kwargs.get('packed_seq_params')
        if psp is not None:
            local = copy.copy(psp)
            local.cu_seqlens_q = local.cu_seqlens_kv = psp.cu_seqlens_q // cp
            local.cu_seqlens_q_padded = local.cu_seqlens_kv_padded = None
            kwargs['packed_seq_params'] = local
        config = self.config
        config.context_parallel_size = 1
        try:
            return orig(self, *args, **kwargs)
        finally:
            config.context_parallel_size = cp

    gdn.GatedDeltaNet.forward = forward


def _worker(hf_dir, family, cases, mutation=None):
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads

    from harness import cp_attention
    from harness.model import build_mcore_model
    from harness.train_step import train_step
    from swift.megatron.trainers.utils import prepare_batch
    from swift_plt.plugin.register import plt_model_meta, register_mcore
    cp_attention.enable('zigzag')
    assert register_mcore()
    cp = ps.get_context_parallel_world_size()
    if mutation == 'gdn_without_cp':
        _run_gdn_on_local_slice(cp)
    mcore_type = HYBRID_MCORE_TYPES[family]
    plt_model_meta(mcore_type)
    model = build_mcore_model(hf_dir, mcore_model_type=mcore_type + '_plt',
                              extra_config={'patch_size': K, 'context_parallel_size': cp,
                                            'calculate_per_token_loss': True, **NO_AUX})[0]
    model.config.finalize_model_grads_func = finalize_model_grads
    ddp = DistributedDataParallel(config=model.config, ddp_config=DistributedDataParallelConfig(), module=model)
    ddp.train()
    out = []
    for name, batch in cases:
        packed = name == 'packed'
        data = prepare_batch(_args(cp, packed, family in MULTIMODAL), {k: v.clone() for k, v in batch.items()})
        out.append({**train_step(ddp, data), 'rope': model.config.position_embedding_type})
    return out


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


@pytest.fixture(scope='module')
def family_dirs(tmp_path_factory):
    cache = {}

    def get(family):
        if unavailable(family):  # Qwen3.5 on transformers 4.57
            pytest.skip(unavailable(family))
        if family not in cache:
            cache[family] = make_tiny_family(family, str(tmp_path_factory.mktemp(family)), vocab_size=VOCAB)
            if family in MULTIMODAL:
                _use_mrope(cache[family])
        return cache[family]

    return get


def _use_mrope(hf_dir):
    """Qwen3.5's published configs rotate with interleaved multimodal RoPE (mrope_section [11, 11, 10] of a 64-dim
    rotary part; mcore-bridge's position_embedding_type 'mrope'): the tiny dir gets the same at its size (8 rotary
    dims: [2, 1, 1]), so its [3, B, S] position ids take upstream's mRoPE path under CP."""
    import json
    import os
    path = os.path.join(hf_dir, 'config.json')
    with open(path) as f:
        config = json.load(f)
    config['text_config']['rope_parameters'].update(mrope_section=[2, 1, 1], mrope_interleaved=True)
    with open(path, 'w') as f:
        json.dump(config, f, indent=2)


@pytest.fixture(scope='module')
def one_rank(family_dirs):
    cache = {}

    def get(family):
        if family not in cache:
            cases = _batches(mrope=family in MULTIMODAL)
            (cache[family], ) = spawn(_worker, 1, family_dirs(family), family, cases, timeout=900)
        return cache[family]

    return get


needs_gdn_cp = pytest.mark.skipif('not mcore_has_gdn_cp()',
                                  reason='megatron-core < 0.18: its Gated DeltaNet has no context parallel (the '
                                  'refusal is asserted by test_cli_refuses_cp_before_megatron_core_0_18)')


@pytest.mark.slow
@needs_gdn_cp
@pytest.mark.parametrize('family', HYBRID_FAMILIES)
def test_hybrid_cp2_equals_one_rank(family, family_dirs, one_rank):
    ref = one_rank(family)
    cases = _batches(mrope=family in MULTIMODAL)
    results = spawn(_worker, CP, family_dirs(family), family, cases, cp=CP, timeout=900)
    for i, (name, batch) in enumerate(cases):
        for rank, r in enumerate(results):
            worst = max(_rel(r[i]['grads'][n], g) for n, g in ref[i]['grads'].items())
            print(f'{family} K={K} {name} {tuple(batch["input_ids"].shape)} CP={CP} rank {rank}: loss '
                  f'{r[i]["loss"]!r} (1 rank {ref[i]["loss"]!r}), tokens {r[i]["tokens"]} ({ref[i]["tokens"]}), '
                  f'max relative gradient difference {worst:.3g} over {len(ref[i]["grads"])} parameters')
            assert r[i]['rope'] == ('mrope' if family in MULTIMODAL else 'rope'), r[i]['rope']
            assert r[i]['tokens'] == ref[i]['tokens'], (family, name)
            assert r[i]['loss'] == pytest.approx(ref[i]['loss'], rel=LOSS_REL), (family, name)
            assert set(r[i]['grads']) == set(ref[i]['grads'])
            assert worst <= GRAD_REL, (family, name, worst)


@pytest.mark.slow
@needs_gdn_cp
@pytest.mark.parametrize('family', HYBRID_FAMILIES)
def test_one_rank_reference_is_brute_force(family, family_dirs, one_rank):
    """The 1-rank run the CP runs are compared with is PatchTrain itself: its loss is the brute-force one of the HF
    model (swift_plt.patch_level.reference), each packed document (with its CP padding) and each padded row on its
    own."""
    from transformers import AutoModelForCausalLM

    from swift_plt.patch_level.reference import padded_batch_nll
    ref = one_rank(family)
    model = AutoModelForCausalLM.from_pretrained(family_dirs(family), dtype=torch.float32,
                                                 attn_implementation='eager')
    for i, (name, batch) in enumerate(_batches()):
        if name == 'packed':
            lens = [n + (-n % M) for n in DOC_LENS]
            bounds = torch.tensor([0] + lens).cumsum(0).tolist()
            rows = [(batch['input_ids'][:, a:b], batch['labels'][:, a:b], [b - a]) for a, b in zip(bounds, bounds[1:])]
        else:
            rows = [(batch['input_ids'], batch['labels'], ROW_LENS)]
        with torch.no_grad():
            sums = [padded_batch_nll(model, ids, labels, lens, K) for ids, labels, lens in rows]
        loss, count = sum(float(s) for s, _ in sums) / sum(c for _, c in sums), sum(c for _, c in sums)
        print(f'{family} {name}: 1 rank {ref[i]["loss"]!r} over {ref[i]["tokens"]}, brute force {loss!r} over {count}')
        assert ref[i]['tokens'] == count and ref[i]['loss'] == pytest.approx(loss, rel=LOSS_REL), (family, name)


@pytest.mark.slow
@needs_gdn_cp
def test_mutation_gdn_without_cp_fails(family_dirs, one_rank):
    """Mutation: the Gated DeltaNet runs on each CP rank's local (zigzag) slice with all heads, no all-to-all (its
    convolution and recurrence then see a document's two chunks as one sequence): the loss differs from 1 rank."""
    ref = one_rank('qwen3_next')
    results = spawn(_worker, CP, family_dirs('qwen3_next'), 'qwen3_next', _batches(), 'gdn_without_cp', cp=CP,
                    timeout=900)
    for i, (name, _) in enumerate(_batches()):
        print('GDN without CP', name, 'loss', results[0][i]['loss'], '1 rank', ref[i]['loss'])
        assert results[0][i]['loss'] != pytest.approx(ref[i]['loss'], rel=1e-4), name


# ---------------------------------------------------------------------------------------------------------------
# the refusal where megatron-core has no CP in its Gated DeltaNet

def _cli_args(family, patch_size, cp):
    """``megatron pt --model_type <family> --patch_size K --context_parallel_size cp`` as resolve_patch_size sees
    them (tests/plugin/test_arguments.py's form)."""
    return SimpleNamespace(
        patch_size=patch_size, model_type=family, megatron_model_meta=SimpleNamespace(
            model_type=HYBRID_MCORE_TYPES[family]), model_info=SimpleNamespace(config=SimpleNamespace()),
        task_type='causal_lm', rlhf_type=None, mtp_num_layers=None, is_multimodal=family in MULTIMODAL,
        context_parallel_size=cp, sequence_parallel=False, max_length=256, packing_length=None, seq_length=256,
        cp_partition_mode='zigzag', padding_free=True)


@pytest.mark.parametrize('version, refused', [('0.16.1', True), ('0.17.0', True), ('0.18.0', False),
                                              ('0.19.2', False)])
@pytest.mark.parametrize('family', HYBRID_FAMILIES)
def test_cli_refuses_cp_before_megatron_core_0_18(family, version, refused, monkeypatch):
    """`--patch_size 4 --context_parallel_size 2` with a hybrid: refused before step 1 on megatron-core < 0.18,
    naming the version it needs; accepted from 0.18 on. K=1 and CP=1 are never refused for it."""
    import swift_plt.plugin.register as register
    from swift_plt.compat import versions
    from swift_plt.plugin.arguments import resolve_patch_size
    monkeypatch.setattr(versions, 'installed_version', lambda dist: version if dist == 'megatron-core' else None)
    monkeypatch.setattr(register, 'plt_model_meta', lambda t: SimpleNamespace(model_type=t + '_plt'))
    if refused:
        with pytest.raises(ValueError, match=r'--patch_size 4 cannot be used with: --context_parallel_size > 1 with '
                           rf'Gated DeltaNet layers needs megatron-core >= 0.18 \(installed: {version};'):
            resolve_patch_size(_cli_args(family, 4, 2))
    else:
        assert resolve_patch_size(_cli_args(family, 4, 2)) == 4
    assert resolve_patch_size(_cli_args(family, 1, 2)) == 1
    assert resolve_patch_size(_cli_args(family, 4, 1)) == 4


def test_cli_refuses_cp_with_the_transformers_gated_delta_net(monkeypatch):
    """USE_MCORE_GDN=0 (mcore-bridge's transformers-module Gated DeltaNet asserts CP == 1 at any K): refused with
    that reason, whatever the megatron-core."""
    from swift_plt.compat import versions
    from swift_plt.plugin.arguments import hybrid_problems
    monkeypatch.setattr(versions, 'installed_version', lambda dist: '0.19.2' if dist == 'megatron-core' else None)
    monkeypatch.setenv('USE_MCORE_GDN', '0')
    (problem, ) = hybrid_problems(_cli_args('qwen3_5', 4, 2))
    assert 'USE_MCORE_GDN=0' in problem and 'does not support context parallel' in problem
    monkeypatch.setenv('USE_MCORE_GDN', '1')
    assert not any('USE_MCORE_GDN' in p or 'context_parallel' in p for p in hybrid_problems(_cli_args('qwen3_5', 4,
                                                                                                   2)))


def test_installed_stack_refusal_matches_its_version():
    """The installed megatron-core: the model tests above run (>= 0.18) or the refusal holds (< 0.18)."""
    from swift_plt.compat.versions import installed_version
    from swift_plt.compat.versions import gdn_context_parallel_problem
    version = installed_version('megatron-core')
    problem = gdn_context_parallel_problem()
    major_minor = tuple(int(x) for x in version.split('.')[:2])
    assert (problem is None) == (major_minor >= (0, 18)), (version, problem)


# ---------------------------------------------------------------------------------------------------------------
# the data path: Qwen3.5's per-token mm_token_type_ids under the 2*CP*K padding

@pytest.mark.parametrize('padding_free', [False, True])
def test_cp_padding_keeps_mm_token_type_ids_aligned(padding_free):
    """Qwen3.5's collator gives every text sample ``mm_token_type_ids`` (zeros, its input_ids' length) before the
    upstream collator pads for CP; the plugin's 2*CP*K padding must pad them too, as upstream's 2*CP padding does,
    else mRoPE's ``get_rope_index`` indexes them with a longer attention mask (the GPU failure: `The shape of the
    mask [224] at index 0 does not match the shape of the indexed tensor [220]`)."""
    from swift_plt.data.padding import pad_encoded_to
    for ids_len, as_tensor in ((220, True), (220, False), (37, True)):
        enc = {'input_ids': list(range(ids_len)), 'labels': list(range(ids_len)), 'length': ids_len,
               'mm_token_type_ids': torch.zeros(ids_len, dtype=torch.int64) if as_tensor else [0] * ids_len,
               'image_token_types': torch.full((ids_len, ), -1)}
        pad_encoded_to(enc, M if padding_free else 2 * CP * K, PAD)
        n = len(enc['input_ids'])
        assert n % M == 0 and enc['length'] == n
        assert len(enc['mm_token_type_ids']) == n and len(enc['image_token_types']) == n
        assert int(torch.as_tensor(enc['mm_token_type_ids'])[ids_len:].abs().sum()) == 0
        assert bool((torch.as_tensor(enc['image_token_types']) == -1).all())


@pytest.fixture(scope='module')
def template(tmp_path_factory):
    from harness.tiny import make_tiny_llama
    from swift_plt.plugin.register import register_swift
    register_swift()
    from swift.model import get_model_processor
    from swift.template import get_template
    hf_dir = make_tiny_llama(str(tmp_path_factory.mktemp('tiny')), vocab_size=VOCAB)
    _, processor = get_model_processor(hf_dir, model_type='llama3_2_plt', load_model=False, download_model=False)
    tpl = get_template(processor, template_type='llama', use_chat_template=False, max_length=256, loss_scale='all')
    tpl.set_mode('train')
    tpl.use_megatron = True
    return tpl


@pytest.mark.parametrize('padding_free', [False, True])
def test_collator_keeps_mm_token_type_ids_as_long_as_input_ids(template, padding_free):
    """ms-swift's Megatron collator at CP=2, K=4 on samples carrying ``mm_token_type_ids`` as Qwen3.5's collator
    hands them to it (zeros of the sample's length, added before ``super()._data_collator``): they come out as long
    as input_ids, as with upstream's 2*CP padding. (Before the fix the first row's ids were 4 shorter: Qwen3.5's
    ``get_rope_index`` then failed with `The shape of the mask [224] at index 0 does not match the shape of the
    indexed tensor [220]`.)"""
    import copy

    from swift_plt.patch_level.layout import patch_padding_to
    tpl = copy.copy(template)
    tpl.patch_size, tpl.sequence_parallel_size, tpl.padding_free = K, CP, padding_free
    texts = ['the quick brown fox jumps over the lazy dog ' * 6, 'a', 'hello world, hello sea']
    encoded = [tpl.encode({'messages': [{'role': 'assistant', 'content': t}]}, return_length=True) for t in texts]
    for e in encoded:
        assert len(e['input_ids']) % K == 0
        e['mm_token_type_ids'] = torch.zeros(len(e['input_ids']), dtype=torch.int64)
    assert any(len(e['input_ids']) % M for e in encoded) or padding_free  # the CP padding has work to do
    res = tpl.data_collator(encoded, padding_to=patch_padding_to(CP, K))
    assert res['input_ids'].shape[-1] % M == 0
    assert res['mm_token_type_ids'].shape == res['input_ids'].shape, (res['mm_token_type_ids'].shape,
                                                                     res['input_ids'].shape)
    assert int(res['mm_token_type_ids'].abs().sum()) == 0
