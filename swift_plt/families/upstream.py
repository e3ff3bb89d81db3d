"""Where the stock Megatron model (mcore-bridge + megatron-core, no plugin code, K = 1) computes something other than
transformers for a config.json, and PLT inherits it: one start-up warning line each (the checks every config gets
here; a family's own in its record). What each difference is and its measured size: docs/model-families.md."""
import json
import os
from typing import List

from swift_plt.families.registry import family
from swift_plt.families.upstream_keys import TAIL, get, group_limit, head


def _llm_configs(hf_config):
    """The config and the language-model configs it nests (mcore-bridge reads the same keys: parser._convert_config)."""
    yield hf_config
    for key in ('text_config', 'llm_config', 'thinker_config'):
        sub = get(hf_config, key)
        if sub is not None:
            yield sub


def _rope_params(config):
    for key in ('rope_scaling', 'rope_parameters'):
        value = get(config, key)
        if isinstance(value, dict) and value:
            return value
    return {}


def longrope(config, model_type) -> List[str]:
    """transformers switches to ``long_factor`` beyond ``original_max_position_embeddings``; mcore-bridge reads that
    field from config.json's top level only (else ``max_position_embeddings``)."""
    rope = _rope_params(config)
    if (rope.get('rope_type') or rope.get('type')) != 'longrope':
        return []
    original, top = rope.get('original_max_position_embeddings'), get(config, 'original_max_position_embeddings')
    max_pos = get(config, 'max_position_embeddings')
    if top is not None or original is None or max_pos is None or original >= max_pos:
        return []  # megatron reads the top-level field, or there is no length between the two
    return [head(model_type) + f'rope_type=longrope (original_max_position_embeddings {original} in the rope '
            f'parameters, max_position_embeddings {max_pos}): Megatron uses short_factor up to {max_pos} positions, '
            f'transformers long_factor beyond {original} (sequences of {original + 1}-{max_pos} positions, patches at '
            'K > 1, get other RoPE frequencies)' + TAIL]


def topk_method(config, model_type) -> List[str]:
    """mcore-bridge ignores ``topk_method``: megatron-core's one group-limited rule scores a group by the sum of its
    top ``topk // topk_group`` experts; transformers' group_limited_greedy by the max, its greedy limits no group."""
    f = family(model_type)
    method = get(config, 'topk_method') or (f.default_topk_method if f else None)
    limit = group_limit(config)
    if method not in ('group_limited_greedy', 'greedy') or limit is None:
        return []
    n_group, topk_group, topk = limit
    line = (f'[swift-plt] {model_type}: config.json topk_method={method} (n_group {n_group}, topk_group {topk_group}, '
            f'num_experts_per_tok {topk}): ')
    if method == 'greedy':
        return [line + f'Megatron limits each token to {topk_group} of the {n_group} expert groups, transformers\' '
                'greedy routing to none; some expert choices differ' + TAIL]
    if topk // topk_group == 1:
        return []  # the sum over one expert is the max
    return [line + f'Megatron keeps a token\'s {topk_group} groups by the sum of each group\'s '
            f'top-{topk // topk_group} expert scores, transformers by the max; some expert choices differ' + TAIL]


def mla_q_norm(config, model_type) -> List[str]:
    """MLA without a Q LoRA (``q_lora_rank: null``, e.g. DeepSeek-V2-Lite) on megatron-core >= 0.19: its QK-norm
    resolver builds ``linear_q_proj`` as Transformer Engine's LayerNorm+Linear (a norm transformers does not have, not
    in the checkpoint); 0.16 builds a plain linear. The one check that reads the installed megatron-core."""
    from swift_plt.compat.versions import megatron_core_at_least
    f = family(model_type)
    if (not get(config, 'kv_lora_rank') or get(config, 'q_lora_rank') is not None or (f is not None and not f.mla)
            or not megatron_core_at_least((0, 19))):
        return []
    return [head(model_type) + 'q_lora_rank=null (MLA without a query LoRA): megatron-core 0.19 builds the query '
            'projection with a LayerNorm in front (weight 1, not in the checkpoint) that transformers does not have; '
            'megatron-core 0.16 has none' + TAIL]


def upstream_difference_warnings(hf_config) -> List[str]:
    """One line per difference between the stock Megatron model and transformers that this config.json triggers
    (empty: none known). Pure: reads the HF config (a ``PretrainedConfig`` or the config.json dict) only."""
    if hf_config is None:
        return []
    out = []
    for config in _llm_configs(hf_config):
        model_type = get(config, 'model_type') or 'model'
        f = family(model_type)
        for check in (longrope, *(f.upstream_checks if f else ()), mla_q_norm, topk_method):
            out += check(config, model_type)
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
