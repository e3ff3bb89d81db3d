"""``install()``: make ms-swift's Megatron backend run on a CPU-only machine, in-process.

Written against ms-swift 4.6.0 -> mcore-bridge 1.6.5 -> megatron-core 0.16.1, torch 2.13.0+cpu, transformers 5.19,
with neither transformer_engine nor triton installed; also run on megatron-core 0.19.2 with torch 2.14.1 (Python 3.12),
where P17 (experts built from a ``partial`` builder), P18 (MLA's Q/KV norm resolver, ``mla_qk_norm_config``) and P22
(``ssm/gated_delta_net/`` a package) take the 0.19 form. Every patch the harness applies is listed here; each entry
names the upstream code it changes. All patches are applied lazily, right after the upstream module is imported
(``_imports.when_imported``), so ``install()`` is cheap and can run from ``sitecustomize`` in every process.

PATCHES (id: upstream target -- what and why)

 P1 import stand-ins (``_imports``): ``transformer_engine`` for the top-level code of ``mcore_bridge.*`` modules
    (tuners/lora, model/modules/{dsa_indexer,compressor,gated_delta_net,mtp_layer}, gpts/deepseek_v4,
    mm_gpts/deepseek_v41 import it at module level in 1.6.5); ``triton`` (+ ``triton.language``) for
    ``mcore_bridge.model.modules.kernels.qsa_block_sparse_attn`` (1.6.5) and megatron-core's
    ``inference.contexts.attention_context.triton.tensor_ops`` (0.16.1, imported via ``ssm.mamba_mixer`` by
    ``mcore_bridge.model.gpts.nemotron_h``), which import it unconditionally and apply ``@triton.jit`` at import.
    Everyone else (megatron-core's ``HAVE_TE`` probes, torch, transformers) still sees both as absent.
    Using anything from them raises (``StandInModule``); a ``@triton.jit`` kernel raises when launched.
 P2 ``mcore_bridge.patcher.apply_patch`` (1.6.5): ``_patch_transformer_engine``, ``_patch_TEGroupedLinear`` and
    ``_patch_TELinear`` are skipped; they edit TE classes that do not exist without TE (megatron-core sets
    ``TEGroupedLinear = None`` and builds ``TELinear`` on a MagicMock).
 P3 ``mcore_bridge.model.register.ModelLoader.get_transformer_layer_spec`` / ``get_mtp_block_spec`` (1.6.5), patched
    on the CLASS, so loaders that subclass ModelLoader (e.g. swift-plt's) inherit it: build megatron-core's local
    (non-TE) spec, ``use_transformer_engine=False``; upstream hard-codes True (NameError TENorm without TE).
    In the same module the names ``TELinear``, ``TELayerNormColumnParallelLinear``, ``TEGroupedLinear`` (used only in
    ``isinstance`` checks of ``_set_linear_is_expert``) are rebound to a class nothing is an instance of.
 P4 ``mcore_bridge.bridge.gpt_bridge.GPTBridge._set_state_dict`` (1.6.5): the TE fused-norm keys
    ``self_attention.linear_qkv.layer_norm_weight`` / ``mlp.linear_fc1.layer_norm_weight`` are mapped to the local
    spec's ``input_layernorm.weight`` / ``pre_mlp_layernorm.weight`` (HF->mcore load and mcore->HF export); MLA's: P18.
 P5 ``mcore_bridge.config.ModelConfig.__post_init__`` (1.6.5, class level, so plugin config_cls subclasses inherit
    it): ``persist_layer_norm`` (ModelConfig default True; torch norm asserts False) and ``masked_softmax_fusion``
    (needs the CUDA softmax kernels) are forced False.
 P6 ``mcore_bridge.utils.set_random_seed`` (1.6.5): upstream skips ``model_parallel_cuda_manual_seed`` when
    ``torch.cuda.device_count() == 0``, leaving megatron's RNG tracker empty (initialisation and dropout then fail);
    the patched copy always seeds it. Rebound in ``mcore_bridge.utils`` and ``mcore_bridge.utils.megatron_utils``.
 P7 ``megatron.core.tensor_parallel.random._get_cuda_rng_state`` / ``_set_cuda_rng_state`` (0.16.1): read/write the
    CPU default generator (megatron's CUDA RNG tracker then works unchanged).
 P8 torch (2.13.0+cpu): ``CudaToCpuMode`` (``_cuda_to_cpu``) maps every CUDA device argument to the CPU and
    ``Tensor.cuda()`` to identity; ``Tensor.type()`` reports ``torch.cuda.*`` to megatron-core callers (optimizer /
    clip-grad assertions). Used by megatron's pipeline schedules and p2p communication, DDP buffers, the bridge's
    collectives and ms-swift's trainer/metrics.
 P9 ``torch.cuda`` (2.13.0+cpu): ``current_device`` -> 0, ``set_device`` / ``synchronize`` / ``empty_cache`` /
    ``reset_peak_memory_stats`` -> no-op, ``Stream`` / ``Event`` / ``stream()`` / ``current_stream`` /
    ``default_stream`` -> null objects (ms-swift's ``wrap_model``, megatron DDP), memory statistics -> 0,
    ``get_rng_state`` / ``set_rng_state`` / ``manual_seed`` -> CPU generator.
 P10 ``megatron.core.jit.jit_fuser`` (0.16.1): megatron decorates its bias-SwiGLU / bias-dropout-add fusions with
    ``torch.compile`` at import time; on CPU that means an inductor C++ build per shape. Replaced by a no-op
    decorator (megatron's own ``disable_jit_fuser``) unless env ``SWIFT_PLT_CPU_HARNESS_JIT=1``. Same math, eager.
 P12 ``mcore_bridge.model.gpt_model.OutputLayerLinear`` (1.6.5): the seq_cls head (swift-plt's critic value head) is a
    TE ``TELinear(parallel_mode='duplicated')``, which cannot be built without TE. Replaced by ``_LocalOutputLayer``
    with TELinear-duplicated semantics: full ``[out, in]`` weight on every TP rank, initialised by ``init_method``
    under the data-parallel RNG (when ``perform_initialization``), ``allreduce=True`` and
    ``sequence_parallel=config.sequence_parallel`` on the weight, forward ``(x @ W^T, None)``, and a replicated
    sharded state dict (megatron's ``make_sharded_tensors_for_checkpoint`` with no TP axis, as TELinear does).
 P13 ``megatron.core.transformer.torch_norm.WrappedTorchNorm`` (0.16.1): megatron's local-spec norm refuses
    ``config.sequence_parallel`` ("sequence parallel not supported by torch LayerNorm"). Under sequence parallel the
    stand-in builds the same torch norm (a norm is per token, so it runs unchanged on this rank's [S/TP, B, H]
    slice) and marks its parameters ``sequence_parallel=True``, as Transformer Engine's norms do: megatron's
    ``finalize_model_grads`` then all-reduces their gradients over the TP group (each rank only saw S/TP tokens).
    Without sequence parallel the original constructor runs untouched.
 P14 ``megatron.core.transformer.dot_product_attention.DotProductAttention.forward`` (0.16.1): megatron's local
    attention refuses ``packed_seq_params`` (THD: padding-free / ``--packing`` batches need TE). Without context
    parallel the stand-in runs the packed sequence [T, heads, dim] as one row with a block-diagonal causal mask built
    from ``cu_seqlens_q`` (``cu_seqlens_q_padded`` when set): token i sees token j iff j <= i in the same document,
    which is what TE's THD attention computes. RoPE needs nothing: megatron's ``_apply_rotary_pos_emb_thd`` already
    runs on CPU. Context parallel > 1 is not handled here (raises).
 P15 ``swift.template.base.Template._encode_truncated`` (ms-swift 4.6.0, as patched by swift-plt), only with env
    ``SWIFT_PLT_CPU_PACK_AS_CP=<cp>``: at K > 1, padding-free documents are padded to a multiple of 2*cp*K at encode
    time, as swift-plt pads them under context parallel cp (swift_plt/plugin/patches/swift_template.py). A 1-rank reference run then
    packs (``--packing``: bins by the encoded length) and trains on the same global batch as the CP=cp run it is
    compared with. The padding is pad tokens with label -100 after each document: no loss change by itself.
 P16 ``mcore_bridge.tuners.patcher`` (1.6.5): its LoRA dispatch does ``isinstance(layer, (TELayerNormColumnParallelLinear,
    TELinear, TEGroupedLinear, TopKRouter))`` with the TE classes it imported, which are stand-ins (P1) when the
    harness is installed in the same process (tests/patch_level/test_plt_host_sync.py does): ``isinstance`` then raised a
    TypeError in any later test of that process that wraps a model with peft (test_data_report's LoRA case). They
    become ``_NoTEModule`` (P3's class: nothing is an instance), as in the model spec; no layer here is a TE layer.
 P17 MoE experts, in P3's layer spec (``moe_mla.localize_te_specs``): mcore-bridge 1.6.5's ``GPTBridge._set_mlp_state``
    maps experts to TE's grouped layout (``mlp.experts.linear_fc1.weight{i}``, ``TEGroupedMLP`` of megatron-core 0.16.1
    with ``TEColumnParallelGroupedLinear`` / ``TERowParallelGroupedLinear``); the local spec gives ``GroupedMLP``
    (needs the grouped_gemm package, ``moe_grouped_gemm=True``, ms-swift's default) or ``SequentialMLP`` (other keys).
    Every MoE layer gets megatron's own ``TEGroupedMLP`` with ``moe_mla.{Column,Row}ParallelGroupedLinear``: TE
    ``GroupedLinear`` semantics on CPU (per-expert ``F.linear`` over the ``m_splits`` rows; only this rank's expert-TP
    slice, no communication, as TE with ``explicit_expert_comm``; the parameter attributes TE and megatron set:
    ``tensor_model_parallel`` / ``partition_dim``, ``allreduce = not (is_expert and EP > 1)``; TE's grouped sharded
    state dict without ``_extra_state``). Whatever ``moe_grouped_gemm`` says: the bridge knows no other layout.
 P18 MLA, in P3's layer spec and P4: megatron-core 0.16.1 ``MultiLatentAttention`` builds its core attention with
    TE's ``k_channels`` / ``v_channels``, which the local ``DotProductAttention`` refuses (TypeError). The local spec's
    MLA core attention becomes ``moe_mla.MLACoreAttention`` (``DotProductAttention`` with q/k head dim ``k_channels``,
    output ``heads * v_channels``, MLA's ``softmax_scale``; masks and THD via P14). P4 also maps the bridge's TE
    fused-norm keys ``linear_q_up_proj.layer_norm_weight`` / ``linear_kv_up_proj.layer_norm_weight`` to the local
    spec's ``q_layernorm.weight`` / ``kv_layernorm.weight``. And ``megatron.core.transformer.multi_latent_attention``
    (0.16.1) sets ``HAVE_TE = True`` without TE (its guarded imports of megatron's TE wrappers succeed, with
    ``TELinear`` / ``TEColumnParallelLinear`` MagicMock instances), then ``isinstance(self.linear_proj, TELinear)``
    raises: both names become ``_NoTEModule`` (P3) there. The local spec's MLA down projections are
    ``ColumnParallelLinear`` where TE has duplicated ``TELinear``: TP > 1 with MLA is not supported (the bridge loads
    them unsplit).
 P19 ``megatron.core.transformer.moe.moe_utils`` (0.16.1): ``RouterGatingLinearFunction`` (the router GEMM when
    ``moe_router_dtype`` is set, as mcore-bridge does) tests ``te_general_gemm is not None``, a name the module only
    defines when TE imports: NameError without TE. It is defined as None, so the function takes its torch path.
 P20 P9's null ``torch.cuda.Stream``: ``record_event()`` returns a null Event, not None (megatron-core 0.16.1's
    alltoall MoE token dispatcher records one on its D2H stream and later calls ``.synchronize()`` on it).
 P21 ``megatron.core.transformer.moe.moe_utils.maybe_move_tensor_to_cpu`` (0.16.1; also its name in
    ``moe.token_dispatcher``): the alltoall token dispatcher takes the EP split sizes from it with ``as_numpy=True``;
    upstream converts only CUDA tensors, so on CPU a torch tensor reached ``all_to_all_single``, which wants a
    sequence of ints (TypeError). CPU tensors asked for ``as_numpy`` are converted too, as CUDA ones are on GPUs.
 P22 hybrid Gated-DeltaNet decoders (``hybrid``; mcore-bridge 1.6.5's default ``USE_MCORE_GDN`` path of qwen3_next /
    qwen3_5): ``mcore_bridge.model.modules.gated_delta_net``'s fla kernels (``causal_conv1d``, ``l2norm``,
    ``chunk_gated_delta_rule``, None without fla; megatron's ``ssm.gated_delta_net.HAVE_FLA``) become per-document torch loops over transformers' torch functions
    (``cu_seqlens`` honoured, as fla's are); megatron-core 0.16.1's ``experimental_attention_variant_module_specs``
    (TE-only: ``_get_backend_spec_provider``, ``_get_self_attention_module_spec``) builds on the local backend, the
    block spec then gets P17's experts; P4 maps ``self_attention.in_proj.layer_norm_weight`` (TE's fused norm) to
    ``input_layernorm.weight``; P13 builds ``zero_centered_gamma`` RMSNorms (``hybrid.ZeroCenteredRMSNorm``).
 P23 ``mcore_bridge.model.gpts.glm4`` (1.6.5): GLM-4-0414's ``Glm4SelfAttention`` / ``Glm4MLP`` build their extra
    norms (``post_self_attn_layernorm``, ``post_mlp_layernorm``) with TE's ``TENorm`` whatever the spec says; the
    module's ``TENorm`` becomes megatron's ``WrappedTorchNorm`` (the local spec's norm: RMSNorm by the config, P13).
 P11 ``megatron.core.fusions.fused_softmax.FusedScaleMaskSoftmax.forward_torch_softmax`` (0.16.1): the probabilities
    are returned in the dtype of the scores, not in the dtype the config's fp16/bf16 flags announce. They only
    differ in ms-swift's ``--test_convert_precision`` check, which runs a bf16 model in fp32: on GPUs TE attention
    takes that path, on CPU megatron's local attention would multiply bf16 probabilities with fp32 values.

Not patched (pass flags instead, see ``cli.CPU_MEGATRON_ARGS``): attention backend (``--attention_backend
unfused``), fused cross entropy, distributed optimizer, gloo
(``--ddp_backend gloo``), CPU initialisation, ``--perform_initialization true`` (without it TP ranks > 0 count
every gradient as a duplicate in grad-norm, see cpu_notes). Precision: ms-swift turns ``--torch_dtype float32``
into fp16 mixed precision (``fp16=True``), whose first steps give inf/NaN gradients that megatron's NaN check
rejects; for real fp32 add ``--fp16 false --bf16 false``; ``--torch_dtype bfloat16`` (bf16) also works.

Known hazard, not patched globally: once mcore-bridge computes RoPE frequencies (``mcore_bridge.model.rope.
get_rope_inv_freq``) on transformers 5.x it adds its own ``ROPE_INIT_FUNCTIONS['default']`` to transformers for the
whole process; building/loading an HF Llama afterwards fails (``'LlamaConfig' object has no attribute
'rope_theta'``). The harness's own HF helpers (``make_tiny_llama``, ``hf_logits``) run under
``swift_plt.compat.transformers.hf_rope_guard()``, which gives transformers its own entry back for their duration (none on
5.x, transformers' function on 4.57.x); elsewhere build HF models first, in another process, or inside it.
"""
import os

