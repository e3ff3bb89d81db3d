"""Where the stock Megatron model (mcore-bridge 1.6.5 + megatron-core 0.16.1, no plugin code, K = 1) computes
something other than transformers for a config.json, and PLT inherits it: one start-up warning line each.

MoE group-limited routing (DeepSeek-V2, V2.5, Coder-V2: ``topk_method: group_limited_greedy``).
mcore-bridge does not read ``topk_method``: ``mcore_bridge/config/parser.py`` maps ``n_group`` to
``moe_router_num_groups`` and ``topk_group`` to ``moe_router_group_topk`` for every topk_method, and megatron-core has
one group-limited rule (``megatron/core/transformer/moe/moe_utils.py``, ``group_limited_topk``)::

    group_scores = scores.view(num_tokens, num_groups, -1).topk(topk // group_topk, dim=-1)[0].sum(dim=-1)

i.e. a group scores the sum of its top ``num_experts_per_tok // topk_group`` expert scores (DeepSeek-V3's
``noaux_tc`` rule when that is 2). transformers' ``DeepseekV2TopkRouter`` (and DeepSeek's own modeling_deepseek.py)::

    greedy:               topk over all experts, n_group / topk_group unused
    group_limited_greedy: group_scores = scores.view(-1, n_group, E // n_group).max(dim=-1).values

So for group_limited_greedy with ``num_experts_per_tok // topk_group != 1`` (DeepSeek-V2: 6 // 3 = 2) the two sides
keep different groups for some tokens, and for ``greedy`` with ``n_group > 1`` Megatron limits the groups where
transformers does not. With the same router logits (fp32, ``tests/models/test_upstream_differences.py``) the expert
choices differ for 5-19 % of (token, choice) pairs depending on how peaked the router is (32 or 160 experts, 8 groups,
top-3 groups, top-6); the GPU parity on DeepSeek-V2's config (2 layers, 32 experts) measured 10.45 % (plain greedy:
0.62 %). Nothing differs where a token's groups are all kept (``n_group <= 1``, ``topk_group >= n_group``) or the
sum is over one expert (``num_experts_per_tok // topk_group == 1``: sum = max).

RoPE ``longrope`` (``rope_scaling`` / ``rope_parameters``, transformers 5 keeps ``original_max_position_embeddings``
inside them). transformers switches a sequence to ``long_factor`` when it is longer than
``original_max_position_embeddings``; mcore-bridge's ``longrope_frequency_update`` (``mcore_bridge/model/rope.py``)
compares with ``ModelConfig.original_max_position_embeddings``, which it fills from config.json's top level only,
else with ``max_position_embeddings``: sequences (patches at K > 1) between the two lengths get ``short_factor``
frequencies in Megatron. Tiny Llama (tests/models/test_config_matrix_cpu.py): K=1 logits rel 0.14 at 32 tokens with
16 original positions; none where both sides agree on the factor.

``scoring_func: softmax`` for families whose transformers router is sigmoid only (``deepseek_v3``, ``kimi_k2``,
``glm4_moe``, ``glm4_moe_lite``: transformers ignores the field); mcore-bridge maps it to
``moe_router_score_function``, so Megatron routes by softmax. Tiny DeepSeek-V3: K=1 logits rel 0.68 (0.10 with the
expert bias zero).

Sigmoid routing (transformers' ``noaux_tc`` router of ``deepseek_v3``, ``kimi_k2``, ``glm4_moe``, ``glm4_moe_lite``,
``dots1``): megatron-core renormalises the top-k sigmoid weights whatever ``norm_topk_prob`` says (toy GLM-4.5 /
DeepSeek-V3 with ``norm_topk_prob: false``: logits rel 6e-2), and scores a group by the sum of its top
``num_experts_per_tok // topk_group`` scores where transformers always sums the top 2 (equal for DeepSeek-V3's 8 // 4;
toy DeepSeek-V3 with 4 groups, top-2 groups, top-2 experts: logits rel 0.42). ``deepseek_v2`` with
``norm_topk_prob: true``: mcore-bridge makes megatron renormalise the top-k softmax weights (DeepSeek's own code
does too), transformers' DeepseekV2 never does (toy: logits rel 0.11). The published configs of
``tests/gpu/make_family_configs.py`` (DeepSeek-V2/V2-Lite/V3, Kimi-K2, GLM-4.5-Air, GLM-4.7-Flash, dots.llm1) set none
of these values.

Sliding windows of the Qwen2 / Qwen3 families (``use_sliding_window: true``: transformers attends within
``sliding_window`` tokens in layers ``max_window_layers`` on). mcore-bridge converts ``sliding_window`` for GPT-OSS
(and Gemma-4, MUSE) only (``mcore_bridge/config/parser.py``), so Megatron attends over the whole sequence in every
layer, at K = 1 and, over patches, at K > 1 (the HF-side PLT model keeps the window, in patches:
swift_plt/models/window.py). Toy Qwen2 (2 sliding layers, window 8): logits rel 0.60 at 64 tokens, 0 within the
first 8.

GLM-4-0414's MLP on export (``glm4``). transformers' ``Glm4ForCausalLM`` holds the MLP's first projection fused,
``mlp.gate_up_proj.weight`` ([gate; up]); mcore-bridge's ``Glm4Bridge`` loads it, but its export
(``GPTBridge._set_mlp_state``, to HF) writes every dense MLP as ``mlp.gate_proj.weight`` / ``mlp.up_proj.weight``, so
a checkpoint Megatron saves (``--save_safetensors``, ``swift export --to_hf``) loads into transformers 5.19 / 4.57 with
``gate_up_proj`` missing, freshly initialised (the two halves unexpected). Training is not affected: the logits of the
stock model equal transformers' (toy GLM-4: max |d| 1e-6). Toy GLM-4 exported unchanged and reloaded: logits rel 1.2.

MiniMax-M2 (``minimax_m2``) without its published ``use_qk_norm: true`` / ``scoring_func: sigmoid`` (e.g. a
config.json written by transformers' ``MiniMaxM2Config``, which has neither field). transformers' MiniMaxM2 always
applies ``q_norm`` / ``k_norm`` and routes by sigmoid with ``e_score_correction_bias``; mcore-bridge reads both fields
(``use_qk_norm`` -> ``qk_layernorm``, ``scoring_func`` -> ``moe_router_score_function``, softmax by default, and
then no expert bias), so Megatron has no QK-norm (toy MiniMax-M2: logits rel 0.83) or routes by softmax (rel 0.27).

Hunyuan-V3 (``hy_v3``) config.json without the published keys mcore-bridge reads: transformers' HYV3 always
normalises q and k per head and routes by sigmoid with the expert bias (it ignores ``qk_norm``,
``moe_router_use_sigmoid``, ``moe_router_enable_expert_bias``); mcore-bridge builds QK-norm only with ``qk_norm: true``
(without it the checkpoint's q_norm / k_norm weights are left unread) and routes by softmax, without the bias, unless
``moe_router_use_sigmoid`` (or ``scoring_func``) says sigmoid or the expert bias is enabled (a softmax router with the
bias is refused by megatron-core itself). Toy Hunyuan-V3 (tiny_families): no ``qk_norm``: logits rel 0.52; neither
routing key: logits rel 0.10; the published keys: max |d| 1.0e-6.

Ling/Ring 2.0 (``bailing_moe``; no transformers class: the reference is its published modeling code, written out in
tests/harness/bailing_moe.py). Its gate scores a group by the sum of its top 2 expert scores; megatron-core by the sum
of its top ``num_experts_per_tok // topk_group`` (equal for the published 8 // 4). mcore-bridge reads the attention
biases from ``use_bias`` (the QKV projection's, and no output bias) where the model has ``use_qkv_bias`` (QKV) and
``use_bias`` (output): a config.json with either true gets biases transformers' model does not have, or lacks its
own. Toy Ling 2.0 (8 experts in 2 groups, top-1 group): top-4: logits rel 0.12; ``use_qkv_bias``: rel 0.48;
``use_bias``: rel 0.71; the published values: max |d| 9.8e-7.

Logged at start-up by the plugin's ``MegatronArguments._init_distributed``
(swift_plt/plugin/patches/swift_megatron_arguments.py), at any K: the stock model differs too.
"""
import json
import os
from typing import List

