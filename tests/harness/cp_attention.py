"""A CPU stand-in for Transformer Engine's context-parallel attention, for megatron's local layer spec over gloo.

megatron-core's local ``DotProductAttention`` has no context parallel (CP) and no packed (THD) input; on GPUs both come
from ``TEDotProductAttention``. ``CPDotProductAttention`` takes its place in the local spec (``enable()``) and follows
TE's contract for causal self-attention under CP (the layout ms-swift / mcore-bridge ``split_cp_inputs`` produce):

  * padded (sbhd) batches: each rank holds ``s_local`` positions of a sequence of ``S = CP * s_local``; zigzag: the
    sequence is cut into 2*CP equal chunks and rank r holds chunks r and 2*CP-1-r, in that order; contiguous: block
    r of CP equal blocks. ``attention_mask``, if given, is the full ``[B, 1, S, S]`` bool mask (True = masked), as
    ms-swift passes it (not split); ``None`` means causal.
  * packed (thd) batches: ``packed_seq_params.cu_seqlens_q`` (``cu_seqlens_q_padded`` if set) are the boundaries
    of the whole packed sequence; zigzag: every sequence is cut into 2*CP chunks on its own, rank r keeping chunks r
    and 2*CP-1-r of each, sequence after sequence; contiguous: the flattened sequence is cut into CP blocks.

Every rank all-gathers K and V over the CP group (autograd: the backward all-reduces the gradient and keeps this
rank's slice) and computes exact attention of its queries: a key is visible iff it is in the same packed sequence,
its global position is <= the query's, and ``attention_mask`` does not mask it. Scores are filled with -10000 where
masked (megatron's ``attention_mask_func``), softmax in fp32. The global positions are computed here, from the
partition rule above, independently of ``split_cp_inputs`` (the tests compare the two). With CP=1 it is plain causal
attention, for padded and packed batches alike. Not covered: dropout (must be 0), sliding windows, attention bias.

``enable(mode)`` also replaces megatron's ``get_pos_emb_on_this_cp_rank`` (RoPE slice of padded batches under CP)
by the same code without pinned memory (CPU-only torch has none). It swaps the stand-in into ``ModelLoader.get_transformer_layer_spec`` of this process (call before building the
model); ``SWIFT_PLT_CPU_CP_ATTENTION=zigzag|contiguous`` does the same from ``harness.install()`` (CLI runs).
"""
import math
import os

MODE = 'zigzag'
_ENABLED = False


def local_positions(total: int, cp: int, rank: int, mode: str, cu_seqlens=None):
    """Global positions (0..total-1) held by CP rank ``rank``, in local order."""
    import torch
    if cp == 1:
        return torch.arange(total)
    if mode == 'contiguous':
        if total % cp:
            raise ValueError(f'CP stand-in: length {total} is not a multiple of CP={cp} (contiguous split)')
        n = total // cp
        return torch.arange(rank * n, (rank + 1) * n)
    if mode != 'zigzag':
        raise ValueError(f'CP stand-in: unknown cp_partition_mode {mode!r}')
    bounds = [0, total] if cu_seqlens is None else [int(x) for x in cu_seqlens]
    parts = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        if (b - a) % (2 * cp):
            raise ValueError(f'CP stand-in: a sequence of {b - a} positions is not a multiple of 2*CP={2 * cp} '
                             '(TE requires it for the zigzag split)')
        c = (b - a) // (2 * cp)
        parts += [torch.arange(a + rank * c, a + (rank + 1) * c),
                  torch.arange(a + (2 * cp - 1 - rank) * c, a + (2 * cp - rank) * c)]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def _all_gather(x, group):
    import torch
    import torch.distributed as dist

    class _AllGather(torch.autograd.Function):

        @staticmethod
        def forward(ctx, t):
            ws = dist.get_world_size(group)
            out = [torch.empty_like(t) for _ in range(ws)]
            dist.all_gather(out, t.contiguous(), group=group)
            ctx.rank, ctx.n = dist.get_rank(group), t.shape[0]
            return torch.cat(out, 0)

        @staticmethod
        def backward(ctx, g):
            g = g.contiguous().clone()
            dist.all_reduce(g, group=group)
            return g[ctx.rank * ctx.n:(ctx.rank + 1) * ctx.n]

    return _AllGather.apply(x)