from . import _imports
from ._cuda_to_cpu import NullStream, enter_mode, patch_torch_cuda

_INSTALLED = False


# ---------------------------------------------------------------------------------------------------------- P1
def _triton_jit(fn=None, **kwargs):
    """``@triton.jit`` / ``@triton.jit(...)``: keep the Python function, refuse to launch it."""

    def wrap(f):
        return _UnavailableKernel(f)

    return wrap if fn is None else wrap(fn)


class _UnavailableKernel:

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = getattr(fn, '__name__', 'kernel')

    def __getitem__(self, grid):
        return self

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f'triton kernel {self.__name__} called on the CPU test harness (triton is a stand-in).')


def _passthrough_decorator(*args, **kwargs):
    return lambda f: f


class _Constexpr:
    """``tl.constexpr`` (only used in annotations evaluated at import)."""


_TRITON_ATTRS = {
    'triton': {
        'jit': _triton_jit,
        'autotune': _passthrough_decorator,
        'heuristics': _passthrough_decorator,
        'cdiv': lambda a, b: -(-a // b),
        'next_power_of_2': lambda n: 1 << (max(int(n), 1) - 1).bit_length(),
    },
    'triton.language': {
        'constexpr': _Constexpr
    },
}


# Modules that import triton unconditionally at module level and are imported on the path we use: mcore-bridge's
# vendored QSA kernel (via mcore_bridge.model.modules) and megatron's inference tensor ops (via mamba_mixer, which
# mcore_bridge.model.gpts.nemotron_h imports).
_TRITON_IMPORTERS = (
    'mcore_bridge.model.modules.kernels.qsa_block_sparse_attn',
    'megatron.core.inference.contexts.attention_context.triton.tensor_ops',
)


def _install_standins():
    _imports.add_standin('transformer_engine', lambda importer: importer.startswith('mcore_bridge.'))
    _imports.add_standin('triton', lambda importer: importer in _TRITON_IMPORTERS, attrs=_TRITON_ATTRS)
    _imports.watch_prefixes('mcore_bridge', *_TRITON_IMPORTERS)


# ---------------------------------------------------------------------------------------------------------- P2
def _patch_mcore_bridge_patcher(patcher):
    skip = lambda: None  # noqa: E731
    patcher._patch_transformer_engine = skip
    patcher._patch_TEGroupedLinear = skip
    patcher._patch_TELinear = skip


# ---------------------------------------------------------------------------------------------------------- P3
class _NoTEModule:
    """Stands for a TE layer class in ``isinstance`` checks: nothing is an instance of it."""


def _patch_model_register(register):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_mtp_block_spec

    ModelLoader = register.ModelLoader
    if getattr(ModelLoader, '_cpu_harness_patched', False):
        return

    def get_transformer_layer_spec(self, vp_stage=None):
        # == ModelLoader.get_transformer_layer_spec of mcore-bridge 1.6.5 with use_transformer_engine=False.
        with self._patch_experimental_attention_variant():
            transformer_layer_spec = get_gpt_decoder_block_spec(
                self.config,
                use_transformer_engine=False,
                normalization=self.config.normalization,
                qk_l2_norm=self.config.qk_l2_norm,
                vp_stage=vp_stage)
            self._deepcopy_layer_spec(transformer_layer_spec)
        from .moe_mla import localize_te_specs
        localize_te_specs(transformer_layer_spec, self.config)  # P17 / P18
        if self.config.experimental_attention_variant == 'dsa':
            raise NotImplementedError('CPU harness: DSA attention needs the TE layer spec.')
        return transformer_layer_spec

    def get_mtp_block_spec(self, transformer_layer_spec, vp_stage=None):
        # == ModelLoader.get_mtp_block_spec of mcore-bridge 1.6.5 with use_transformer_engine=False.
        mtp_block_spec = get_gpt_mtp_block_spec(
            self.config, transformer_layer_spec, use_transformer_engine=False, vp_stage=vp_stage)
        if mtp_block_spec is not None:
            for layer_spec in mtp_block_spec.layer_specs:
                layer_spec.module = register.MultiTokenPredictionLayer
        return mtp_block_spec

    ModelLoader.get_transformer_layer_spec = get_transformer_layer_spec
    ModelLoader.get_mtp_block_spec = get_mtp_block_spec
    ModelLoader._cpu_harness_patched = True
    register.TELinear = register.TELayerNormColumnParallelLinear = register.TEGroupedLinear = _NoTEModule


# ---------------------------------------------------------------------------------------------------------- P4
_TE_FUSED_NORM_KEYS = {
    'self_attention.linear_qkv.layer_norm_weight': 'input_layernorm.weight',
    'self_attention.in_proj.layer_norm_weight': 'input_layernorm.weight',  # P22 (Gated DeltaNet)
    'mlp.linear_fc1.layer_norm_weight': 'pre_mlp_layernorm.weight',
    'linear_q_up_proj.layer_norm_weight': 'q_layernorm.weight',  # P18 (MLA; relative to self_attention)
    'linear_kv_up_proj.layer_norm_weight': 'kv_layernorm.weight',
}


def _patch_gpt_bridge(gpt_bridge):
    GPTBridge = gpt_bridge.GPTBridge
    if getattr(GPTBridge, '_cpu_harness_patched', False):
        return
    orig = GPTBridge._set_state_dict

    def _set_state_dict(self, mg_module, mg_key, *args, **kwargs):
        return orig(self, mg_module, _TE_FUSED_NORM_KEYS.get(mg_key, mg_key), *args, **kwargs)

    GPTBridge._set_state_dict = _set_state_dict
    GPTBridge._cpu_harness_patched = True


# ---------------------------------------------------------------------------------------------------------- P5
def _patch_model_config(model_config):
    ModelConfig = model_config.ModelConfig
    if getattr(ModelConfig, '_cpu_harness_patched', False):
        return
    orig = ModelConfig.__post_init__

    def __post_init__(self):
        self.persist_layer_norm = False
        self.masked_softmax_fusion = False
        orig(self)

    ModelConfig.__post_init__ = __post_init__
    ModelConfig._cpu_harness_patched = True


# ---------------------------------------------------------------------------------------------------------- P6
def _patch_set_random_seed(utils):
    from megatron.core import mpu, tensor_parallel
    from transformers import set_seed

    def set_random_seed(seed_, data_parallel_random_init=False, te_rng_tracker=False, inference_rng_tracker=False,
                        use_cudagraphable_rng=False):
        # == mcore_bridge.utils.megatron_utils.set_random_seed of 1.6.5 without the `device_count() > 0` guard.
        if seed_ is None or seed_ <= 0:
            raise ValueError(f'Seed ({seed_}) should be a positive integer.')
        seed = seed_ + (1009 * mpu.get_pipeline_model_parallel_rank())
        if data_parallel_random_init:
            seed = seed + (11 * mpu.get_data_parallel_rank())
        set_seed(seed)
        tensor_parallel.model_parallel_cuda_manual_seed(seed, te_rng_tracker, inference_rng_tracker,
                                                        use_cudagraphable_rng)

    utils.set_random_seed = set_random_seed
    utils.megatron_utils.set_random_seed = set_random_seed


# ---------------------------------------------------------------------------------------------------------- P7
def _patch_megatron_random(random):
    import torch

    def _get_cuda_rng_state(device='cuda', clone=False, graph_safe=False):
        return torch.get_rng_state()

    def _set_cuda_rng_state(new_state, device=-1, graph_safe=False):
        torch.set_rng_state(new_state)

    random._get_cuda_rng_state = _get_cuda_rng_state
    random._set_cuda_rng_state = _set_cuda_rng_state


# ---------------------------------------------------------------------------------------------------------- P10
def _patch_megatron_jit(jit):
    if os.environ.get('SWIFT_PLT_CPU_HARNESS_JIT', '0') != '1':
        jit.disable_jit_fuser()


# ---------------------------------------------------------------------------------------------------------- P11
def _patch_fused_softmax(fused_softmax):
    cls = fused_softmax.FusedScaleMaskSoftmax
    if getattr(cls, '_cpu_harness_patched', False):
        return
    orig = cls.forward_torch_softmax

    def forward_torch_softmax(self, input, mask, softmax_offset=None):
        probs = orig(self, input, mask, softmax_offset)
        return probs if probs.dtype == input.dtype else probs.to(input.dtype)

    cls.forward_torch_softmax = forward_torch_softmax
    cls._cpu_harness_patched = True


# ---------------------------------------------------------------------------------------------------------- P12
def _patch_gpt_model(gpt_model):
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.module import MegatronModule

    class _LocalOutputLayer(MegatronModule):
        """TELinear(parallel_mode='duplicated', bias=False) on CPU (P12)."""

        def __init__(self, input_size, output_size, *, config, init_method, bias=False, skip_bias_add=False,
                     parallel_mode='duplicated', skip_weight_param_allocation=False, **kwargs):
            super().__init__(config=config)
            assert parallel_mode == 'duplicated' and not bias, 'CPU harness P12: only the seq_cls head'
            self.weight = torch.nn.Parameter(torch.empty(output_size, input_size, dtype=config.params_dtype))
            if config.perform_initialization:
                from megatron.core.tensor_parallel.random import (get_cuda_rng_tracker,
                                                                  get_data_parallel_rng_tracker_name)
                with get_cuda_rng_tracker().fork(get_data_parallel_rng_tracker_name()):
                    init_method(self.weight)
            self.weight.allreduce = True
            self.weight.sequence_parallel = config.sequence_parallel
            self.sequence_parallel = config.sequence_parallel

        def forward(self, x, *args, **kwargs):
            return F.linear(x, self.weight), None

        def sharded_state_dict(self, prefix='', sharded_offsets=(), metadata=None):
            from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint
            return make_sharded_tensors_for_checkpoint(self.state_dict(prefix='', keep_vars=True), prefix, None,
                                                       sharded_offsets)

    gpt_model.OutputLayerLinear = _LocalOutputLayer


# ---------------------------------------------------------------------------------------------------------- P13
def _patch_torch_norm(torch_norm):
    import copy

    import torch
    cls = torch_norm.WrappedTorchNorm
    if getattr(cls, '_cpu_harness_patched', False):
        return
    orig = cls.__new__

    def __new__(klass, config, *args, **kwargs):
        zero_centered = config.layernorm_zero_centered_gamma  # P22
        if not config.sequence_parallel and not zero_centered:
            return orig(klass, config, *args, **kwargs)
        sequence_parallel = config.sequence_parallel
        config = copy.copy(config)
        config.sequence_parallel = False  # only to pass the constructor's refusal; the module is the same
        config.layernorm_zero_centered_gamma = False
        norm = orig(klass, config, *args, **kwargs)
        if zero_centered:
            from .hybrid import ZeroCenteredRMSNorm
            assert type(norm) is torch.nn.RMSNorm, 'CPU harness P22: zero-centered RMSNorm only'
            norm.__class__ = ZeroCenteredRMSNorm
        for param in norm.parameters():
            param.sequence_parallel = sequence_parallel  # finalize_model_grads sums these over TP (as for TE norms)
        return norm

    cls.__new__ = staticmethod(__new__)
    cls._cpu_harness_patched = True


# ---------------------------------------------------------------------------------------------------------- P23
def _patch_glm4(glm4):
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    glm4.TENorm = WrappedTorchNorm


# ---------------------------------------------------------------------------------------------------------- P14
def thd_causal_mask(cu_seqlens, total: int):
    """[1, 1, T, T] bool, True = masked: causal within each document of a packed row, nothing across documents."""
    import torch
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    doc = torch.repeat_interleave(torch.arange(lengths.numel()), lengths.cpu())
    if doc.numel() != total:
        raise ValueError(f'CPU harness P14: cu_seqlens cover {doc.numel()} tokens, the packed row has {total}')
    pos = torch.arange(total)
    visible = (doc[:, None] == doc[None, :]) & (pos[None, :] <= pos[:, None])
    return (~visible).view(1, 1, total, total)


def _patch_dot_product_attention(dpa):
    cls = dpa.DotProductAttention
    if getattr(cls, '_cpu_harness_patched', False):
        return
    orig = cls.forward

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        if packed_seq_params is None or packed_seq_params.qkv_format != 'thd':
            return orig(self, query, key, value, attention_mask, attn_mask_type, attention_bias, packed_seq_params)
        if self.config.context_parallel_size > 1:
            raise NotImplementedError('CPU harness P14: THD attention without context parallel only')
        cu = packed_seq_params.cu_seqlens_q_padded
        cu = packed_seq_params.cu_seqlens_q if cu is None else cu
        mask = thd_causal_mask(cu, query.shape[0]).to(query.device)
        out = orig(self, query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1), mask, attn_mask_type,
                   attention_bias, None)  # [T, 1, hp]
        return out.squeeze(1)

    cls.forward = forward
    cls._cpu_harness_patched = True