# The measured size of the group_limited_greedy difference (module docstring).
GROUP_MAX_VS_SUM_SIZE = ('about 10 % of expert choices differ from transformers (10.45 % for DeepSeek-V2\'s shape on '
                         'GPU, fp32; 5-19 % on random router logits)')
GREEDY_GROUPS_SIZE = ('about 29 % of expert choices differ from transformers at 8 groups, top-3 (random router logits, '
                      'fp32)')
LONGROPE_SIZE = 'toy Llama: logits rel 0.14 at twice the original length'
SCORING_SIZE = 'other experts and weights for most tokens (toy DeepSeek-V3: logits rel {size})'
V2_NORM_SIZE = 'every routed expert weight differs (toy DeepSeek-V2: logits rel 0.11)'
SIGMOID_ONLY = ('deepseek_v3', 'kimi_k2', 'glm4_moe', 'glm4_moe_lite')
# families whose transformers router is DeepSeek-V3's noaux_tc (sigmoid + bias, groups by their top-2 sum)
NOAUX_TC = SIGMOID_ONLY + ('dots1', )
NOAUX_GROUP_SIZE = 'toy DeepSeek-V3, 8 experts in 4 groups, top-2 groups, top-2: logits rel {size}'
WINDOW_SIZE = 'toy Qwen2, window 8: logits rel 0.6 at 64 tokens'
# families whose transformers class takes use_sliding_window / max_window_layers, dropped by mcore-bridge
DROPPED_WINDOW = ('qwen2', 'qwen2_moe', 'qwen3', 'qwen3_moe')
MINIMAX_QK_SIZE = 'toy MiniMax-M2: logits rel 0.83'
MINIMAX_SCORING_SIZE = 'toy MiniMax-M2: logits rel 0.27'
SIGMOID_NORM_SIZE = 'every routed expert weight differs (toy DeepSeek-V3 / GLM-4.5: logits rel {size})'
GATE_UP_EXPORT_SIZE = 'toy GLM-4 exported unchanged and reloaded: logits rel 1.2'
# families whose transformers class holds the dense MLP as gate_up_proj where mcore-bridge exports gate_proj / up_proj
GATE_UP_EXPORT = ('glm4', )
HY_V3_QK_SIZE = 'toy Hunyuan-V3: logits rel 0.52'
HY_V3_ROUTER_SIZE = 'toy Hunyuan-V3: logits rel 0.10'
BAILING_GROUP_SIZE = 'toy Ling 2.0, 2 groups of 4 experts, top-1 group, top-4: logits rel 0.12'
BAILING_BIAS_SIZE = 'toy Ling 2.0: logits rel {size}'
MLA_Q_NORM_SIZE = ('DeepSeek-V2-Lite cut on GPU, fp32: K=4 loss rel 5.5e-6 against 1.1e-7 on megatron-core 0.16.1, '
                   '1.6 % of expert routes differ')
