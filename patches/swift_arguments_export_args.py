"""ms-swift ``swift.arguments.export_args.ExportArguments``: accept ``--patch_size`` in ``swift export``.

``swift export --to_mcore/--to_hf`` parses these (HF-side) arguments, then builds the Megatron arguments itself.
The weights of a PLT model do not depend on K, so the flag only has to be accepted (and recorded in args.json)
so that a command line or YAML shared with `megatron pt` works as typed; K>1 still needs the PLT model type.
"""
from dataclasses import dataclass, field, fields
from typing import Optional

from ._guard import check_once, guard

TARGET = 'swift.arguments.export_args'
VERIFIED = 'ms-swift 4.6.0'


def apply(module):
    check_once()
    upstream = module.ExportArguments
    if 'patch_size' in {f.name for f in fields(upstream)}:
        if getattr(upstream, '_swift_plt', False):
            return
        raise RuntimeError('swift-plt: upstream ExportArguments already has `patch_size`; '
                           f'this patch was verified against {VERIFIED}.')
    guard(upstream, '__post_init__', ['self'], VERIFIED)
    from swift_plt import PLT_MODEL_TYPE
    from swift_plt.arguments import PATCH_SIZE_HELP

    @dataclass
    class ExportArguments(upstream):
        patch_size: Optional[int] = field(default=None, metadata={'help': PATCH_SIZE_HELP})

        def __post_init__(self):
            super().__post_init__()
            k = self.patch_size
            if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
                raise ValueError(f'--patch_size must be an integer >= 1 (1 = token-level training), got {k!r}.')
            if k is not None and k > 1 and self.model_type != PLT_MODEL_TYPE:
                raise ValueError(f'--patch_size {k}: model type `{self.model_type}` has no patch-level training. '
                                 f'Use `--model_type {PLT_MODEL_TYPE} --custom_register_path custom_model/llama.py`,'
                                 ' or drop --patch_size.')

    ExportArguments._swift_plt = True
    ExportArguments.__module__ = upstream.__module__
    ExportArguments.__qualname__ = upstream.__qualname__
    ExportArguments.__doc__ = upstream.__doc__
    module.ExportArguments = ExportArguments