# --------------------------------------------------------------------------------------------------------- P22
def _patch_megatron_gated_delta_net(gdn):
    import sys

    from . import hybrid
    # 0.16: the module gated_delta_net.py; 0.19: a package whose constructor checks `common.HAVE_FLA` and whose
    # `gdn` module imported the kernels by name. The constructor refuses to build without fla; the forward used is
    # mcore-bridge's.
    for mod in (gdn, sys.modules.get(gdn.__name__ + '.common'), sys.modules.get(gdn.__name__ + '.gdn')):
        if mod is not None:
            mod.HAVE_FLA = True
            mod.l2norm, mod.chunk_gated_delta_rule = hybrid.l2norm, hybrid.chunk_gated_delta_rule


def _patch_gated_delta_net(gdn):
    from . import hybrid
    gdn.causal_conv1d, gdn.l2norm, gdn.chunk_gated_delta_rule = (hybrid.causal_conv1d, hybrid.l2norm,
                                                                 hybrid.chunk_gated_delta_rule)


def _patch_hybrid_specs(specs):
    if getattr(specs, '_cpu_harness_patched', False):
        return
    from . import hybrid
    orig = specs.get_transformer_block_with_experimental_attention_variant_spec

    def get_transformer_block_with_experimental_attention_variant_spec(config, vp_stage=None, pp_rank=None):
        block_spec = orig(config, vp_stage, pp_rank)
        from .moe_mla import localize_te_specs
        localize_te_specs(block_spec, config)  # P17
        return block_spec

    orig_gdn = specs.get_gated_delta_net_module_spec

    def get_gated_delta_net_module_spec(config, backend=None):
        spec = orig_gdn(config, backend)
        spec.metainfo['fuse_input_layernorm'] = False  # in_proj has no fused norm here: a separate input norm
        return spec

    specs._get_backend_spec_provider = lambda config: hybrid.local_backend()
    specs.get_gated_delta_net_module_spec = get_gated_delta_net_module_spec
    specs._get_self_attention_module_spec = hybrid.local_self_attention_spec
    specs.get_transformer_block_with_experimental_attention_variant_spec = \
        get_transformer_block_with_experimental_attention_variant_spec
    specs._cpu_harness_patched = True


