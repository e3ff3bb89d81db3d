"""Shared helpers of the patch modules: the upstream-moved guard and the one-time version check."""
import inspect

from swift_plt.versions import check_versions

_checked = set()


def guard(owner, name: str, params, verified: str):
    """Return ``owner.name`` after checking it still exists with the parameters the patch was written for."""
    fn = getattr(owner, name, None)
    where = f'{getattr(owner, "__module__", owner)}.{getattr(owner, "__qualname__", getattr(owner, "__name__", ""))}'
    if fn is None:
        raise RuntimeError(f'swift-plt: upstream moved: `{name}` not found in {where} (patch verified against '
                           f'{verified}). Pin the verified version or set SWIFT_PLT_DISABLE=1.')
    if params is not None:
        got = list(inspect.signature(fn).parameters)[:len(params)]
        if got != list(params):
            raise RuntimeError(f'swift-plt: upstream changed: {where}.{name}{inspect.signature(fn)} (expected '
                               f'parameters {params}, verified against {verified}). Pin the verified version or '
                               f'set SWIFT_PLT_DISABLE=1.')
    return fn


def check_once(required=('ms-swift', )):
    if required not in _checked:
        check_versions(required)
        _checked.add(required)
