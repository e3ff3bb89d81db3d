"""Shared helpers of the patch modules: the guard that fails loudly when upstream moved, and class swapping."""
import inspect


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


def has_field(upstream_cls, name: str, verified: str) -> bool:
    """True if ``upstream_cls`` was already swapped for our subclass (idempotent apply); raise if upstream itself
    grew the field, since our semantics could then silently differ from upstream's."""
    from dataclasses import fields
    if name not in {f.name for f in fields(upstream_cls)}:
        return False
    if getattr(upstream_cls, '_swift_plt', False):
        return True
    raise RuntimeError(f'swift-plt: upstream {upstream_cls.__qualname__} already has `{name}`; this patch was '
                       f'verified against {verified}. Pin the verified version or set SWIFT_PLT_DISABLE=1.')


def swap_class(module, upstream_cls, subclass) -> None:
    """Replace ``module.<name>`` by ``subclass`` (which must subclass it) under the upstream name, before the
    modules that import the name (and define further subclasses) run."""
    assert issubclass(subclass, upstream_cls)
    subclass._swift_plt = True
    subclass.__module__ = upstream_cls.__module__
    subclass.__qualname__ = upstream_cls.__qualname__
    subclass.__doc__ = upstream_cls.__doc__
    setattr(module, upstream_cls.__name__, subclass)