TAIL = ' — upstream difference, not PLT (stock Megatron does the same at K=1; docs/model-families.md)'


def _get(config, key):
    return config.get(key) if isinstance(config, dict) else getattr(config, key, None)


def _llm_configs(hf_config):
    """The config and the language-model configs it nests (mcore-bridge reads the same keys: parser._convert_config)."""
    yield hf_config
    for key in ('text_config', 'llm_config', 'thinker_config'):
        sub = _get(hf_config, key)
        if sub is not None:
            yield sub


def _group_limit(config):
    """(n_group, topk_group, topk) where megatron-core limits a token to some of the groups, else None."""
    n_group, topk_group, topk = _get(config, 'n_group'), _get(config, 'topk_group'), _get(config, 'num_experts_per_tok')
    if not (n_group and topk_group and topk) or n_group <= 1 or topk_group >= n_group:
        return None
    return n_group, topk_group, topk


def upstream_difference_warnings(hf_config) -> List[str]:
    """One line per difference between the stock Megatron model and transformers that this config.json triggers
    (empty: none known). Pure: reads the HF config (a ``PretrainedConfig`` or the config.json dict) only."""
    if hf_config is None:
        return []
    out = []
    for config in _llm_configs(hf_config):
        model_type = _get(config, 'model_type') or 'model'
        out += _rope_warnings(config, model_type) + _scoring_warnings(config, model_type)
        out += _noaux_tc_warnings(config, model_type) + _window_warnings(config, model_type)
        out += _export_warnings(model_type)
        out += _minimax_m2_warnings(config, model_type)
        out += _hy_v3_warnings(config, model_type) + _bailing_warnings(config, model_type)
        out += _mla_q_norm_warnings(config, model_type)
        topk = _get(config, 'num_experts_per_tok')
        if model_type == 'deepseek_v2' and _get(config, 'norm_topk_prob') is True and topk and topk > 1:
            out.append(f'[swift-plt] {model_type}: config.json norm_topk_prob=true: Megatron renormalises the '
                       f'top-{topk} softmax weights (as DeepSeek\'s own modeling_deepseek.py), transformers\' '
                       'DeepseekV2 does not; ' + V2_NORM_SIZE + TAIL)
        # transformers' DeepseekV2Config defaults to greedy where config.json names no topk_method
        method = _get(config, 'topk_method') or ('greedy' if model_type == 'deepseek_v2' else None)
        limit = _group_limit(config)
        if method not in ('group_limited_greedy', 'greedy') or limit is None:
            continue
        n_group, topk_group, topk = limit
        head = (f'[swift-plt] {model_type}: config.json topk_method={method} (n_group {n_group}, topk_group '
                f'{topk_group}, num_experts_per_tok {topk}): ')
        per_group = topk // topk_group
        if method == 'group_limited_greedy' and per_group != 1:
            out.append(head + f'Megatron keeps a token\'s {topk_group} groups by the sum of each group\'s top-'
                       f'{per_group} expert scores, transformers by the max; {GROUP_MAX_VS_SUM_SIZE}' + TAIL)
        elif method == 'greedy':
            out.append(head + f'Megatron limits each token to {topk_group} of the {n_group} expert groups, '
                       f'transformers\' greedy routing to none; {GREEDY_GROUPS_SIZE}' + TAIL)
    return out


