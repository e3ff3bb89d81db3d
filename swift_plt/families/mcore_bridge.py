"""mcore-bridge's model metas, as PLT and the critic build on them: each family's loader and bridge must be the ones
its record names (``Family.loader`` / ``bridge``, verified against mcore-bridge 1.6.5; mcore-bridge registers the
hybrids' other, transformers-module path under ``USE_MCORE_GDN=0``), and one way to put a mixin over them."""
import functools
import importlib
from typing import Optional

from swift_plt.families.registry import MCORE_BRIDGE_VERIFIED, verified_classes


def _resolve(name: str):
    module, cls = name.split(':')
    return getattr(importlib.import_module(module), cls)


def upstream_moved(mcore_type: str, upstream) -> list:
    """What of mcore-bridge's meta ``upstream`` of ``mcore_type`` differs from the verified classes: a list of
    'its loader is X, not Y' lines (empty: as verified)."""
    loader, bridge = map(_resolve, verified_classes(mcore_type))
    return [f'its {what} is {cls.__module__}.{cls.__name__}, not the {ref.__module__}.{ref.__name__}'
            for what, cls, ref in (('loader', upstream.loader, loader), ('bridge', upstream.bridge_cls, bridge))
            if cls is not ref]


def upstream_problem(mcore_type: str, upstream) -> Optional[str]:
    """None where mcore-bridge's meta ``upstream`` of ``mcore_type`` is as verified, else what differs and what to
    do."""
    if upstream is None:
        return (f'mcore-bridge has no `{mcore_type}` model type ({MCORE_BRIDGE_VERIFIED} has; with USE_MCORE_GDN=0 it '
                'registers the hybrids differently): unset USE_MCORE_GDN or update swift-plt.')
    moved = upstream_moved(mcore_type, upstream)
    if not moved:
        return None
    return (f'mcore-bridge builds `{mcore_type}` differently from what swift-plt was verified against '
            f'({MCORE_BRIDGE_VERIFIED}, USE_MCORE_GDN=1): {"; ".join(moved)}. Unset USE_MCORE_GDN or update swift-plt.')


@functools.lru_cache(maxsize=None)
def over(prefix: str, mixin: type, upstream_cls: type, named: Optional[type] = None) -> type:
    """``mixin`` over an mcore-bridge loader or bridge class, named ``<prefix><upstream name>``; ``named`` (a class
    ``(mixin, base)`` declared in the package) where ``upstream_cls`` is its base."""
    if named is not None and upstream_cls in named.__bases__:
        return named
    return type(f'{prefix}{upstream_cls.__name__}', (mixin, upstream_cls), {})
