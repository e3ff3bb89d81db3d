"""transformers ``modeling_rope_utils.ROPE_INIT_FUNCTIONS``: ``own_default_rope()`` gives the table transformers' own
``'default'`` entry inside the block and restores it on exit, behind ``hf_rope_guard`` (docs/hf-backend.md).
Not an import-time patch; the table (and, on 4.x, ``_compute_default_rope_parameters``) is guarded on every use.
"""
import contextlib
import importlib

from swift_plt.compat.guard import guard

TARGET = 'transformers.modeling_rope_utils'
VERIFIED = 'transformers 4.57.6 and 5.19'

_MISSING = object()


def rope_init_functions(module=None) -> dict:
    """transformers' ``ROPE_INIT_FUNCTIONS`` table, checked."""
    module = module or importlib.import_module(TARGET)
    table = guard(module, 'ROPE_INIT_FUNCTIONS', None, VERIFIED)
    if not isinstance(table, dict):
        raise RuntimeError(f'swift-plt: upstream changed: {TARGET}.ROPE_INIT_FUNCTIONS is a {type(table).__name__}, '
                           f'not a dict (verified against {VERIFIED}). Pin the verified version or set '
                           'SWIFT_PLT_DISABLE=1.')
    return table


def own_default_rope_fn(transformers_5: bool, module=None):
    """transformers' own ``ROPE_INIT_FUNCTIONS['default']``, checked: ``None`` on 5.x (each model computes its default
    RoPE itself), ``_compute_default_rope_parameters`` on 4.x."""
    if transformers_5:
        return None
    module = module or importlib.import_module(TARGET)
    return guard(module, '_compute_default_rope_parameters', ['config', 'device', 'seq_len'], VERIFIED)


@contextlib.contextmanager
def own_default_rope(transformers_5: bool):
    """``ROPE_INIT_FUNCTIONS['default']`` is transformers' own inside the block (none on 5.x) and the previous entry
    (or none) afterwards, also on an exception."""
    module = importlib.import_module(TARGET)
    table = rope_init_functions(module)
    own = own_default_rope_fn(transformers_5, module)
    saved = table.get('default', _MISSING)
    if own is None:
        table.pop('default', None)
    else:
        table['default'] = own
    try:
        yield
    finally:
        if saved is _MISSING:
            table.pop('default', None)
        else:
            table['default'] = saved
