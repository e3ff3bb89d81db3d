"""ms-swift ``BaseArguments`` (base of every HF-side and Megatron argument class): adds ``--patch_size``.
``__post_init__``: HF-side commands resolve and check K before the model loads (Megatron: its own patch).
``get_model_processor``: hands K to the ``llama3_2_plt`` loader (K when training, else 1: weights do not depend on K);
for another family at K > 1 in training, loads the family's PLT class (``plt_auto_model_class``).
"""
from dataclasses import dataclass, field
from typing import Optional

from swift_plt.compat.guard import guard, has_field, swap_class
from swift_plt.compat.supported import VERIFIED_STACKS
from swift_plt.compat.versions import check_once

TARGET = 'swift.arguments.base_args.base_args'
VERIFIED = f'ms-swift 4.6.0 on {VERIFIED_STACKS}'


def _command(args) -> str:
    """'megatron', 'train' (HF trainer arguments), 'export' or 'other' (infer, deploy, eval, sampling, ...)."""
    if any(c.__module__.startswith('swift.megatron.') for c in type(args).__mro__):
        return 'megatron'
    from transformers import TrainingArguments
    if isinstance(args, TrainingArguments):
        return 'train'
    return 'export' if hasattr(args, 'to_mcore') else 'other'


def apply(module):
    check_once()
    upstream = module.BaseArguments
    if has_field(upstream, 'patch_size', VERIFIED):
        return
    guard(upstream, '__post_init__', ['self'], VERIFIED)
    guard(upstream, 'get_model_processor', ['self', 'model', 'model_type'], VERIFIED)
    from swift_plt.plugin.arguments import PATCH_SIZE_HELP, is_plt_model, resolve_patch_size_hf

    @dataclass
    class BaseArguments(upstream):
        patch_size: Optional[int] = field(default=None, metadata={'help': PATCH_SIZE_HELP})

        def __post_init__(self):
            super().__post_init__()
            command = _command(self)
            if command != 'megatron':
                resolve_patch_size_hf(self, command)

        def get_model_processor(self, **kwargs):
            training = _command(self) == 'train'
            if is_plt_model(self) and 'patch_size' not in kwargs:
                kwargs['patch_size'] = self.patch_size if training else 1
            elif training and (self.patch_size or 1) > 1 and kwargs.get('load_model', True):
                from swift_plt.models.hf_causal_lm import plt_auto_model_class
                kwargs.setdefault('auto_model_cls', plt_auto_model_class(self.patch_size))
            return super().get_model_processor(**kwargs)

    swap_class(module, upstream, BaseArguments)
