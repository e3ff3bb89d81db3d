"""How mcore-bridge 1.6.5 reads a config.json (``mcore_bridge/config/parser.py``), for the upstream-difference checks
of the family records: pure functions of the HF config (a ``PretrainedConfig`` or the config.json dict)."""
from typing import List

# every warning ends so; the measured sizes are in docs/model-families.md ("Config options checked")
TAIL = ' — upstream difference, not PLT (stock Megatron does the same at K=1; docs/model-families.md)'


def get(config, key):
    return config.get(key) if isinstance(config, dict) else getattr(config, key, None)


def head(model_type: str) -> str:
    return f'[swift-plt] {model_type}: config.json '


def group_limit(config):
    """(n_group, topk_group, topk) where megatron-core limits a token to some of the expert groups, else None."""
    n_group, topk_group, topk = get(config, 'n_group'), get(config, 'topk_group'), get(config, 'num_experts_per_tok')
    if not (n_group and topk_group and topk) or n_group <= 1 or topk_group >= n_group:
        return None
    return n_group, topk_group, topk


def group_score_warnings(config, line_head: str, reference: str) -> List[str]:
    """Group-limited routing: megatron-core scores a group by the sum of its top ``num_experts_per_tok // topk_group``
    expert scores; ``reference`` (transformers' noaux_tc, Ling's code) by its top 2."""
    limit = group_limit(config)
    if limit is None or limit[2] // limit[1] == 2:
        return []
    n_group, topk_group, topk = limit
    return [line_head + f'n_group {n_group}, topk_group {topk_group}, num_experts_per_tok {topk}: Megatron keeps a '
            f'token\'s {topk_group} groups by the sum of each group\'s top-{topk // topk_group} expert scores, '
            f'{reference}' + TAIL]


def megatron_score_function(config) -> str:
    """The router score function mcore-bridge gives Megatron: the first of ``scoring_func``, a true
    ``moe_router_use_sigmoid``, ``score_function``; else megatron-core's softmax."""
    if get(config, 'scoring_func') is not None:
        return get(config, 'scoring_func')
    if get(config, 'moe_router_use_sigmoid'):
        return 'sigmoid'
    return get(config, 'score_function') or 'softmax'


def megatron_qk_norm(config) -> bool:
    """Whether mcore-bridge builds QK-norm: the first of ``use_qk_norm``, ``qk_norm`` that is set."""
    return bool(next((v for v in (get(config, 'use_qk_norm'), get(config, 'qk_norm')) if v is not None), False))


def sigmoid_only_scoring(config, model_type) -> List[str]:
    """transformers' router of the family is sigmoid only (it ignores ``scoring_func``); mcore-bridge maps the field
    to ``moe_router_score_function``."""
    scoring = get(config, 'scoring_func')
    if scoring in (None, 'sigmoid'):
        return []
    return [head(model_type) + f'scoring_func={scoring}: Megatron routes by {scoring}, transformers\' {model_type} by '
            'sigmoid whatever the field says; other experts and weights for most tokens' + TAIL]


def noaux_tc(config, model_type) -> List[str]:
    """transformers' noaux_tc router (sigmoid + bias): megatron-core renormalises the top-k weights whatever
    norm_topk_prob says, and scores a group by the sum of its top ``topk // topk_group`` where transformers takes 2."""
    if get(config, 'scoring_func') not in (None, 'sigmoid'):
        return []
    out = group_score_warnings(config, head(model_type), 'transformers by its top-2 (noaux_tc)')
    topk = get(config, 'num_experts_per_tok')
    if get(config, 'norm_topk_prob') is False and topk and topk > 1:
        out.append(head(model_type) + 'norm_topk_prob=false with sigmoid routing: Megatron renormalises the top-k '
                   'expert weights anyway, transformers does not; every routed expert weight differs' + TAIL)
    return out


def dropped_sliding_window(config, model_type) -> List[str]:
    """``use_sliding_window`` of the Qwen2 / Qwen3 families: mcore-bridge converts ``sliding_window`` for GPT-OSS
    only, so Megatron attends over the whole sequence in every layer."""
    window, first = get(config, 'sliding_window'), get(config, 'max_window_layers') or 0
    layers = get(config, 'num_hidden_layers') or 0
    types = get(config, 'layer_types')
    sliding = 'sliding_attention' in types if types else first < layers
    if not get(config, 'use_sliding_window') or not window or not sliding:
        return []
    return [head(model_type) + f'use_sliding_window=true (sliding_window {window}, from layer {first} on): Megatron '
            f'attends over the whole sequence in every layer (mcore-bridge drops the window), transformers within '
            f'{window} tokens; longer sequences differ' + TAIL]