# --------------------------------------------------------------------------------------------------------- P15
def _patch_pack_as_cp(base):
    import functools

    from swift_plt.data.padding import pad_encoded_to
    from swift_plt.patch_level.patch_size import patch_size_of
    cp = int(os.environ['SWIFT_PLT_CPU_PACK_AS_CP'])
    inner = base.Template._encode_truncated

    @functools.wraps(inner)
    def _encode_truncated(self, inputs):
        encoded = inner(self, inputs)
        k = patch_size_of(self)
        if k > 1 and self.padding_free:
            pad_id = self.tokenizer.pad_token_id
            for e in encoded if isinstance(encoded, list) else [encoded]:
                pad_encoded_to(e, 2 * cp * k, self.tokenizer.eos_token_id if pad_id is None else pad_id)
        return encoded

    base.Template._encode_truncated = _encode_truncated


# --------------------------------------------------------------------------------------------------------- P16
def _patch_tuners_patcher(patcher):
    for name in ('TELayerNormColumnParallelLinear', 'TELinear', 'TEGroupedLinear'):
        if not isinstance(getattr(patcher, name, None), type):
            setattr(patcher, name, _NoTEModule)


# --------------------------------------------------------------------------------------------------------- P18
def _patch_multi_latent_attention(mla):
    for name in ('TELinear', 'TEColumnParallelLinear'):
        if not isinstance(getattr(mla, name, None), type):
            setattr(mla, name, _NoTEModule)


