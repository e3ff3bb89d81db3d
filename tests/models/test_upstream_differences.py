"""swift_plt/families/upstream.py: the start-up warning for config.json options where the stock Megatron
model (mcore-bridge + megatron-core, no plugin code, K=1) differs from transformers, and the upstream difference
itself, measured here so that the warning goes stale loudly (these tests fail) if upstream changes.

DeepSeek-V2 ``topk_method: group_limited_greedy``: transformers scores an expert group by its best expert
score, megatron-core by the sum of its top ``num_experts_per_tok // topk_group`` scores."""
import os
import sys
from types import SimpleNamespace

import pytest
from transformers import DeepseekV2Config, DeepseekV3Config, LlamaConfig

from harness.dist import spawn
from swift_plt.families.upstream import run_hf_config, upstream_difference_warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'gpu'))
import make_family_configs as mfc  # noqa: E402  (the published config.json dicts; stdlib only)

# DeepSeek-V2 (236B) routing, experts cut to 32: 8 groups of 4, top-3 groups, top-6 experts, softmax, not renormalised.
V2_ROUTING = dict(n_routed_experts=32, n_group=8, topk_group=3, num_experts_per_tok=6, norm_topk_prob=False,
                  routed_scaling_factor=16.0, scoring_func='softmax')
LITE_ROUTING = dict(V2_ROUTING, n_group=1, topk_group=1)  # DeepSeek-V2-Lite: greedy, one group


def v2_config(topk_method, **kw):
    return DeepseekV2Config(**dict(V2_ROUTING, vocab_size=256, hidden_size=64, intermediate_size=128,
                                   moe_intermediate_size=32, n_shared_experts=2, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4, topk_method=topk_method, **kw))


# the page every warning names, with the measured sizes
DOCS = open(os.path.join(os.path.dirname(__file__), '..', '..', 'docs', 'model-families.md')).read()


# ------------------------------------------------------------------------------------------------------ the warning
def test_warning_for_group_limited_greedy():
    (line, ) = upstream_difference_warnings(v2_config('group_limited_greedy'))
    assert '\n' not in line and line.startswith('[swift-plt] deepseek_v2: config.json topk_method=group_limited_greedy')
    assert 'sum of each group\'s top-2 expert scores, transformers by the max' in line
    assert 'some expert choices differ' in line and 'upstream difference, not PLT' in line
    assert '10.45 %' in DOCS  # the measured size lives in the docs the line names


@pytest.mark.parametrize('config', [
    pytest.param(v2_config('greedy', **LITE_ROUTING), id='greedy-one-group(V2-Lite)'),
    pytest.param(v2_config('group_limited_greedy', topk_group=8), id='all-groups-kept'),
    pytest.param(v2_config('group_limited_greedy', num_experts_per_tok=3), id='top-1-per-group(sum=max)'),
    pytest.param(DeepseekV3Config(n_routed_experts=32, n_group=8, topk_group=4, num_experts_per_tok=8,
                                  topk_method='noaux_tc'), id='noaux_tc(V3)'),
    pytest.param(LlamaConfig(), id='dense'),
    pytest.param(None, id='no-config'),
])
def test_no_warning_where_megatron_routes_as_transformers(config):
    assert upstream_difference_warnings(config) == []


def test_warning_for_greedy_with_groups_and_nested_text_config():
    (line, ) = upstream_difference_warnings(v2_config('greedy'))  # mcore-bridge maps n_group whatever topk_method
    assert 'Megatron limits each token to 3 of the 8 expert groups, transformers\' greedy routing to none' in line
    wrapped = SimpleNamespace(model_type='some_vl', text_config=v2_config('group_limited_greedy'))
    assert upstream_difference_warnings(wrapped) == upstream_difference_warnings(v2_config('group_limited_greedy'))


