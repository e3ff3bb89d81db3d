"""The CPU harness builds and runs every family of ``swift_plt.tools.tiny_families`` (dense, MoE, MLA + MoE) as
mcore 'gpt' models with HF weights loaded by mcore-bridge, and gives the HF logits; qwen3_moe also under TP=2 (experts
split by expert-TP), EP=2 and TP2 x EP2 with sequence parallel, which must reproduce the 1-rank logits.
Every model is built in fresh processes (``harness.spawn``), as in test_harness_smoke.
"""
import pytest
import torch

from harness import spawn
from swift_plt.tools.tiny_families import FAMILIES, make_tiny_family

pytestmark = pytest.mark.xdist_group('harness_families')

# fp32, one thread: measured max |mcore - HF| <= 8.7e-7 for logits of size ~1 (0.0 for llama / qwen2)
HF_TOL = 1e-4
# parallel layouts vs 1 rank, same fp32 model: measured <= 6e-7
LAYOUT_TOL = 1e-5


@pytest.fixture(scope='module')
def input_ids():
    return torch.randint(4, 512, (2, 32), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope='module')
def family_dir(tmp_path_factory):
    dirs = {}

    def get(family):
        if family not in dirs:
            dirs[family] = make_tiny_family(family, str(tmp_path_factory.mktemp(f'tiny_{family}')))
        return dirs[family]

    return get


@pytest.fixture(scope='module')
def one_rank_logits(family_dir, input_ids):
    cache = {}

    def get(family):
        if family not in cache:
            cache[family] = spawn(_logits_worker, 1, family_dir(family), input_ids, {})[0]
        return cache[family]

    return get


def _logits_worker(hf_dir, input_ids, extra_config):
    from megatron.core import parallel_state

    from harness import build_mcore_model, hf_logits, mcore_logits
    models = build_mcore_model(hf_dir, tp=parallel_state.get_tensor_model_parallel_world_size(),
                               extra_config=extra_config)
    out = mcore_logits(models, input_ids)
    experts = getattr(models[0].decoder.layers[-1].mlp, 'experts', None)
    if experts is not None:  # this rank's expert weights: the layout really is split
        assert type(experts).__name__ == 'TEGroupedMLP'
        out = (out, tuple(experts.linear_fc1.weight0.shape), experts.linear_fc1.num_gemms)
    return out, hf_logits(hf_dir, input_ids) if parallel_state.get_data_parallel_rank() == 0 else None


@pytest.mark.parametrize('family', FAMILIES)
def test_family_logits_match_hf(one_rank_logits, input_ids, family):
    out, ref = one_rank_logits(family)
    if isinstance(out, tuple):
        out = out[0]
    assert out.shape == ref.shape == (*input_ids.shape, 512)
    diff = (out - ref).abs().max().item()
    print(f'{family}: max |mcore - HF| = {diff:.3g}')
    assert diff <= HF_TOL


# (world size, spawn kwargs, extra config, expected local fc1 expert weight shape [2 * ffn / etp, hidden], experts)
_LAYOUTS = {
    'tp2': (2, dict(tp=2), {}, (32, 64), 4),  # etp = tp = 2: each rank holds half of every expert
    'ep2': (2, dict(ep=2, etp=1), {}, (64, 64), 2),
    'tp2-ep2-sp': (4, dict(tp=2, ep=2, etp=1), {'sequence_parallel': True}, (64, 64), 2),
}


@pytest.mark.slow
@pytest.mark.parametrize('layout', list(_LAYOUTS))
def test_qwen3_moe_layouts_match_one_rank(family_dir, one_rank_logits, input_ids, layout):
    world, kwargs, extra, fc1_shape, local_experts = _LAYOUTS[layout]
    (ref, _, _), hf = one_rank_logits('qwen3_moe')
    results = spawn(_logits_worker, world, family_dir('qwen3_moe'), input_ids, extra, **kwargs)
    for rank, ((out, shape, n), _) in enumerate(results):
        assert (shape, n) == (fc1_shape, local_experts), rank
        diff = (out - ref).abs().max().item()
        print(f'qwen3_moe {layout} rank {rank}: max |logits - 1 rank| = {diff:.3g}, '
              f'vs HF {(out - hf).abs().max().item():.3g}')
        assert diff <= LAYOUT_TOL
