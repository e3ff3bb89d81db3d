"""CPU stand-ins for the hybrid Gated-DeltaNet decoders (Qwen3-Next, Qwen3.5) of mcore-bridge 1.6.5 (patch P22, see
patches.py): the flash-linear-attention (fla) kernels as per-document torch loops over transformers' own torch
functions, and megatron-core 0.16.1's hybrid block spec on the local (non-TE) backend.

Imported lazily by the P22 hooks (megatron-core is already imported then).
"""
import torch
import torch.nn.functional as F


def _segments(cu_seqlens, total: int):
    if cu_seqlens is None:
        return [(0, total)]
    cu = [int(x) for x in cu_seqlens.tolist()]
    if cu[-1] != total:
        raise ValueError(f'CPU harness P22: cu_seqlens end at {cu[-1]}, the packed row has {total}')
    return list(zip(cu[:-1], cu[1:]))


def causal_conv1d(x, weight, bias=None, activation=None, cu_seqlens=None, **kwargs):
    """fla's ``causal_conv1d`` ([B, T, D] in, weight [D, W]): a depthwise causal convolution that restarts at every
    document of ``cu_seqlens`` (B = 1 then). Returns (y, None) as fla does without a final state."""
    if cu_seqlens is not None and x.shape[0] != 1:
        raise ValueError('CPU harness P22: cu_seqlens needs B = 1')
    width = weight.shape[-1]
    outs = []
    for start, end in _segments(cu_seqlens, x.shape[1]):
        seg = x[:, start:end].transpose(1, 2)  # [B, D, t]
        y = F.conv1d(seg, weight.unsqueeze(1), bias, padding=width - 1, groups=seg.shape[1])[..., :end - start]
        outs.append(y.transpose(1, 2))
    y = torch.cat(outs, dim=1)
    if activation in ('silu', 'swish'):
        y = F.silu(y)
    elif activation is not None:
        raise ValueError(f'CPU harness P22: activation {activation!r}')
    return y, None


def l2norm(x, dim: int = -1, eps: float = 1e-6, **kwargs):
    """fla's ``l2norm``: x / sqrt(sum x^2 + eps) over the last dim (transformers' l2norm, the same formula)."""
    return x * torch.rsqrt((x * x).sum(dim=dim, keepdim=True) + eps)


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
    """fla's ``chunk_gated_delta_rule`` ([B, T, H, d]): transformers' ``torch_chunk_gated_delta_rule`` run per
    document of ``cu_seqlens`` (the recurrence restarts from a zero state at each one). Returns (o, None)."""
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule
    if initial_state is not None or output_final_state:
        raise NotImplementedError('CPU harness P22: no recurrent state in training')
    if scale is not None and scale != q.shape[-1]**-0.5:
        raise NotImplementedError('CPU harness P22: the default scale only')
    outs = []
    for start, end in _segments(cu_seqlens, q.shape[1]):
        o, _ = torch_chunk_gated_delta_rule(q[:, start:end], k[:, start:end], v[:, start:end], g[:, start:end],
                                            beta[:, start:end], use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
        outs.append(o)
    return torch.cat(outs, dim=1), None


class ZeroCenteredRMSNorm(torch.nn.RMSNorm):
    """TE's RMSNorm with ``zero_centered_gamma``: y = x / rms(x) * (1 + w), read at forward time (mcore-bridge's
    Qwen3-Next loader switches it off on the Gated DeltaNet's output norm after the build)."""
    zero_centered_gamma = True

    def forward(self, x):
        weight = 1 + self.weight if self.zero_centered_gamma else self.weight
        return F.rms_norm(x, self.normalized_shape, weight, self.eps)


def local_backend():
    """megatron-core's local spec provider for the hybrid block: the Gated DeltaNet's input projection is a plain
    ColumnParallelLinear after a separate input norm (TE fuses them; P4 maps the bridge's fused-norm key)."""
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.tensor_parallel import ColumnParallelLinear

    class HybridLocalSpecProvider(LocalSpecProvider):

        def column_parallel_layer_norm_linear(self):
            return ColumnParallelLinear

    return HybridLocalSpecProvider()


def local_self_attention_spec(config, backend=None):
    """The hybrid block's full-attention layers from megatron's local spec (TE's in upstream)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    layer_spec = get_gpt_layer_local_spec(
        num_experts=config.num_moe_experts, moe_grouped_gemm=config.moe_grouped_gemm,
        qk_layernorm=config.qk_layernorm, multi_latent_attention=config.multi_latent_attention,
        qk_l2_norm=config.qk_l2_norm, normalization=config.normalization)
    attn_spec = layer_spec.submodules.self_attention
    attn_spec.metainfo['fuse_input_layernorm'] = False
    return attn_spec
