"""ms-swift ``MegatronArguments``: adds ``--patch_size`` and ``--value_clip_range`` (critic).
``_init_distributed`` (the end of upstream ``__post_init__``): resolves and checks both before torch.distributed starts,
and logs (rank 0) where the stock Megatron model differs from transformers for this config.json
(``swift_plt.families.upstream``).
On import, registers the plugin's model types with mcore-bridge (``register_megatron``), which this module imports.
"""
from dataclasses import dataclass, field
from typing import Optional

from swift_plt.compat.guard import guard, has_field, swap_class
from swift_plt.compat.supported import VERIFIED_STACKS
from swift_plt.compat.versions import check_once

TARGET = 'swift.megatron.arguments.megatron_args'
VERIFIED = f'ms-swift 4.6.0 on {VERIFIED_STACKS}'


def apply(module):
    check_once(('ms-swift', 'mcore-bridge', 'megatron-core'))
    from swift_plt.plugin.register import register_megatron
    register_megatron()
    upstream = module.MegatronArguments
    if has_field(upstream, 'patch_size', VERIFIED) | has_field(upstream, 'value_clip_range', VERIFIED):
        return
    guard(upstream, '__post_init__', ['self'], VERIFIED)
    guard(upstream, '_init_distributed', ['self'], VERIFIED)
    from swift_plt.critic.arguments import VALUE_CLIP_RANGE_HELP, resolve_critic_args
    from swift_plt.families.upstream import warn_upstream_differences
    from swift_plt.plugin.arguments import PATCH_SIZE_HELP, resolve_patch_size

    @dataclass
    class MegatronArguments(upstream):
        patch_size: Optional[int] = field(default=None, metadata={'help': PATCH_SIZE_HELP})
        value_clip_range: Optional[float] = field(default=None, metadata={'help': VALUE_CLIP_RANGE_HELP})

        def _init_distributed(self):
            resolve_patch_size(self)
            resolve_critic_args(self)
            warn_upstream_differences(self)
            super()._init_distributed()

    swap_class(module, upstream, MegatronArguments)
