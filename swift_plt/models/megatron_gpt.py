"""The Megatron side of PLT: config, GPTModel and loader for mcore-bridge, for every family of
swift_plt/families/ (`gpt`, their own types, the Gated-DeltaNet hybrids) and ``llama3_2_plt``. At K > 1
``PLTGPTModel`` pools token embeddings into patches, hands upstream's forward patch-level positions, masks and THD
boundaries (so attention, MLA's RoPE, MoE routing and the Gated DeltaNet's convolution and recurrence run over
patches; a sliding window of W tokens is ceil(W / K) patches), and returns the PLT loss token-aligned [B, S], so
ms-swift's ``loss_func`` is unchanged (layouts: docs/parallel-layouts.md, families: docs/model-families.md). K=1:
upstream's methods as is.
"""
import copy
from dataclasses import dataclass
from typing import Optional

import torch
from mcore_bridge.config import ModelConfig
from mcore_bridge.model import GPTModel, MultimodalGPTModel
from mcore_bridge.model.register import ModelLoader
from megatron.core.transformer.moe.router import TopKRouter as McoreTopKRouter

from swift_plt import families
from swift_plt.patch_level.window import patch_window_size
from swift_plt.patch_level.layout import (
    check_sequence_parallel_length,
    cp_patch_cu_seqlens,
    patch_attention_mask,
    patch_cu_seqlens,
    patch_position_ids,
    pool_patches,
)
from swift_plt.patch_level.loss import plt_local_token_losses, plt_token_losses
from swift_plt.patch_level.patch_size import resolve_patch_size


@dataclass
class PLTModelConfig(ModelConfig):
    # None: take `patch_size` from the HF config.json, else 1. ms-swift copies `args.patch_size` here.
    patch_size: Optional[int] = None

    def __post_init__(self):
        super().__post_init__()
        if self.patch_size is None:
            self.patch_size = resolve_patch_size(None, self.hf_config)
        if self.patch_size > 1:
            # The CLI already refused these (swift_plt.plugin.arguments); this guards direct API use.
            unsupported = {
                'mtp_num_layers': bool(self.mtp_num_layers),
                # a multimodal checkpoint trains its language model on text (Family.text_only_multimodal)
                'is_multimodal': self.is_multimodal and self.hf_model_type not in families.TEXT_ONLY_MULTIMODAL,
                'task_type != causal_lm': self.task_type != 'causal_lm',
                # a hash route reads token ids, which a patch does not have
                'moe_n_hash_layers (hash routing on token ids)': bool(getattr(self, 'moe_n_hash_layers', 0)),
                # gated_delta_net: the hybrids' linear attention, which runs over patches (its THD boundaries too)
                'experimental_attention_variant': self.experimental_attention_variant not in (None, 'gated_delta_net'),
            }
            bad = [k for k, v in unsupported.items() if v]
            if self.experimental_attention_variant == 'gated_delta_net':
                bad += families.linear_attention_problems(self.context_parallel_size)
            if bad:
                raise ValueError(f'patch_size={self.patch_size} (PLT) does not support: {", ".join(bad)}.')
            # sliding-window layers (GPT-OSS): W tokens -> ceil(W / K) patches (swift_plt.patch_level.window)
            self.window_size = patch_window_size(self.window_size, self.patch_size)
            # Pipeline stages exchange [P, B, H], not the [seq_length, B, H] megatron's schedules would assume
            # from `seq_length`: make them communicate shapes (mcore-bridge's default, enforced here).
            self.variable_seq_lengths = True