def _patch_mla_qk_norm_config(qk_norm_config):
    # megatron-core 0.19: MLA resolves its Q/KV norm and projection classes from the backend of
    # `config.transformer_impl` ('transformer_engine', whose classes are stand-ins here); the harness's layer spec
    # is the local backend's, so the resolver gets that one.
    # Without a Q LoRA it wants linear_q_proj fused with a norm (TE's LayerNormColumnParallelLinear, which the
    # local backend lacks): the harness keeps the spec's plain linear, as 0.16 built it (docs/model-families.md:
    # whether TE's fused Q norm changes DeepSeek-V2-Lite-shaped models on 0.19 is a GPU question).
    from megatron.core.models.backends import LocalSpecProvider
    qk_norm_config.get_backend = lambda transformer_impl: LocalSpecProvider()
    resolver = qk_norm_config.QKNormConfigResolver
    orig = resolver._mla_fused_linear_or_default

    def _mla_fused_linear_or_default(self, module_spec, module_name):
        if self.fused_norm_linear_impl is None and module_spec is not None:
            return module_spec
        return orig(self, module_spec, module_name)

    resolver._mla_fused_linear_or_default = _mla_fused_linear_or_default


# --------------------------------------------------------------------------------------------------------- P19
def _patch_moe_utils(moe_utils):
    if not hasattr(moe_utils, 'te_general_gemm'):
        moe_utils.te_general_gemm = None
    # P21
    orig = moe_utils.maybe_move_tensor_to_cpu
    if getattr(orig, '_cpu_harness_patched', False):
        return

    def maybe_move_tensor_to_cpu(tensor, as_numpy=False, record_stream=False):
        import torch
        if as_numpy and torch.is_tensor(tensor) and not tensor.is_cuda:
            return tensor.numpy()
        return orig(tensor, as_numpy, record_stream)

    maybe_move_tensor_to_cpu._cpu_harness_patched = True
    moe_utils.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu


