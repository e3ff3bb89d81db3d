"""PLT on the hybrid Gated-DeltaNet decoders (qwen3_next, qwen3_5, qwen3_5_moe: 3 linear-attention layers, then one
gated full-attention layer) in ms-swift's Megatron training step on CPU (tests/harness P22: fla's kernels as
per-document torch loops). At K=4: padded rows give the brute-force PatchTrain loss on the family's HF model; packed
(THD) rows, whose documents end mid-row, give the same step (the convolution and the delta-rule recurrence restart at
every document's first patch); TP, PP and EP layouts equal one rank. (Every gradient against the HF model:
tests/models/test_families_cpu.py.)"""
import pytest

from harness.dist import spawn
from swift_plt.families import HYBRID_MCORE_TYPES
from swift_plt.tools.tiny_families import HYBRID_FAMILIES, make_tiny_family, unavailable
from test_layouts_cpu import K, VOCAB, _loss, _step, assert_same_step, brute_force_plt_loss, make_micro_batches, pack

pytestmark = pytest.mark.xdist_group('layouts_hybrid_cpu')

NO_AUX = {'moe_aux_loss_coeff': 0.0}
REL = 1e-5
# the Gated DeltaNet's per-head decay parameters (A_log, dt_bias) sum a product through the whole recurrence over
# every position: fp32 reassociation across layouts gives up to ~2.5e-5 there (the loss is the same to the last bit)
GRAD_REL = 5e-5


def plt_type(family):
    return HYBRID_MCORE_TYPES[family] + '_plt'


@pytest.fixture(scope='module')
def batches():
    return make_micro_batches()


@pytest.fixture(scope='module')
def runs(tmp_path_factory, batches):
    """Family dirs and their single-rank steps (padded, packed), made once and shared by the tests."""
    cache = {}

    def get(family, what):
        if unavailable(family):  # Qwen3.5 on transformers 4.57
            pytest.skip(unavailable(family))
        if (family, 'dir') not in cache:
            cache[family, 'dir'] = make_tiny_family(family, str(tmp_path_factory.mktemp(family)), vocab_size=VOCAB)
        if what == 'dir':
            return cache[family, 'dir'], None
        if what not in cache.setdefault(family, {}):
            hf_dir = cache[family, 'dir']
            mbs = pack(batches) if what == 'packed' else batches
            cache[family][what] = spawn(_step, 1, hf_dir, plt_type(family), K, mbs, None, False, None, NO_AUX)
        return cache[family, 'dir'], cache[family][what]

    return get


@pytest.mark.parametrize('family', HYBRID_FAMILIES)
def test_k4_padded_and_packed_equal_brute_force(family, runs, batches):
    hf_dir, padded = runs(family, 'padded')
    ref_loss, count = brute_force_plt_loss(hf_dir, batches, K)
    loss, tokens = _loss(padded)
    print(f'{family} K={K} 1 rank: loss {loss!r}, brute force {ref_loss!r} over {count} targets')
    assert tokens == count and loss == pytest.approx(ref_loss, rel=REL)
    _, packed = runs(family, 'packed')
    assert_same_step(packed, padded, f'{family} PLT packed vs padded', outputs=False, grad_rel=GRAD_REL)


def _step_recurrence_across_documents(*args):
    """Mutation: the Gated DeltaNet's kernels ignore the packed row's document boundaries."""
    from harness import hybrid
    conv, rule = hybrid.causal_conv1d, hybrid.chunk_gated_delta_rule
    import mcore_bridge.model.modules.gated_delta_net as gdn
    gdn.causal_conv1d = lambda *a, cu_seqlens=None, **kw: conv(*a, **kw)
    gdn.chunk_gated_delta_rule = lambda *a, cu_seqlens=None, **kw: rule(*a, **kw)
    return _step(*args)


def test_mutation_state_across_documents_fails(runs, batches):
    """The packed comparison sees the per-document restart: a recurrence and convolution that run across the packed
    row's documents change the loss."""
    hf_dir, padded = runs('qwen3_next', 'padded')
    mutated = spawn(_step_recurrence_across_documents, 1, hf_dir, plt_type('qwen3_next'), K, pack(batches), None,
                    False, None, NO_AUX)
    assert _loss(mutated)[0] != pytest.approx(_loss(padded)[0], rel=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize('family, layout', [
    ('qwen3_next', 'tp2_sp'),
    ('qwen3_next', 'pp2'),
    ('qwen3_next', 'ep2'),
    ('qwen3_5', 'tp2_sp'),
    ('qwen3_5_moe', 'pp2_ep2'),
])
def test_hybrid_packed_layout_equals_one_rank(family, layout, runs, batches):
    """Packed rows at K=4: TP=2 with sequence parallel (the Gated DeltaNet gathers the sequence, its heads split over
    TP), PP=2 (GDN layers on both stages), EP=2, PP=2 x EP=2 (4 ranks), against the single-rank step."""
    world, dims, sp = {'tp2_sp': (2, dict(tp=2), True), 'pp2': (2, dict(pp=2), False),
                       'ep2': (2, dict(ep=2, etp=1), False), 'pp2_ep2': (4, dict(pp=2, ep=2, etp=1), False)}[layout]
    hf_dir, one = runs(family, 'packed')
    results = spawn(_step, world, hf_dir, plt_type(family), K, pack(batches), None, sp, None, NO_AUX, **dims)
    assert_same_step(results, one, f'{family} PLT K={K} packed {layout}', grad_rel=GRAD_REL)


def test_hybrid_tiny_dirs_have_the_published_layer_pattern(runs):
    """mcore-bridge reads the GDN / attention pattern from full_attention_interval (default 4), not layer_types:
    the tiny dirs write it, and it agrees with the HF model's layer_types."""
    import json
    import os
    for family in [f for f in HYBRID_FAMILIES if not unavailable(f)]:
        with open(os.path.join(runs(family, 'dir')[0], 'config.json')) as f:
            config = json.load(f)
        text = config.get('text_config', config)
        interval = text['full_attention_interval']
        expected = ['full_attention' if (i + 1) % interval == 0 else 'linear_attention'
                    for i in range(text['num_hidden_layers'])]
        assert text['layer_types'] == expected and 'full_attention' in expected, family
