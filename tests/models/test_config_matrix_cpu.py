"""The config-option matrix: for the accepted `gpt` families, each config.json field that changes the
forward pass, one toy-width fp32 case per value that matters (``make_tiny_family(family, dir, **overrides)``):

* stock Megatron (mcore-bridge's model type, no plugin code) at K=1: logits = the family's HF model's (rel 1e-5);
* PLT at K=4: loss = the brute-force PatchTrain loss on the HF model (``hf_plt_reference``, rel 1e-5). Every gradient
  at K=4 is checked per family in test_families_cpu.py; here the loss only, to keep the matrix cheap.

Every case runs in ONE spawned rank (module fixture ``results``); the tests read its results. A case marked
``UPSTREAM`` is where mcore-bridge 1.6.5 / megatron-core 0.16.1 themselves compute something other than transformers
(stock at K=1 too): its test asserts that the difference exists (not a skip), and
``swift_plt/families/upstream.py`` warns about it before step 1 (asserted here as well). ``REFUSED``: the
stock conversion fails loudly (asserted). Each case's HF logits must also differ from its family's base case (the
option changes the forward pass, so the case tests something), unless marked ``same_as_base``."""
import pytest
import torch

from harness.dist import spawn
from harness.plt_cases import K, VOCAB, make_batch
from swift_plt.families import FAMILY_MCORE_TYPES
from swift_plt.compat.transformers import is_transformers_5
from swift_plt.families.upstream import upstream_difference_warnings
from swift_plt.tools.tiny_families import make_tiny_family

pytestmark = pytest.mark.xdist_group('config_matrix_cpu')

TOL = 1e-5  # fp32: K=1 logits max|mcore - HF| / max|HF|, K=4 |loss - brute force| / brute force
EQUAL, UPSTREAM_K1, UPSTREAM, REFUSED = 'equal', 'upstream_k1', 'upstream', 'refused'

LONGROPE = dict(rope_type='longrope', short_factor=[1.0 + 0.1 * i for i in range(8)],
                long_factor=[1.0 + 0.5 * i for i in range(8)], original_max_position_embeddings=16)
