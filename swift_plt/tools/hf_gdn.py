"""transformers' own torch code for a hybrid's Gated DeltaNet layers, in place of fla's kernels: the exact reference
of the GPU checks and the benchmarks' eval (nothing to compile, fp64 runs too)."""
import inspect
import sys

# the functions of transformers' hybrid modeling modules that use_kernel_func_from_hub_with_fallback binds at import to
# fla's / causal-conv1d's kernels when those are installed; each wraps (functools.wraps) the module's own torch
# function, which its GatedDeltaNet.forward calls by this name
TORCH_GDN_FUNCS = ('torch_chunk_gated_delta_rule', 'torch_recurrent_gated_delta_rule', 'causal_conv1d_fn',
                   'causal_conv1d_update')


def hf_torch_gdn(model):
    """Rebind TORCH_GDN_FUNCS in the modeling module of each *GatedDeltaNet layer of ``model`` to the torch function
    it wraps (for the whole process); the names rebound. Raises if a layer's module has no torch chunk function of
    its own after it (another transformers layout: the reference would not be what it says)."""
    done = set()
    for m in model.modules():
        if not type(m).__name__.endswith('GatedDeltaNet'):
            continue
        mod = sys.modules[type(m).__module__]
        for name in TORCH_GDN_FUNCS:
            fn = getattr(mod, name, None)
            if fn is not None and hasattr(fn, '__wrapped__'):
                setattr(mod, name, inspect.unwrap(fn))
                done.add(f'{mod.__name__.rsplit(".", 1)[-1]}.{name}')
        fn = getattr(mod, 'torch_chunk_gated_delta_rule', None)
        if fn is None or getattr(getattr(fn, '__code__', None), 'co_filename', None) != mod.__file__:
            raise RuntimeError(f'{mod.__name__}.torch_chunk_gated_delta_rule is not its own torch function ({fn!r}): '
                               'this transformers binds its Gated DeltaNet otherwise')
    return sorted(done)