def test_config_json_dict_as_ms_swift_has_it_at_argument_time(tmp_path):
    """ms-swift 4.6 loads the HF config with the model, after the arguments: then config.json of model_dir."""
    v2_config('group_limited_greedy').save_pretrained(str(tmp_path))
    args = SimpleNamespace(model_dir=str(tmp_path), model_info=SimpleNamespace(config=None, model_dir=str(tmp_path)))
    assert isinstance(run_hf_config(args), dict)
    assert upstream_difference_warnings(run_hf_config(args)) == upstream_difference_warnings(
        v2_config('group_limited_greedy'))
    lite = {k: v for k, v in v2_config('greedy', **LITE_ROUTING).to_dict().items() if k != 'topk_method'}
    assert upstream_difference_warnings(lite) == []
    no_method = {k: v for k, v in v2_config('greedy').to_dict().items() if k != 'topk_method'}
    assert 'topk_method=greedy' in upstream_difference_warnings(no_method)[0]  # transformers' default
    assert run_hf_config(SimpleNamespace(model_dir=str(tmp_path / 'none'), model_info=None)) is None


# ------------------------------------------------------------------- the upstream difference (HF gate vs megatron)
def _routes_hf_vs_megatron(cases, tokens=4096, seed=0):
    """Per case: (share of expert choices that differ, max |weight difference| where both pick the same experts,
    megatron's routing arguments). The same fp32 router logits go through transformers' DeepSeek-V2 router
    (DeepseekV2TopkRouter; 4.57: DeepseekV2MoEGate, the same rule, it returns no logits: they are its fp32 linear)
    and through megatron-core's topk_routing_with_score_function with the arguments mcore-bridge derives from the
    config (what TopKRouter.routing passes: megatron/core/transformer/moe/router.py)."""
    import torch
    import torch.nn.functional as F
    from mcore_bridge.config.parser import hf_to_mcore_config
    from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as hf_v2
    router_5 = getattr(hf_v2, 'DeepseekV2TopkRouter', None)

    out = {}
    for name, config in cases.items():
        mc = hf_to_mcore_config(config)
        kwargs = dict(topk=mc['moe_router_topk'], use_pre_softmax=mc.get('moe_router_pre_softmax', False),
                      num_groups=mc.get('moe_router_num_groups'), group_topk=mc.get('moe_router_group_topk'),
                      scaling_factor=mc.get('moe_router_topk_scaling_factor'),
                      score_function=mc.get('moe_router_score_function', 'softmax'))
        g = torch.Generator().manual_seed(seed)
        gate = (router_5 or hf_v2.DeepseekV2MoEGate)(config)
        with torch.no_grad():
            gate.weight.copy_(torch.randn(gate.weight.shape, generator=g) * 0.02)
        hidden = torch.randn(tokens, config.hidden_size, generator=g)
        if router_5:  # transformers 5: (logits, weights, indices)
            logits, hf_weights, hf_idx = gate(hidden)
        else:  # 4.57: (indices, weights) of [batch, seq, hidden]; the logits are its fp32 linear
            hf_idx, hf_weights = gate(hidden[None])
            logits = F.linear(hidden.float(), gate.weight.float())
        hf_map = torch.zeros_like(logits, dtype=torch.bool).scatter(1, hf_idx, True)
        hf_probs = torch.zeros_like(logits).scatter(1, hf_idx, hf_weights)
        probs, routing_map = topk_routing_with_score_function(logits, **kwargs)
        same = (hf_map == routing_map).all(-1)
        differ = (hf_map & ~routing_map).sum().item() / hf_idx.numel()
        out[name] = (differ, (probs - hf_probs)[same].abs().max().item(), kwargs)
    return out