def _make_class():
    import torch
    from megatron.core import parallel_state
    from megatron.core.transformer.module import MegatronModule

    class CPDotProductAttention(MegatronModule):
        """See the module docstring. Same constructor as megatron's ``DotProductAttention``."""

        def __init__(self, config, layer_number, attn_mask_type, attention_type, attention_dropout=None,
                     softmax_scale=None, cp_comm_type=None, pg_collection=None, **kwargs):
            super().__init__(config=config)
            dropout = config.attention_dropout if attention_dropout is None else attention_dropout
            if dropout:
                raise NotImplementedError('CP stand-in: attention dropout must be 0')
            tp = parallel_state.get_tensor_model_parallel_world_size()
            self.heads = config.num_attention_heads // tp
            self.groups = config.num_query_groups // tp
            head_dim = config.kv_channels
            self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)

        def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                    packed_seq_params=None, **kwargs):
            assert attention_bias is None, 'CP stand-in: no attention bias'
            group = parallel_state.get_context_parallel_group()
            cp = parallel_state.get_context_parallel_world_size()
            rank = parallel_state.get_context_parallel_rank()
            thd = packed_seq_params is not None and packed_seq_params.qkv_format == 'thd'
            if thd:  # [t, n, d] -> [t, 1, n, d]
                query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
                cu = packed_seq_params.cu_seqlens_q_padded
                cu = packed_seq_params.cu_seqlens_q if cu is None else cu
                total = int(cu[-1])
            else:
                cu, total = None, query.shape[0] * cp
            if cp > 1:
                key, value = _all_gather(key, group), _all_gather(value, group)
            gq = local_positions(total, cp, rank, MODE, cu)
            gk = torch.cat([local_positions(total, cp, r, MODE, cu) for r in range(cp)])
            assert gq.numel() == query.shape[0] and gk.numel() == key.shape[0], (gq.numel(), query.shape, key.shape)
            masked = gk[None, :] > gq[:, None]  # causal, by global position
            if thd:
                bounds = torch.as_tensor([int(x) for x in cu])
                doc_q = torch.searchsorted(bounds, gq, right=True)
                doc_k = torch.searchsorted(bounds, gk, right=True)
                masked = masked | (doc_q[:, None] != doc_k[None, :])
            masked = masked[None, None]  # [1, 1, sq, sk]
            if attention_mask is not None and not thd:
                masked = masked | attention_mask[:, :, gq][:, :, :, gk]
            rep = self.heads // self.groups
            if rep > 1:
                key = key.repeat_interleave(rep, dim=2)
                value = value.repeat_interleave(rep, dim=2)
            q = query.permute(1, 2, 0, 3)  # [b, n, sq, d]
            k = key.permute(1, 2, 3, 0)  # [b, n, d, sk]
            v = value.permute(1, 2, 0, 3)  # [b, n, sk, d]
            scores = torch.matmul(q, k) * self.softmax_scale
            scores = scores.masked_fill(masked.to(scores.device), -10000.0)
            probs = torch.softmax(scores.float(), dim=-1).to(v.dtype)
            context = torch.matmul(probs, v)  # [b, n, sq, d]
            context = context.permute(2, 0, 1, 3).contiguous()  # [sq, b, n, d]
            return context.reshape(context.shape[0], context.shape[1], -1)

    return CPDotProductAttention


def enable(mode: str = 'zigzag') -> None:
    """Use the stand-in for every model this process builds from now on (``mode``: the cp_partition_mode)."""
    global MODE, _ENABLED
    MODE = mode
    if _ENABLED:
        return
    _ENABLED = True
    from .patches import install
    install()
    from mcore_bridge.model import register

    loader = register.ModelLoader
    orig = loader.get_transformer_layer_spec  # the harness's local-spec version (patches.P3)
    cls = _make_class()

    def get_transformer_layer_spec(self, vp_stage=None):
        spec = orig(self, vp_stage=vp_stage)
        for layer in getattr(spec, 'layer_specs', None) or [spec]:
            layer.submodules.self_attention.submodules.core_attention = cls
        return spec

    loader.get_transformer_layer_spec = get_transformer_layer_spec
    _patch_hybrid_attention(cls)
    _patch_rope_cp_slice()


def _patch_hybrid_attention(cls):
    """The Gated-DeltaNet hybrids' loaders (mcore-bridge's Qwen3NextLoader with USE_MCORE_GDN=1) build their block
    from megatron's hybrid block spec, whose full-attention layers come from ``_get_self_attention_module_spec``
    (the harness's local one, patches.P22): the stand-in becomes their core attention too."""
    try:
        from megatron.core.models.gpt import experimental_attention_variant_module_specs as specs
    except ImportError:
        return
    orig = specs._get_self_attention_module_spec

    def _get_self_attention_module_spec(config, backend=None):
        spec = orig(config, backend)
        spec.submodules.core_attention = cls
        return spec

    specs._get_self_attention_module_spec = _get_self_attention_module_spec


def _patch_rope_cp_slice():
    """megatron-core 0.16.1 ``rope_utils.get_pos_emb_on_this_cp_rank`` (padded batches under CP: this rank's zigzag
    chunks of the RoPE table) builds its index with ``pin_memory=True``, which CPU-only torch refuses. The same
    function without pinned memory, rebound where it is imported by name."""
    import torch
    from megatron.core.models.common.embeddings import rope_utils, rotary_pos_embedding, yarn_rotary_pos_embedding

    def get_pos_emb_on_this_cp_rank(pos_emb, seq_dim, cp_group):
        if cp_group is None:
            raise ValueError('cp_group must be provided to get positional embedding per CP rank')
        cp_size, cp_rank = cp_group.size(), cp_group.rank()
        cp_idx = torch.tensor([cp_rank, (2 * cp_size - cp_rank - 1)], device=pos_emb.device)
        pos_emb = pos_emb.view(*pos_emb.shape[:seq_dim], 2 * cp_size, -1, *pos_emb.shape[(seq_dim + 1):])
        pos_emb = pos_emb.index_select(seq_dim, cp_idx)
        return pos_emb.view(*pos_emb.shape[:seq_dim], -1, *pos_emb.shape[(seq_dim + 2):])

    for module in (rope_utils, rotary_pos_embedding, yarn_rotary_pos_embedding):
        if hasattr(module, 'get_pos_emb_on_this_cp_rank'):
            module.get_pos_emb_on_this_cp_rank = get_pos_emb_on_this_cp_rank


def enable_from_env() -> None:
    mode = os.environ.get('SWIFT_PLT_CPU_CP_ATTENTION')
    if mode:
        from . import _imports
        _imports.when_imported('mcore_bridge.model.register', lambda _m: enable(mode))