# (family, overrides, id, expectation[, flags]); the first case of a family is its base (the tiny_families config)
CASES = [
    # --- llama: rope_scaling types (transformers' Llama accepts them all), biases, tied embeddings
    ('llama', {}, 'llama', EQUAL),
    ('llama', dict(tie_word_embeddings=True), 'llama-tied', EQUAL),
    ('llama', dict(rope_scaling=dict(rope_type='linear', factor=4.0)), 'llama-rope-linear', EQUAL),
    # max_position_embeddings 16 < 32 tokens: the NTK base grows at K=1 (both sides); 8 patches at K=4: it does not
    ('llama', dict(rope_scaling=dict(rope_type='dynamic', factor=4.0), max_position_embeddings=16),
     'llama-rope-dynamic', EQUAL),
    ('llama', dict(rope_scaling=dict(rope_type='yarn', factor=4.0, original_max_position_embeddings=128)),
     'llama-rope-yarn', EQUAL),
    ('llama', dict(rope_scaling=dict(rope_type='llama3', factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                     original_max_position_embeddings=64)), 'llama-rope-llama3', EQUAL),
    # longrope: transformers 5 reads original_max_position_embeddings inside the rope parameters and takes long_factor
    # beyond it (16 < 32 tokens), megatron only beyond max_position_embeddings (512): K=1 differs; 8 patches at K=4
    # use short_factor on both sides. transformers 4.57 reads the field at config.json's top level only (a config
    # with it inside and no `factor` does not build there), where mcore-bridge reads it too: both switch at 16
    ('llama', dict(rope_scaling=LONGROPE), 'llama-rope-longrope', UPSTREAM_K1) if is_transformers_5() else
    ('llama', dict(rope_scaling={k: v for k, v in LONGROPE.items() if k != 'original_max_position_embeddings'},
                   original_max_position_embeddings=16), 'llama-rope-longrope', EQUAL),
    ('llama', dict(attention_bias=True), 'llama-attention-bias', EQUAL),  # q, k, v and o biases
    ('llama', dict(mlp_bias=True), 'llama-mlp-bias', REFUSED),  # add_bias_linear: the loader wants q_proj.bias
    # --- qwen2 (qkv bias), qwen3 (QK-norm)
    ('qwen2', {}, 'qwen2', EQUAL),
    ('qwen2', dict(tie_word_embeddings=True), 'qwen2-tied', EQUAL),
    ('qwen2', dict(rope_scaling=dict(rope_type='yarn', factor=4.0, original_max_position_embeddings=128)),
     'qwen2-rope-yarn', EQUAL),
    ('qwen3', {}, 'qwen3', EQUAL),
    ('qwen3', dict(attention_bias=True), 'qwen3-attention-bias', EQUAL),
    ('qwen3', dict(tie_word_embeddings=True), 'qwen3-tied', EQUAL),
    # --- glm4_moe: partial rotary, QK-norm on/off, qkv bias, sigmoid routing with expert bias, groups, dense first
    # layers, shared experts, norm_topk_prob, routed_scaling_factor
    ('glm4_moe', {}, 'glm4_moe', EQUAL),
    ('glm4_moe', dict(partial_rotary_factor=1.0), 'glm4_moe-rotary-1.0', EQUAL),
    ('glm4_moe', dict(partial_rotary_factor=0.25), 'glm4_moe-rotary-0.25', EQUAL),
    ('glm4_moe', dict(use_qk_norm=False), 'glm4_moe-no-qk-norm', EQUAL),
    ('glm4_moe', dict(attention_bias=False), 'glm4_moe-no-attention-bias', EQUAL),
    ('glm4_moe', dict(n_group=2, topk_group=1), 'glm4_moe-groups-2-top-1', EQUAL),
    ('glm4_moe', dict(first_k_dense_replace=0), 'glm4_moe-dense-0', EQUAL),
    ('glm4_moe', dict(n_shared_experts=0), 'glm4_moe-shared-0', EQUAL),
    # megatron-core renormalises sigmoid top-k weights whatever norm_topk_prob says
    ('glm4_moe', dict(norm_topk_prob=False), 'glm4_moe-no-norm-topk', UPSTREAM),
    ('glm4_moe', dict(routed_scaling_factor=1.0), 'glm4_moe-scaling-1', EQUAL),
    # --- qwen3_moe / qwen2_moe: norm_topk_prob
    ('qwen3_moe', {}, 'qwen3_moe', EQUAL),
    ('qwen3_moe', dict(norm_topk_prob=False), 'qwen3_moe-no-norm-topk', EQUAL),
    ('qwen2_moe', {}, 'qwen2_moe', EQUAL),
    ('qwen2_moe', dict(norm_topk_prob=True), 'qwen2_moe-norm-topk', EQUAL),
    # --- deepseek_v3: sigmoid + expert bias over 2 groups (top-1 group), scaling 2.5, 1 dense layer, 1 shared expert
    ('deepseek_v3', {}, 'deepseek_v3', EQUAL),
    ('deepseek_v3', {}, 'deepseek_v3-no-expert-bias', EQUAL, 'zero_expert_bias'),
    # transformers' DeepseekV3 routes by sigmoid whatever config.json says; mcore-bridge reads scoring_func
    ('deepseek_v3', dict(scoring_func='softmax'), 'deepseek_v3-softmax', UPSTREAM),
    ('deepseek_v3', dict(scoring_func='softmax'), 'deepseek_v3-softmax-no-expert-bias', UPSTREAM, 'zero_expert_bias'),
    ('deepseek_v3', dict(n_group=1, topk_group=1), 'deepseek_v3-groups-1', EQUAL),
    # 8 experts in 4 groups, top-2 groups: megatron scores a group by its top num_experts_per_tok // topk_group,
    # transformers (noaux_tc) by its top-2: equal at top-4, not at top-2
    ('deepseek_v3', dict(n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=4),
     'deepseek_v3-groups-4-top-2-k4', EQUAL),
    ('deepseek_v3', dict(n_routed_experts=8, n_group=4, topk_group=2), 'deepseek_v3-groups-4-top-2-k2', UPSTREAM),
    ('deepseek_v3', dict(routed_scaling_factor=1.0), 'deepseek_v3-scaling-1', EQUAL),
    ('deepseek_v3', dict(norm_topk_prob=False), 'deepseek_v3-no-norm-topk', UPSTREAM),
    ('deepseek_v3', dict(first_k_dense_replace=0), 'deepseek_v3-dense-0', EQUAL),
    ('deepseek_v3', dict(n_shared_experts=0), 'deepseek_v3-shared-0', EQUAL),
    ('deepseek_v3', dict(n_shared_experts=2), 'deepseek_v3-shared-2', EQUAL),
    # --- deepseek_v2: softmax greedy (one group), YaRN with mscale, 2 shared experts, 1 dense layer
    ('deepseek_v2', {}, 'deepseek_v2', EQUAL),
    ('deepseek_v2', dict(rope_scaling=None), 'deepseek_v2-no-yarn', EQUAL),
    ('deepseek_v2', dict(routed_scaling_factor=2.0), 'deepseek_v2-scaling-2', EQUAL),
    ('deepseek_v2', dict(n_shared_experts=1, first_k_dense_replace=0), 'deepseek_v2-shared-1-dense-0', EQUAL),
    # transformers' DeepseekV2 never renormalises; megatron (through mcore-bridge) does where norm_topk_prob is true
    ('deepseek_v2', dict(norm_topk_prob=True), 'deepseek_v2-norm-topk', UPSTREAM),
    # megatron keeps a group by the sum of its top-2 scores, transformers by the max (the known difference)
    ('deepseek_v2', dict(topk_method='group_limited_greedy', n_group=2, topk_group=1),
     'deepseek_v2-group-limited-greedy', UPSTREAM),
    # megatron group-limits whatever topk_method; transformers' greedy does not
    ('deepseek_v2', dict(topk_method='greedy', n_group=2, topk_group=1), 'deepseek_v2-greedy-2-groups', UPSTREAM),
]
IDS = [c[2] for c in CASES]
assert len(set(IDS)) == len(IDS)