def test_upstream_difference_group_limited_greedy_routes_differ_from_hf():
    """UPSTREAM DIFFERENCE, not PLT (not a skip): stock megatron-core routes DeepSeek-V2's group_limited_greedy
    differently from transformers. This asserts that the difference exists; if upstream fixes it, this fails and the
    warning (swift_plt/families/upstream.py) and docs/model-families.md must go. Greedy is the control:
    the same logits, the same experts and weights."""
    cases = {'group_limited_greedy': v2_config('group_limited_greedy'), 'greedy': v2_config('greedy', **LITE_ROUTING),
             'greedy_with_groups': v2_config('greedy')}
    (res, ) = spawn(_routes_hf_vs_megatron, 1, cases)
    differ, weight_err, kwargs = res['group_limited_greedy']
    # what mcore-bridge makes of the config: topk_method is not read, n_group / topk_group always are
    assert kwargs == dict(topk=6, use_pre_softmax=True, num_groups=8, group_topk=3, scaling_factor=16.0,
                          score_function='softmax')
    assert 0.05 < differ < 0.3, differ  # measured 17-18 % (3 seeds; hidden 64, router std 0.02)
    assert weight_err == 0.0  # where the groups agree, the experts and weights are HF's
    differ, weight_err, kwargs = res['greedy']
    assert (differ, weight_err) == (0.0, 0.0) and (kwargs['num_groups'], kwargs['group_topk']) == (1, 1)
    assert res['greedy_with_groups'][0] > 0.1  # measured 29 %: megatron limits the groups, HF greedy does not


# ------------------------------------------------------------------------ the hook in the patched argument class
def _patched_init_distributed(patch_size, model_dirs):
    """Run the patched MegatronSftArguments._init_distributed on a bare instance (upstream's own replaced by a
    recorder): what it logs through ms-swift's logger, and whether that came before upstream's start-up."""
    import logging

    from swift.megatron.arguments import MegatronSftArguments
    from swift.utils import get_logger

    patched = next(c for c in MegatronSftArguments.__mro__ if c.__dict__.get('_swift_plt'))
    upstream = patched.__mro__[1]
    events = []

    class Capture(logging.Handler):

        def emit(self, record):
            events.append((record.levelname, record.getMessage()))

    handler = Capture(level=logging.WARNING)
    logger = get_logger()
    logger.addHandler(handler)
    saved = upstream.__dict__['_init_distributed']
    upstream._init_distributed = lambda self: events.append(('upstream', '_init_distributed'))
    try:
        results = {}
        for method, model_dir in model_dirs.items():
            events.clear()
            args = object.__new__(MegatronSftArguments)  # as ms-swift has it then: config.json read, not loaded
            vars(args).update(patch_size=patch_size, value_clip_range=None, model_type='deepseek_v2',
                              model_dir=model_dir, model_info=SimpleNamespace(config=None, model_dir=model_dir),
                              megatron_model_meta=SimpleNamespace(model_type='gpt'), is_multimodal=False,
                              task_type='causal_lm', rlhf_type=None, mtp_num_layers=None, context_parallel_size=1,
                              max_length=64, packing_length=None, seq_length=None)
            args._init_distributed()
            results[method] = list(events)
    finally:
        upstream._init_distributed = saved
        logger.removeHandler(handler)
    return results


@pytest.mark.parametrize('patch_size', [None, 4])
def test_patched_arguments_warn_before_startup(patch_size, tmp_path):
    """Any K (stock Megatron at K=1 differs too): one WARNING line, before upstream's _init_distributed (which starts
    torch.distributed and megatron; step 1 comes later); none for greedy with one group (DeepSeek-V2-Lite)."""
    model_dirs = {'group_limited_greedy': str(tmp_path / 'v2'), 'greedy': str(tmp_path / 'v2_lite')}
    v2_config('group_limited_greedy').save_pretrained(model_dirs['group_limited_greedy'])
    v2_config('greedy', **LITE_ROUTING).save_pretrained(model_dirs['greedy'])
    (res, ) = spawn(_patched_init_distributed, 1, patch_size, model_dirs)
    (level, line), after = res['group_limited_greedy']
    assert level == 'WARNING' and line == upstream_difference_warnings(v2_config('group_limited_greedy'))[0]
    assert after == ('upstream', '_init_distributed')
    assert res['greedy'] == [('upstream', '_init_distributed')]