def _patch_token_dispatcher(token_dispatcher):  # P21 (the name it imported from moe_utils, patched first)
    import megatron.core.transformer.moe.moe_utils as moe_utils
    token_dispatcher.maybe_move_tensor_to_cpu = moe_utils.maybe_move_tensor_to_cpu


def install():
    """Apply all patches (idempotent). Call before importing mcore_bridge / swift.megatron."""
    global _INSTALLED
    if _INSTALLED:
        return
    _INSTALLED = True
    import torch  # noqa: F401  (P8/P9 patch torch itself)
    patch_torch_cuda()  # P9
    NullStream.record_event = lambda self, event=None: NullStream()  # P20
    enter_mode()  # P8
    _imports.ensure_finder()
    _install_standins()  # P1
    _imports.when_imported('mcore_bridge.patcher', _patch_mcore_bridge_patcher)  # P2
    _imports.when_imported('mcore_bridge.model.register', _patch_model_register)  # P3
    _imports.when_imported('mcore_bridge.bridge.gpt_bridge', _patch_gpt_bridge)  # P4
    _imports.when_imported('mcore_bridge.config.model_config', _patch_model_config)  # P5
    _imports.when_imported('mcore_bridge.utils', _patch_set_random_seed)  # P6
    _imports.when_imported('megatron.core.tensor_parallel.random', _patch_megatron_random)  # P7
    _imports.when_imported('megatron.core.jit', _patch_megatron_jit)  # P10
    _imports.when_imported('megatron.core.fusions.fused_softmax', _patch_fused_softmax)  # P11
    _imports.when_imported('mcore_bridge.model.gpt_model', _patch_gpt_model)  # P12
    _imports.when_imported('megatron.core.transformer.torch_norm', _patch_torch_norm)  # P13
    _imports.when_imported('megatron.core.transformer.dot_product_attention', _patch_dot_product_attention)  # P14
    _imports.when_imported('mcore_bridge.model.gpts.glm4', _patch_glm4)  # P23
    if os.environ.get('SWIFT_PLT_CPU_PACK_AS_CP'):
        _imports.when_imported('swift.template.base', _patch_pack_as_cp)  # P15
    _imports.when_imported('mcore_bridge.tuners.patcher', _patch_tuners_patcher)  # P16
    _imports.when_imported('megatron.core.transformer.multi_latent_attention', _patch_multi_latent_attention)  # P18
    _imports.when_imported('megatron.core.transformer.mla_qk_norm_config', _patch_mla_qk_norm_config)  # P18 (0.19)
    _imports.when_imported('megatron.core.transformer.moe.moe_utils', _patch_moe_utils)  # P19, P21
    _imports.when_imported('megatron.core.transformer.moe.token_dispatcher', _patch_token_dispatcher)  # P21
    _imports.when_imported('megatron.core.ssm.gated_delta_net', _patch_megatron_gated_delta_net)  # P22
    _imports.when_imported('mcore_bridge.model.modules.gated_delta_net', _patch_gated_delta_net)  # P22
    _imports.when_imported('megatron.core.models.gpt.experimental_attention_variant_module_specs',
                           _patch_hybrid_specs)  # P22
    from .cp_attention import enable_from_env
    enable_from_env()  # SWIFT_PLT_CPU_CP_ATTENTION=zigzag|contiguous: the CPU CP attention stand-in (cp_attention.py)


def is_installed() -> bool:
    return _INSTALLED
