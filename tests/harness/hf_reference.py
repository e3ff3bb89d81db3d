"""The HF reference models (``hf_logits``, ``hf_plt_reference``) compute what transformers 5 computes, on 4.57 too.

DeepSeek-V2 under YaRN: transformers 4.57's ``DeepseekV2Attention`` scales the attention scores by
``qk_head_dim ** -0.5`` only. DeepSeek's own modeling_deepseek.py, transformers 5 (``yarn_apply_mscale``), 4.57's own
``DeepseekV3Attention`` and megatron-core's MLA (``softmax_scale``) multiply that by ``mscale(factor,
mscale_all_dim) ** 2``. On 4.57 the reference gets that factor; the tiny ``deepseek_v2`` (factor 40, mscale_all_dim
0.707: x1.59) otherwise differs from Megatron (K=4 loss rel 4e-4) and from 4.57's reference by exactly this."""
import math


def as_transformers_5(model):
    """``model`` (a transformers causal LM, just loaded) with 4.57's difference above set as transformers 5 has it;
    unchanged on transformers 5. Returns ``model``."""
    from swift_plt.compat.transformers import is_transformers_5
    config = model.config
    rope = getattr(config, 'rope_scaling', None) or {}
    if is_transformers_5() or config.model_type != 'deepseek_v2' or not rope.get('mscale_all_dim'):
        return model
    if rope.get('rope_type', rope.get('type', 'default')) == 'default':
        return model
    factor = rope['factor']
    mscale = 0.1 * rope['mscale_all_dim'] * math.log(factor) + 1.0 if factor > 1 else 1.0
    layers = [m for m in model.modules() if type(m).__name__ == 'DeepseekV2Attention']
    assert layers, type(model)
    for attn in layers:
        assert attn.scaling == attn.qk_head_dim**-0.5, attn.scaling  # 4.57's: without the mscale
        attn.scaling = attn.scaling * mscale * mscale
    return model
