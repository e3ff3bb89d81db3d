"""ms-swift ``swift.arguments.export_args.ExportArguments``: accept ``--patch_size`` in ``swift export``.

``swift export --to_mcore/--to_hf`` parses these (HF-side) arguments, then builds the Megatron arguments itself.
The weights of a PLT model do not depend on K, so the flag only has to be accepted (and recorded in args.json)
so that a command line or YAML shared with `megatron pt` works as typed; K>1 still needs the PLT model type.
"""
from dataclasses import dataclass, field
from typing import Optional

from ._guard import check_once, guard, has_field, swap_class

TARGET = 'swift.arguments.export_args'
VERIFIED = 'ms-swift 4.6.0'


def apply(module):
    check_once()
    upstream = module.ExportArguments
    if has_field(upstream, 'patch_size', VERIFIED):
        return
    guard(upstream, '__post_init__', ['self'], VERIFIED)
    from swift_plt import PLT_MODEL_TYPE
    from swift_plt.arguments import PATCH_SIZE_HELP, check_patch_size

    @dataclass
    class ExportArguments(upstream):
        patch_size: Optional[int] = field(default=None, metadata={'help': PATCH_SIZE_HELP})

        def __post_init__(self):
            super().__post_init__()
            if self.patch_size is not None:
                check_patch_size(self.patch_size, self.model_type, self.model_type == PLT_MODEL_TYPE)

    swap_class(module, upstream, ExportArguments)