def _rope_params(config):
    for key in ('rope_scaling', 'rope_parameters'):
        value = _get(config, key)
        if isinstance(value, dict) and value:
            return value
    return {}


def _rope_warnings(config, model_type) -> List[str]:
    rope = _rope_params(config)
    if (rope.get('rope_type') or rope.get('type')) != 'longrope':
        return []
    original, top = rope.get('original_max_position_embeddings'), _get(config, 'original_max_position_embeddings')
    max_pos = _get(config, 'max_position_embeddings')
    if top is not None or original is None or max_pos is None or original >= max_pos:
        return []  # megatron reads the top-level field, or there is no length between the two
    return [f'[swift-plt] {model_type}: config.json rope_type=longrope (original_max_position_embeddings {original} '
            f'in the rope parameters, max_position_embeddings {max_pos}): Megatron uses short_factor up to '
            f'{max_pos} positions, transformers long_factor beyond {original} (sequences of {original + 1}-{max_pos} '
            f'positions, patches at K > 1, get other RoPE frequencies; {LONGROPE_SIZE})' + TAIL]


def _window_warnings(config, model_type) -> List[str]:
    window, first = _get(config, 'sliding_window'), _get(config, 'max_window_layers') or 0
    layers = _get(config, 'num_hidden_layers') or 0
    types = _get(config, 'layer_types')
    sliding = 'sliding_attention' in types if types else first < layers
    if model_type not in DROPPED_WINDOW or not _get(config, 'use_sliding_window') or not window or not sliding:
        return []
    return [f'[swift-plt] {model_type}: config.json use_sliding_window=true (sliding_window {window}, from layer '
            f'{first} on): Megatron attends over the whole sequence in every layer (mcore-bridge drops the window), '
            f'transformers within {window} tokens; longer sequences differ ({WINDOW_SIZE})' + TAIL]


def _export_warnings(model_type) -> List[str]:
    if model_type not in GATE_UP_EXPORT:
        return []
    return [f'[swift-plt] {model_type}: Megatron saves the MLP as mlp.gate_proj / mlp.up_proj, transformers\' '
            f'{model_type} loads mlp.gate_up_proj only: a checkpoint saved from Megatron (--save_safetensors, swift '
            'export --to_hf) loads into transformers with its MLP freshly initialised; concatenate gate_proj and '
            f'up_proj (dim 0) into gate_up_proj before loading it ({GATE_UP_EXPORT_SIZE})' + TAIL]


