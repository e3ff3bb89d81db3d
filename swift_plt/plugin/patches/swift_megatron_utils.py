"""ms-swift ``swift.megatron.utils.utils.get_padding_to``: at K > 1 every batch length is a multiple of
K * (upstream multiple), so the *patch* sequence P = S / K keeps what upstream requires of S (TP under sequence
parallel, 2*CP, fp8 blocks, fused attention)."""
import functools

from swift_plt.compat.guard import guard
from swift_plt.compat.supported import VERIFIED_STACKS
from swift_plt.compat.versions import check_once
from swift_plt.patch_level.patch_size import patch_size_of

TARGET = 'swift.megatron.utils.utils'
VERIFIED = f'ms-swift 4.6.0 on {VERIFIED_STACKS}'


def apply(module):
    check_once()
    upstream = guard(module, 'get_padding_to', ['args'], VERIFIED)
    if getattr(upstream, '_swift_plt', False):
        return
    from swift_plt.patch_level.layout import patch_padding_to

    @functools.wraps(upstream)
    def get_padding_to(args):
        padding_to = upstream(args)
        k = patch_size_of(args)
        return padding_to if k == 1 else patch_padding_to(padding_to, k)

    get_padding_to._swift_plt = True
    module.get_padding_to = get_padding_to
