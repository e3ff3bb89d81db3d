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
TAIL = ' — upstream difference, not PLT (stock Megatron routes the same at K=1; docs/model-families.md)'


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