def _scoring_warnings(config, model_type) -> List[str]:
    scoring = _get(config, 'scoring_func')
    if model_type not in SIGMOID_ONLY or scoring in (None, 'sigmoid'):
        return []
    return [f'[swift-plt] {model_type}: config.json scoring_func={scoring}: Megatron routes by {scoring}, '
            f'transformers\' {model_type} by sigmoid whatever the field says; '
            + SCORING_SIZE.format(size='0.1-0.7') + TAIL]


def _group_score_warnings(config, head, reference, size) -> List[str]:
    """Group-limited routing: megatron-core scores a group by the sum of its top ``num_experts_per_tok // topk_group``
    expert scores; ``reference`` (transformers' noaux_tc, Ling's code) by its top 2."""
    limit = _group_limit(config)
    if limit is None or limit[2] // limit[1] == 2:
        return []
    n_group, topk_group, topk = limit
    return [head + f'n_group {n_group}, topk_group {topk_group}, num_experts_per_tok {topk}: Megatron keeps a '
            f'token\'s {topk_group} groups by the sum of each group\'s top-{topk // topk_group} expert scores, '
            f'{reference}; ' + size + TAIL]


def _noaux_tc_warnings(config, model_type) -> List[str]:
    """Sigmoid routing (transformers' noaux_tc router): megatron-core renormalises the top-k weights whatever
    norm_topk_prob says (``moe_utils.topk_routing_with_score_function``), and scores a group by the sum of its top
    ``num_experts_per_tok // topk_group`` scores where transformers takes its top 2."""
    if model_type not in NOAUX_TC or _get(config, 'scoring_func') not in (None, 'sigmoid'):
        return []
    out, head = [], f'[swift-plt] {model_type}: config.json '
    out += _group_score_warnings(config, head, 'transformers by its top-2 (noaux_tc)',
                                 NOAUX_GROUP_SIZE.format(size='0.42'))
    topk = _get(config, 'num_experts_per_tok')
    if _get(config, 'norm_topk_prob') is False and topk and topk > 1:
        out.append(head + 'norm_topk_prob=false with sigmoid routing: Megatron renormalises the top-k expert weights '
                   'anyway, transformers does not; ' + SIGMOID_NORM_SIZE.format(size='6e-2') + TAIL)
    return out


def _megatron_score_function(config) -> str:
    """The router score function mcore-bridge gives Megatron (``parser._convert_config``: the first of
    ``scoring_func``, a true ``moe_router_use_sigmoid``, ``score_function``; else megatron-core's softmax)."""
    if _get(config, 'scoring_func') is not None:
        return _get(config, 'scoring_func')
    if _get(config, 'moe_router_use_sigmoid'):
        return 'sigmoid'
    return _get(config, 'score_function') or 'softmax'


def _megatron_qk_norm(config) -> bool:
    """Whether mcore-bridge builds QK-norm from config.json (``parser._convert_config``: the first of ``use_qk_norm``,
    ``qk_norm`` that is set)."""
    return bool(next((v for v in (_get(config, 'use_qk_norm'), _get(config, 'qk_norm')) if v is not None), False))


def _minimax_m2_warnings(config, model_type) -> List[str]:
    """MiniMax-M2: transformers always applies QK-norm and sigmoid routing; Megatron only where config.json says so."""
    if model_type != 'minimax_m2':
        return []
    out, head = [], f'[swift-plt] {model_type}: config.json '
    if not _megatron_qk_norm(config):
        out.append(head + f'use_qk_norm={_get(config, "use_qk_norm")}: Megatron builds no QK-norm (mcore-bridge reads '
                   'use_qk_norm), transformers\' MiniMaxM2 always applies q_norm and k_norm; ' + MINIMAX_QK_SIZE + TAIL)
    scoring = _megatron_score_function(config)
    if scoring != 'sigmoid':
        out.append(head + f'scoring_func={_get(config, "scoring_func")}: Megatron routes by {scoring} without the '
                   'expert bias, transformers\' MiniMaxM2 by sigmoid with e_score_correction_bias whatever the field '
                   'says; ' + MINIMAX_SCORING_SIZE + TAIL)
    return out