def test_warning_for_glm4_export_of_the_mlp():
    """GLM-4-0414 (any config): Megatron's export writes gate_proj / up_proj where transformers loads gate_up_proj
    (the difference itself is asserted on the exported weights in test_families_cpu.py); GLM-4.5 (glm4_moe) holds
    gate_proj / up_proj in transformers: no warning."""
    from transformers import Glm4Config
    (line, ) = upstream_difference_warnings(Glm4Config())
    assert line.startswith('[swift-plt] glm4: Megatron saves the MLP as mlp.gate_proj / mlp.up_proj')
    assert 'concatenate gate_proj and up_proj (dim 0) into gate_up_proj' in line and 'docs/model-families.md' in line
    assert 'logits rel 1.2' in DOCS
    assert upstream_difference_warnings(dict(model_type='glm4_moe', num_experts_per_tok=8, n_group=1)) == []


# ------------------------------------- the config-option matrix's differences (tests/models/test_config_matrix_cpu.py)
# There each is measured on a toy model (stock K=1 logits against transformers, K=4 against the brute force); here the
# warning's trigger: which config.json values warn and which do not.
def _longrope(**kw):
    return dict(model_type='llama', max_position_embeddings=512, **kw)


# the published config.json of Hunyuan-V3 (tencent/Hy3-preview) and Ling-mini-2.0 (inclusionAI/Ling-mini-2.0):
# tests/gpu/make_family_configs.py
HY_V3_PUBLISHED = mfc.HY3_PREVIEW
LING_PUBLISHED = mfc.LING_MINI_20
LONGROPE_PARAMS = dict(rope_type='longrope', short_factor=[1.0] * 8, long_factor=[2.0] * 8,
                       original_max_position_embeddings=16)


# MiniMax-M2's published config.json (QK-norm, sigmoid routing with the expert bias): tests/gpu/make_family_configs.py
MINIMAX_M2 = mfc.MINIMAX_M2


@pytest.mark.parametrize('config, needle', [
    (_longrope(rope_parameters=LONGROPE_PARAMS), 'Megatron uses short_factor up to 512 positions, transformers '
     'long_factor beyond 16'),
    (_longrope(rope_scaling=dict(LONGROPE_PARAMS, type='longrope')), 'rope_type=longrope'),
    (dict(model_type='deepseek_v3', scoring_func='softmax', num_experts_per_tok=2), 'Megatron routes by softmax'),
    (dict(model_type='glm4_moe', norm_topk_prob=False, num_experts_per_tok=8, n_group=1, topk_group=1),
     'Megatron renormalises the top-k expert weights anyway'),
    (dict(model_type='deepseek_v3', n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2,
          norm_topk_prob=True), 'top-1 expert scores, transformers by its top-2'),
    (dict(model_type='deepseek_v2', topk_method='greedy', n_group=1, topk_group=1, num_experts_per_tok=6,
          norm_topk_prob=True), 'Megatron renormalises the top-6 softmax weights'),
    (dict(model_type='qwen2', use_sliding_window=True, sliding_window=4096, max_window_layers=21,
          num_hidden_layers=28), 'Megatron attends over the whole sequence in every layer'),
    (dict(model_type='qwen3_moe', use_sliding_window=True, sliding_window=8, max_window_layers=0, num_hidden_layers=2,
          layer_types=['sliding_attention'] * 2), 'transformers within 8 tokens'),
    (dict(MINIMAX_M2, use_qk_norm=False), 'Megatron builds no QK-norm'),
    (dict(MINIMAX_M2, scoring_func=None), 'scoring_func=None: Megatron routes by softmax without the expert bias'),
    (dict(HY_V3_PUBLISHED, qk_norm=None), 'Megatron builds no QK-norm'),
    ({k: v for k, v in HY_V3_PUBLISHED.items() if not k.startswith('moe_router_')}, 'Megatron routes by softmax'),
    (dict(LING_PUBLISHED, num_experts_per_tok=4, topk_group=1, n_group=2), 'top-4 expert scores, Ling\'s own code by '
     'its top-2'),
    (dict(LING_PUBLISHED, use_qkv_bias=True), 'Megatron builds the QKV projection without it'),
    (dict(LING_PUBLISHED, use_bias=True), 'the output projection none'),
], ids=['longrope', 'longrope-v4-key', 'v3-softmax', 'glm4_moe-no-norm', 'v3-groups-top-1', 'v2-norm', 'qwen2-window',
        'qwen3_moe-window', 'minimax_m2-no-qk-norm', 'minimax_m2-no-scoring-func', 'hy_v3-no-qk-norm',
        'hy_v3-no-router-keys', 'ling-groups-top-4', 'ling-qkv-bias', 'ling-bias'])
