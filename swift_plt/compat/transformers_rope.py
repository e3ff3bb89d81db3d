"""transformers ``transformers.modeling_rope_utils``: the process-global ``ROPE_INIT_FUNCTIONS`` table, whose
``'default'`` entry is transformers' own for the duration of ``own_default_rope()``, the context manager behind
``swift_plt.compat.transformers.hf_rope_guard`` (why: the RoPE hazard of mcore-bridge, explained there).

Not an import-time patch (so not in ``PATCHES``): importing transformers changes nothing; the table is touched only
inside the context manager, and its previous entry is put back on exit (also on an exception). What it touches is
checked first, every time (``guard``): the table itself (a dict) and, on 4.x, transformers' own
``_compute_default_rope_parameters``. If upstream moved either, the model load fails with the guard's message (the
verified versions, what to do) instead of an AttributeError or ImportError.
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
    """transformers' own ``ROPE_INIT_FUNCTIONS['default']``: ``None`` on 5.x (there is none; each model computes its
    default RoPE itself), ``_compute_default_rope_parameters`` on 4.x, checked."""
    if transformers_5:
        return None
    module = module or importlib.import_module(TARGET)
    return guard(module, '_compute_default_rope_parameters', ['config', 'device', 'seq_len'], VERIFIED)


@contextlib.contextmanager
def own_default_rope(transformers_5: bool):
    """``ROPE_INIT_FUNCTIONS['default']`` is transformers' own inside the block (lifted on 5.x, transformers'
    function on 4.x) and the previous entry (or none) afterwards."""
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