def _hy_v3_warnings(config, model_type) -> List[str]:
    """Hunyuan-V3 config.json without the keys that make mcore-bridge build transformers' HYV3 (module docstring)."""
    if model_type != 'hy_v3':
        return []
    out, head = [], f'[swift-plt] {model_type}: config.json '
    if not _megatron_qk_norm(config):
        out.append(head + 'has no qk_norm=true: Megatron builds no QK-norm (the checkpoint\'s q_norm / k_norm are not '
                   'loaded), transformers\' HYV3 always normalises q and k per head; ' + HY_V3_QK_SIZE + TAIL)
    if _megatron_score_function(config) != 'sigmoid' and not _get(config, 'moe_router_enable_expert_bias'):
        out.append(head + 'has neither moe_router_use_sigmoid=true nor moe_router_enable_expert_bias=true: Megatron '
                   'routes by softmax without the expert bias, transformers\' HYV3 by sigmoid with it; '
                   + HY_V3_ROUTER_SIZE + TAIL)
    return out


def _bailing_warnings(config, model_type) -> List[str]:
    """Ling/Ring 2.0 config.json values whose Megatron model differs from its own modeling code (module docstring)."""
    if model_type != 'bailing_moe':
        return []
    out, head = [], f'[swift-plt] {model_type}: config.json '
    out += _group_score_warnings(config, head, 'Ling\'s own code by its top-2', BAILING_GROUP_SIZE)
    if _get(config, 'use_qkv_bias'):
        out.append(head + 'use_qkv_bias=true: Megatron builds the QKV projection without it (mcore-bridge reads '
                   'use_bias for that bias), the checkpoint\'s own code adds it; '
                   + BAILING_BIAS_SIZE.format(size='0.48') + TAIL)
    if _get(config, 'use_bias'):
        out.append(head + 'use_bias=true: Megatron gives the QKV projection a bias its bridge does not load and the '
                   'output projection none, the checkpoint\'s own code the reverse; '
                   + BAILING_BIAS_SIZE.format(size='0.71') + TAIL)
    return out


def _mla_q_norm_warnings(config, model_type) -> List[str]:
    """MLA without a Q LoRA (``q_lora_rank: null``, e.g. DeepSeek-V2-Lite) on megatron-core >= 0.19: its QK-norm
    resolver (``transformer/mla_qk_norm_config.py``) builds ``linear_q_proj`` as Transformer Engine's
    LayerNorm+Linear, a norm on the query input that transformers does not have and the checkpoint does not hold
    (weight 1); 0.16 builds a plain linear. The one check here that reads the installed megatron-core."""
    from swift_plt.compat.versions import megatron_core_at_least
    if (not _get(config, 'kv_lora_rank') or _get(config, 'q_lora_rank') is not None or model_type == 'deepseek'
            or not megatron_core_at_least((0, 19))):
        return []
    return [f'[swift-plt] {model_type}: config.json q_lora_rank=null (MLA without a query LoRA): megatron-core 0.19 '
            'builds the query projection with a LayerNorm in front (weight 1, not in the checkpoint) that '
            f'transformers does not have ({MLA_Q_NORM_SIZE}); megatron-core 0.16 has none' + TAIL]


def run_hf_config(args):
    """The run's HF config: ``args.model_info.config`` where ms-swift has loaded it, else the config.json dict of
    ``args.model_dir`` (at argument time ms-swift 4.6 has not: ModelInfo.config is set when the model is loaded)."""
    info = getattr(args, 'model_info', None)
    config = getattr(info, 'config', None)
    if config is not None:
        return config
    model_dir = getattr(args, 'model_dir', None) or getattr(info, 'model_dir', None)
    path = os.path.join(model_dir, 'config.json') if model_dir else None
    if path and os.path.isfile(path):
        with open(path) as f:
            return json.load(f)
    return None


def warn_upstream_differences(args) -> List[str]:
    """Log ``upstream_difference_warnings`` of the run's config.json (``run_hf_config``) with ms-swift's logger on
    rank 0, before step 1; returns the lines (all ranks)."""
    lines = upstream_difference_warnings(run_hf_config(args))
    if lines:
        from swift.utils import get_logger, is_master
        if is_master():
            logger = get_logger()
            for line in lines:
                logger.warning(line)
    return lines