def test_warning_for_matrix_differences(config, needle):
    (line, ) = upstream_difference_warnings(config)
    assert needle in line and '\n' not in line and 'upstream difference, not PLT' in line


@pytest.mark.parametrize('config', [
    _longrope(rope_parameters=LONGROPE_PARAMS, original_max_position_embeddings=16),  # megatron reads the top level
    _longrope(rope_parameters=dict(LONGROPE_PARAMS, original_max_position_embeddings=512)),
    _longrope(rope_parameters=dict(rope_type='yarn', factor=4.0, original_max_position_embeddings=16)),
    dict(model_type='dots1', scoring_func='softmax', num_experts_per_tok=6, norm_topk_prob=True),  # forced sigmoid
    dict(model_type='deepseek_v3', scoring_func='sigmoid', n_routed_experts=256, n_group=8, topk_group=4,
         num_experts_per_tok=8, norm_topk_prob=True),  # DeepSeek-V3: 8 // 4 = the top-2 sum
    dict(model_type='qwen3_moe', norm_topk_prob=False, num_experts_per_tok=8),  # softmax: megatron honours it
    dict(model_type='deepseek_v2', topk_method='greedy', n_group=1, topk_group=1, num_experts_per_tok=6,
         norm_topk_prob=False),
    # Qwen2.5's published configs: the window off, or on but from the last layer on (no sliding layer)
    dict(model_type='qwen2', use_sliding_window=False, sliding_window=32768, max_window_layers=28, num_hidden_layers=28),
    dict(model_type='qwen2', use_sliding_window=True, sliding_window=32768, max_window_layers=28, num_hidden_layers=28),
    dict(model_type='qwen2_moe', use_sliding_window=True, sliding_window=0, num_hidden_layers=2),  # 0: no window
    MINIMAX_M2,
    HY_V3_PUBLISHED,
    dict(HY_V3_PUBLISHED, moe_router_use_sigmoid=None),  # softmax with the expert bias: megatron-core refuses it
    LING_PUBLISHED,
    dict(LING_PUBLISHED, n_group=2, topk_group=1, num_experts_per_tok=2),  # the tiny family's: top-2 of one group
], ids=['longrope-top-level', 'longrope-no-gap', 'yarn', 'dots1-softmax', 'v3-published', 'qwen3_moe-no-norm',
        'v2-lite', 'qwen2.5-off', 'qwen2-no-sliding-layer', 'qwen2_moe-window-0', 'minimax_m2-published',
        'hy_v3-published', 'hy_v3-bias-only', 'ling-published', 'ling-tiny'])
def test_no_warning_for_matrix_values_that_agree(config):
    assert upstream_difference_warnings(config) == []


@pytest.mark.parametrize('mcore, q_lora_rank, warned', [('0.19.2', None, True), ('0.16.1', None, False),
                                                        ('0.19.2', 64, False)])
def test_warning_for_mla_without_q_lora_on_megatron_core_0_19(monkeypatch, mcore, q_lora_rank, warned):
    """megatron-core 0.19 puts a LayerNorm in front of MLA's query projection when there is no Q LoRA
    (DeepSeek-V2-Lite); 0.16 and a Q LoRA do not. Measured on GPU (tests/gpu/README.md)."""
    import swift_plt.compat.versions as versions
    monkeypatch.setattr(versions, 'installed_version', {'megatron-core': mcore}.get)
    config = dict(model_type='deepseek_v2', kv_lora_rank=32, q_lora_rank=q_lora_rank)
    lines = [line for line in upstream_difference_warnings(config) if 'q_lora_rank' in line]
    assert len(lines) == int(warned)
    assert not warned or 'megatron-core 0.19 builds the query projection with a LayerNorm' in lines[0]
