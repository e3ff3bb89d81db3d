"""Tiny random-init HF models of the families (their records' ``Tiny`` specs), with the offline BPE tokenizer of
``swift_plt.tools.tiny``: small enough for CPU runs of ``megatron pt --model DIR --model_type FAMILY``."""
import os
from typing import Any, Dict, Tuple

from swift_plt import families
from swift_plt.compat.transformers import hf_rope_guard
from swift_plt.tools.tiny import _fork_rng, _train_tokenizer, make_tokenizer_config_portable

_TINY = {t: f.tiny for t, f in families.FAMILIES.items() if f.tiny is not None}  # the records' tiny specs
# the structures every harness test builds
FAMILIES: Tuple[str, ...] = tuple(t for t, tiny in _TINY.items() if tiny.core)
# the hybrid Gated-DeltaNet decoders: 3 linear-attention layers, then 1 gated full-attention layer
HYBRID_FAMILIES: Tuple[str, ...] = tuple(t for t in _TINY if families.FAMILIES[t].linear_attention)
# the structures of the other families, built on demand (tests/models/test_families_cpu.py)
MORE_FAMILIES: Tuple[str, ...] = tuple(t for t in _TINY if t not in FAMILIES + HYBRID_FAMILIES)

_COMMON: Dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    initializer_range=0.05,  # > the usual 0.02: logits far from zero, so comparisons tell
    tie_word_embeddings=False,
)


def unavailable(family: str):
    """Why this transformers cannot build ``family`` (no such config class: Qwen3.5 needs transformers 5), else None."""
    import transformers
    config_cls = _TINY[family].config_cls
    if not hasattr(transformers, config_cls):
        return f'transformers {transformers.__version__} has no {config_cls} (family {family})'
    return None


def make_tiny_family(family: str, out_dir: str, vocab_size: int = 512, seed: int = 0, **overrides) -> str:
    """Write a random-init fp32 HF causal LM of ``family`` (one of ``FAMILIES + MORE_FAMILIES``) and its BPE
    tokenizer (``<unk> <s> </s> <pad>`` = ids 0..3) to ``out_dir``; return it. ``overrides`` replace config fields."""
    import torch
    import transformers

    if family not in _TINY:
        raise ValueError(f'unknown family {family!r}; one of {FAMILIES + MORE_FAMILIES + HYBRID_FAMILIES}')
    if vocab_size < 300:
        raise ValueError('vocab_size must be >= 300 (256 byte tokens + specials + merges).')
    tiny = _TINY[family]
    config_cls, model_cls = tiny.config_cls, tiny.model_cls
    kwargs = {**_COMMON, **tiny.kwargs, **overrides}
    os.makedirs(out_dir, exist_ok=True)
    tokenizer = _train_tokenizer(vocab_size, seed, kwargs['max_position_embeddings'])
    tokenizer.save_pretrained(out_dir)
    make_tokenizer_config_portable(out_dir)
    ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id)
    if tiny.vision is not None:  # text_config + vision_config; media ids past the text
        config = getattr(transformers, config_cls)(
            text_config=dict(vocab_size=vocab_size, **ids, **kwargs), vision_config=tiny.vision,
            image_token_id=vocab_size - 4, video_token_id=vocab_size - 3, vision_start_token_id=vocab_size - 2,
            vision_end_token_id=vocab_size - 1, tie_word_embeddings=kwargs['tie_word_embeddings'])
    else:
        config = getattr(transformers, config_cls)(vocab_size=vocab_size, **ids, **kwargs)
    with _fork_rng(seed), hf_rope_guard():
        model = getattr(transformers, model_cls)(config).float()
        for name, buf in model.named_buffers():
            if name.endswith('e_score_correction_bias'):  # zeros at init: make the expert-bias path matter
                buf.copy_(0.1 * torch.randn_like(buf))
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith('.sinks'):  # N(0, 0.05) at init: sinks of order 1 take a visible share of attention
                    param.copy_(torch.randn_like(param))
                elif name.endswith(('experts.gate_up_proj_bias', 'experts.down_proj_bias')):  # zeros at init
                    param.copy_(0.1 * torch.randn_like(param))
                elif tiny.norm_scale and name.endswith('norm.weight'):
                    param.copy_(1.0 + tiny.norm_scale * torch.randn_like(param))
                elif tiny.random_biases and name.endswith('.bias'):
                    param.copy_(0.1 * torch.randn_like(param))
    model.save_pretrained(out_dir, safe_serialization=True)
    if 'full_attention_interval' in kwargs:  # transformers 5 keeps layer_types only; mcore-bridge reads the interval
        _set_config_field(out_dir, 'full_attention_interval', kwargs['full_attention_interval'])
    return out_dir


def _set_config_field(out_dir: str, name: str, value) -> None:
    """Write ``name`` into config.json (its text_config for a multimodal checkpoint)."""
    import json
    path = os.path.join(out_dir, 'config.json')
    with open(path) as f:
        config = json.load(f)
    config.get('text_config', config)[name] = value
    with open(path, 'w') as f:
        json.dump(config, f, indent=2)
