"""transformers' own torch code for a hybrid's Gated DeltaNet layers, in place of fla's kernels: the exact reference
of the GPU checks and the benchmarks' eval (nothing to compile, fp64 runs too)."""
import inspect
import sys

# transformers 5: the functions of its hybrid modeling modules that use_kernel_func_from_hub_with_fallback binds at
# import to fla's / causal-conv1d's kernels when those are installed; each wraps (functools.wraps) the module's own
# torch function, which its GatedDeltaNet.forward calls by this name
TORCH_GDN_FUNCS = ('torch_chunk_gated_delta_rule', 'torch_recurrent_gated_delta_rule', 'causal_conv1d_fn',
                   'causal_conv1d_update')
# transformers 4.57: each layer holds its kernels as attributes set in __init__ -> the module's torch function (None:
# its conv1d fallback)
LAYER_TORCH = {'chunk_gated_delta_rule': 'torch_chunk_gated_delta_rule',
               'recurrent_gated_delta_rule': 'torch_recurrent_gated_delta_rule',
               'causal_conv1d_update': 'torch_causal_conv1d_update', 'causal_conv1d_fn': None}


def hf_torch_gdn(model):
    """Put every *GatedDeltaNet layer of ``model`` on its modeling module's torch functions: the module's
    TORCH_GDN_FUNCS rebound to what they wrap (for the whole process), a layer's own LAYER_TORCH attributes set; the
    names changed. Raises if a layer's module has no torch chunk function of its own after it (another transformers
    layout: the reference would not be what it says)."""
    done = set()
    for m in model.modules():
        if not type(m).__name__.endswith('GatedDeltaNet'):
            continue
        mod = sys.modules[type(m).__module__]
        short = mod.__name__.rsplit('.', 1)[-1]
        for name in TORCH_GDN_FUNCS:
            fn = getattr(mod, name, None)
            if fn is not None and hasattr(fn, '__wrapped__'):
                setattr(mod, name, inspect.unwrap(fn))
                done.add(f'{short}.{name}')
        for attr, torch_name in LAYER_TORCH.items():
            if attr in vars(m):
                want = None if torch_name is None else inspect.unwrap(getattr(mod, torch_name))
                if getattr(m, attr) is not want:
                    setattr(m, attr, want)
                    done.add(f'{short}.{type(m).__name__}.{attr}')
        fn = getattr(mod, 'torch_chunk_gated_delta_rule', None)
        if fn is None or getattr(getattr(fn, '__code__', None), 'co_filename', None) != mod.__file__:
            raise RuntimeError(f'{mod.__name__}.torch_chunk_gated_delta_rule is not its own torch function ({fn!r}): '
                               'this transformers binds its Gated DeltaNet otherwise')
    return sorted(done)