def patch_max_seqlen(token_max_seqlen: int, patch_size: int) -> int:
    """Longest patch-level document from the token-level one, on the host: ceil(L / K), exact for documents padded
    to a multiple of K and for the one-token padding "documents" of a packed row (one patch each)."""
    return -(-token_max_seqlen // patch_size)


def patch_packed_seq_params(packed_seq_params, patch_pos: torch.Tensor, patch_size: Optional[int] = None):
    """Token-level THD PackedSeqParams -> patch-level (a copy). max_seqlen from the host int ``max_seqlen_q`` given
    ``patch_size``, else from the patch cu_seqlens (a device sync)."""
    cu_seqlens = patch_cu_seqlens(patch_pos)
    token_max = packed_seq_params.max_seqlen_q
    if patch_size is not None and isinstance(token_max, int) and token_max > 0:
        max_seqlen = patch_max_seqlen(token_max, patch_size)
    else:
        max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    params = copy.copy(packed_seq_params)
    params.cu_seqlens_q = params.cu_seqlens_kv = cu_seqlens
    params.max_seqlen_q = params.max_seqlen_kv = max_seqlen
    params.cu_seqlens_q_padded = params.cu_seqlens_kv_padded = None
    if hasattr(params, 'total_tokens'):
        params.total_tokens = patch_pos.numel()
    return params


def patch_packed_seq_params_cp(packed_seq_params, patch_size: int):
    """CP: token-level THD PackedSeqParams of the whole packed sequence -> patch level (a copy): the global
    cu_seqlens (and padded variants) divided by K, since the local position_ids are only a slice."""
    params = copy.copy(packed_seq_params)
    params.cu_seqlens_q = cp_patch_cu_seqlens(packed_seq_params.cu_seqlens_q, patch_size)
    params.cu_seqlens_kv = cp_patch_cu_seqlens(packed_seq_params.cu_seqlens_kv, patch_size)
    for name in ('cu_seqlens_q_padded', 'cu_seqlens_kv_padded'):
        value = getattr(packed_seq_params, name, None)
        if value is not None:
            setattr(params, name, cp_patch_cu_seqlens(value, patch_size))
    for name in ('max_seqlen_q', 'max_seqlen_kv'):  # from the host int where ms-swift gives one (no device sync)
        token_max, cu = getattr(packed_seq_params, name), getattr(params, 'cu_seqlens_' + name[len('max_seqlen_'):])
        setattr(params, name, token_max // patch_size if isinstance(token_max, int) and token_max > 0 else
                int((cu[1:] - cu[:-1]).max()))  # exact: every document is a multiple of 2*CP*K tokens
    if hasattr(params, 'total_tokens') and getattr(packed_seq_params, 'total_tokens', None) is not None:
        params.total_tokens = packed_seq_params.total_tokens // patch_size
    return params


def thd_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """The text positions of a packed row: multimodal RoPE's [3, B, S] ids give their first row (for text the three
    rows are the text positions), [B, S] ids are themselves."""
    return position_ids[0] if position_ids.dim() == 3 else position_ids


class PLTGPTModel(GPTModel):
    config: PLTModelConfig
    # True in the language model of a multimodal wrapper, which hands it the token embeddings (PLTMultimodalGPTModel)
    pools_decoder_input = False

    @property
    def patch_size(self) -> int:
        return self.config.patch_size

    def forward(self,
                input_ids,
                position_ids,
                attention_mask=None,
                decoder_input=None,
                labels=None,
                inference_context=None,
                packed_seq_params=None,
                extra_block_kwargs=None,
                runtime_gather_output=None,
                *,
                inference_params=None,
                loss_mask=None):
        k = self.patch_size
        if k > 1:
            if inference_context is not None or inference_params is not None:
                raise NotImplementedError(f'patch_size={k}: a patch-level model does not generate token by token; '
                                          'generate with the token-level (patch_size=1) model.')
            if self.pre_process and decoder_input is None:
                check_sequence_parallel_length(input_ids.shape[-1], k, self.config.tensor_model_parallel_size,
                                               self.config.sequence_parallel)
                # [S, B, H] token embeddings -> [P, B, H] patch embeddings (mean of K). Under sequence parallel the
                # embedding is already scattered: this rank pools its S/TP consecutive tokens into its P/TP patches.
                decoder_input = pool_patches(self.embedding(input_ids=input_ids, position_ids=position_ids), k)
            elif self.pre_process and self.pools_decoder_input:
                check_sequence_parallel_length(input_ids.shape[-1], k, self.config.tensor_model_parallel_size,
                                               self.config.sequence_parallel)
                decoder_input = pool_patches(decoder_input, k)
            position_ids = patch_position_ids(position_ids, k)
            if attention_mask is not None:
                attention_mask = patch_attention_mask(attention_mask, k)
            if packed_seq_params is not None and self.config.context_parallel_size > 1:
                packed_seq_params = patch_packed_seq_params_cp(packed_seq_params, k)
            elif packed_seq_params is not None:
                packed_seq_params = patch_packed_seq_params(packed_seq_params, thd_position_ids(position_ids), k)
        return super().forward(
            input_ids,
            position_ids,
            attention_mask,
            decoder_input,
            labels,
            inference_context,
            packed_seq_params,
            extra_block_kwargs,
            runtime_gather_output,
            inference_params=inference_params,
            loss_mask=loss_mask)

    def compute_language_model_loss(self, labels: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        k = self.patch_size
        if k == 1:
            return super().compute_language_model_loss(labels, logits)
        # logits [P, B, V/tp] are vocab-sharded over the TP group (parallel_output); never gathered here.
        tp = self.pg_collection.tp
        tp_size = torch.distributed.get_world_size(tp) if tp is not None else 1
        vocab_start = torch.distributed.get_rank(tp) * logits.shape[-1] if tp_size > 1 else 0
        group = tp if tp_size > 1 else None
        # The logits come straight from the output layer, whose backward does not keep them: the fused loss (CUDA)
        # writes their gradient into their storage (inplace_grad), the torch path ignores the flag.
        if self.config.context_parallel_size > 1:
            # labels were rolled by K before the CP split (plugin/patches/swift_megatron_trainers_utils.py): the
            # targets of each local patch are its own K label slots
            return plt_local_token_losses(logits, labels, k, vocab_start, group, inplace_grad=True)
        return plt_token_losses(logits, labels, k, vocab_start, group, inplace_grad=True)


def scale_router_losses(model, patch_size: int) -> None:
    """At K > 1 with per-token loss (ms-swift's default for pre-training), each router's aux and z-loss
    coefficients times K: megatron weights these losses by the routed rows of the micro-batch, which are patches,
    while the LM loss is normalised by label tokens (K per patch). Times K keeps their weight what it is at K=1.
    Values logged for these losses are divided by the coefficient, so they stay comparable across K."""
    if patch_size == 1 or not model.config.calculate_per_token_loss:
        return
    for module in model.modules():
        if isinstance(module, McoreTopKRouter):
            config = copy.copy(module.config)
            coeff = config.moe_aux_loss_coeff
            config.moe_aux_loss_coeff = [c * patch_size for c in coeff] if isinstance(coeff, list) else \
                coeff * patch_size
            if config.moe_z_loss_coeff is not None:
                config.moe_z_loss_coeff = config.moe_z_loss_coeff * patch_size
            module.config = config


class PLTLanguageModel(PLTGPTModel):
    """The language model of ``PLTMultimodalGPTModel``: pools the token embeddings its wrapper hands it."""
    pools_decoder_input = True


class PLTMultimodalGPTModel(MultimodalGPTModel):
    """A multimodal checkpoint (Qwen3.5) trained at patch level on text: the wrapper embeds the tokens as upstream
    does (the vision tower's text-only pass included), its language model pools them. Images are refused earlier."""
    language_model_cls = PLTLanguageModel


class PLTLoaderMixin:
    """Over an mcore-bridge loader: build PLT's model classes, router loss coefficients scaled by K."""

    def __init__(self, config):
        super().__init__(config)
        self.model_cls = PLTMultimodalGPTModel if config.is_multimodal else PLTGPTModel

    def build_model(self, *args, **kwargs):
        model = super().build_model(*args, **kwargs)
        scale_router_losses(model, self.config.patch_size)
        return model


class PLTModelLoader(PLTLoaderMixin, ModelLoader):
    model_cls = PLTGPTModel


def plt_loader(mcore_type: str, upstream):
    """The PLT loader over mcore-bridge's meta ``upstream`` of ``mcore_type``, whose loader and bridge must be the ones
    the family records name (swift_plt.families.mcore_bridge)."""
    from swift_plt.families.mcore_bridge import over, upstream_problem
    problem = upstream_problem(mcore_type, upstream)
    if problem:
        raise RuntimeError(problem)
    return over('PLT', PLTLoaderMixin, upstream.loader, PLTModelLoader)