def _zero_expert_bias(hf_dir):
    import glob

    from safetensors.torch import load_file, save_file
    for path in glob.glob(f'{hf_dir}/*.safetensors'):
        state = load_file(path)
        for name in state:
            if name.endswith('e_score_correction_bias'):
                state[name] = torch.zeros_like(state[name])
        save_file(state, path, metadata={'format': 'pt'})


def _run_matrix(cases, batch):
    """In one spawned rank, per case: stock K=1 logits (mcore-bridge's model type) and HF logits on the same ids;
    PLT K=4 loss (the family's PLT type, aux loss off) and the brute force on the HF model. Errors are returned."""
    import traceback

    from harness.model import build_mcore_model, hf_logits, mcore_logits
    from harness.plt_cases import hf_plt_reference, mcore_loss
    out = {}
    for cid, family, hf_dir in cases:
        stock = FAMILY_MCORE_TYPES.get(family, 'gpt')
        res = out[cid] = {}
        try:
            res['hf_logits'] = hf_logits(hf_dir, batch['input_ids'])
            res['k1_logits'] = mcore_logits(build_mcore_model(hf_dir, mcore_model_type=stock), batch['input_ids'])
            res['k4_loss'] = mcore_loss(hf_dir, batch, K, stock + '_plt', {'moe_aux_loss_coeff': 0.0})['loss']
            res['k4_ref'] = hf_plt_reference(hf_dir, batch)[0]
        except Exception as e:  # noqa: BLE001 (REFUSED cases; any other case fails on it in its test)
            res['error'] = f'{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}'
    return out


@pytest.fixture(scope='module')
def results(tmp_path_factory):
    cases = []
    for family, overrides, cid, *_rest in CASES:
        hf_dir = make_tiny_family(family, str(tmp_path_factory.mktemp(cid)), vocab_size=VOCAB, **overrides)
        if 'zero_expert_bias' in _rest[1:]:
            _zero_expert_bias(hf_dir)
        cases.append((cid, family, hf_dir))
    (out, ) = spawn(_run_matrix, 1, cases, make_batch(), timeout=600)
    for cid, family, hf_dir in cases:
        out[cid]['hf_dir'] = hf_dir
    return out


def _rel_logits(res):
    return float((res['k1_logits'] - res['hf_logits']).abs().max() / res['hf_logits'].abs().max())


def _rel_loss(res):
    return abs(res['k4_loss'] - res['k4_ref']) / abs(res['k4_ref'])


def _warnings(hf_dir):
    """The start-up warnings of the case's config.json, less megatron-core 0.19's Q norm of MLA without Q LoRA: a
    Transformer Engine layer the CPU harness builds as 0.16 does (tests/harness/patches.py P18; its warning:
    test_upstream_differences.py, its size: the GPU check)."""
    import json
    with open(f'{hf_dir}/config.json') as f:
        return [w for w in upstream_difference_warnings(json.load(f)) if 'q_lora_rank=null' not in w]


@pytest.mark.parametrize('case', CASES, ids=IDS)
def test_config_option(case, results):
    family, overrides, cid, expect, *flags = case
    res = results[cid]
    if expect == REFUSED:
        assert 'error' in res and 'KeyError' in res['error'], res
        print(f'{cid}: stock conversion refuses: {res["error"].splitlines()[0]}')
        return
    assert 'error' not in res, res['error']
    k1, k4 = _rel_logits(res), _rel_loss(res)
    print(f'{cid}: K=1 logits rel {k1:.3g}; K=4 loss {res["k4_loss"]!r} vs brute force {res["k4_ref"]!r} '
          f'(rel {k4:.3g})')
    base = results[next(c[2] for c in CASES if c[0] == family)]
    warnings = _warnings(res['hf_dir'])
    for line in warnings:
        print(f'  warning: {line}')
    if expect == EQUAL:
        if base is not res:  # the option changes the HF forward pass: the case tests something
            assert not torch.allclose(res['hf_logits'], base['hf_logits'], rtol=0, atol=1e-4), f'{cid} = its base'
        assert k1 < TOL and k4 < TOL
        assert warnings == []
    elif expect == UPSTREAM_K1:  # UPSTREAM DIFFERENCE at K=1 (stock), none at these K=4 lengths
        assert k1 > 1e-3 and k4 < TOL
        assert len(warnings) == 1
    else:  # UPSTREAM DIFFERENCE: stock differs from transformers, PLT inherits it
        assert k1 > 1e-4 and k4 > TOL
        assert len(warnings) == 1
