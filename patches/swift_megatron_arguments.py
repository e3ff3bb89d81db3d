"""ms-swift ``swift.megatron.arguments.megatron_args.MegatronArguments``: add ``--patch_size``.

The patch runs right after the module executes, before its subclasses (MegatronBaseArguments, the pt/sft/export
argument classes) are defined in sibling modules, and swaps in a dataclass subclass with one extra field. Its
``_init_distributed`` (the last step of upstream ``__post_init__``, after the model type is resolved) first resolves
and validates ``patch_size`` so that bad input fails before torch.distributed starts.
"""
from dataclasses import dataclass, field, fields
from typing import Optional

from ._guard import check_once, guard

TARGET = 'swift.megatron.arguments.megatron_args'
VERIFIED = 'ms-swift 4.6.0'


def apply(module):
    check_once(('ms-swift', 'mcore-bridge', 'megatron-core'))
    upstream = module.MegatronArguments
    if 'patch_size' in {f.name for f in fields(upstream)}:
        if getattr(upstream, '_swift_plt', False):
            return
        raise RuntimeError('swift-plt: upstream MegatronArguments already has `patch_size`; '
                           f'this patch was verified against {VERIFIED}.')
    guard(upstream, '__post_init__', ['self'], VERIFIED)
    guard(upstream, '_init_distributed', ['self'], VERIFIED)
    from swift_plt.arguments import PATCH_SIZE_HELP, resolve_patch_size

    @dataclass
    class MegatronArguments(upstream):
        patch_size: Optional[int] = field(default=None, metadata={'help': PATCH_SIZE_HELP})

        def _init_distributed(self):
            resolve_patch_size(self)
            super()._init_distributed()

    MegatronArguments._swift_plt = True
    MegatronArguments.__module__ = upstream.__module__
    MegatronArguments.__qualname__ = upstream.__qualname__
    MegatronArguments.__doc__ = upstream.__doc__
    module.MegatronArguments = MegatronArguments
