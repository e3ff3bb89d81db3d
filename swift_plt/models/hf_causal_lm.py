"""The HF side of PLT: ``plt_causal_lm_class(FamilyForCausalLM)``, the family's own transformers class plus
``config.patch_size`` K. K=1: the family's methods as is. K > 1 (training only): pooled patches and the PLT loss on
unshifted, token-aligned labels, with the Megatron model's functions (``swift_plt.patch_level``); a sliding window of
W tokens is ceil(W / K) patches (``swift_plt.patch_level.window``); MoE families add their router aux loss over patches;
``generate()`` refuses. Saved as the plain family model (docs/hf-backend.md).
"""
import sys
from typing import Optional

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast, MoeCausalLMOutputWithPast

from swift_plt.patch_level.window import patch_window
from swift_plt.patch_level import IGNORE_INDEX
from swift_plt.patch_level.layout import (
    check_patch_aligned,
    mask_first_patch,
    patch_cu_seqlens,
    patch_padding_mask,
    patch_position_ids,
    pool_patches,
)
from swift_plt.patch_level.loss import plt_token_losses
from swift_plt.patch_level.patch_size import patch_size_of

GENERATE_ERROR = ('patch_size={k}: a patch-level (PLT) model does not generate token by token. Generate with the '
                  'token-level model: load the checkpoint as the plain model ({name}; swift-plt saves it so), or set '
                  'config.patch_size = 1.')


class PLTCausalLM:
    """Mixin before a transformers ``*ForCausalLM`` with ``.model`` (the decoder) and ``.lm_head``."""

    @property
    def patch_size(self) -> int:
        return patch_size_of(self.config)

    @classmethod
    def plain_class(cls):
        return next(c for c in cls.__mro__[1:] if not issubclass(c, PLTCausalLM))

    def forward(self,
                input_ids: Optional[torch.LongTensor] = None,
                attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.LongTensor] = None,
                past_key_values=None,
                inputs_embeds: Optional[torch.FloatTensor] = None,
                labels: Optional[torch.LongTensor] = None,
                use_cache: Optional[bool] = None,
                **kwargs):
        # No `logits_to_keep` parameter (it still reaches the family's forward through **kwargs at K=1): ms-swift's
        # HF trainer turns on `use_logits_to_keep`, which trims the labels token by token, when the signature has it.
        k = self.patch_size
        self._sync_sliding_window(k)
        if k == 1:
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                   past_key_values=past_key_values, inputs_embeds=inputs_embeds, labels=labels,
                                   use_cache=use_cache, **kwargs)
        if past_key_values is not None or use_cache:
            raise NotImplementedError(GENERATE_ERROR.format(k=k, name=self.plain_class().__name__))
        if inputs_embeds is None:
            inputs_embeds = self.model.get_input_embeddings()(input_ids)
        B, S, _ = inputs_embeds.shape
        if position_ids is None:
            position_ids = torch.arange(S, device=inputs_embeds.device).expand(B, S)
        check_patch_aligned(position_ids, k)  # S % K == 0 and no patch straddles two documents
        if attention_mask is not None:
            attention_mask = patch_padding_mask(attention_mask, k)
        num_items_in_batch = kwargs.pop('num_items_in_batch', None)
        aux_loss_func = self._aux_loss_func(kwargs)
        patch_pos = patch_position_ids(position_ids, k)
        outputs = self.model(
            inputs_embeds=pool_patches(inputs_embeds.transpose(0, 1), k).transpose(0, 1).contiguous(),  # [B, P, H]
            attention_mask=attention_mask,
            position_ids=patch_pos,
            use_cache=False,
            **patch_packing_kwargs(kwargs, patch_pos, k, self._has_linear_attention()))
        logits = self.lm_head(outputs.last_hidden_state)  # [B, P, V]: patch p predicts the tokens of patch p+1
        loss = None
        if labels is not None:
            labels = mask_first_patch(labels, position_ids, k)
            total = plt_token_losses(logits.transpose(0, 1), labels, k).sum()
            count = num_items_in_batch if num_items_in_batch is not None else (labels != IGNORE_INDEX).sum()
            loss = total / count
        if aux_loss_func is None:
            return CausalLMOutputWithPast(
                loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions)
        # the family's load-balancing loss over the routed rows, which are patches (the patch padding mask)
        text = self._text_config()
        aux_loss = aux_loss_func(outputs.router_logits, text.num_experts, text.num_experts_per_tok, attention_mask)
        if loss is not None:
            loss = loss + text.router_aux_loss_coef * aux_loss.to(loss.device)
        return MoeCausalLMOutputWithPast(loss=loss, aux_loss=aux_loss, logits=logits,
                                         hidden_states=outputs.hidden_states, attentions=outputs.attentions,
                                         router_logits=outputs.router_logits)

    def _aux_loss_func(self, kwargs):
        """The family's ``load_balancing_loss_func`` where its forward would add the router aux loss now, else None
        (kwargs: the forward's, ``output_router_logits`` set as the family's forward sets it)."""
        func = getattr(sys.modules[self.plain_class().__module__], 'load_balancing_loss_func', None)
        if func is None or getattr(self._text_config(), 'router_aux_loss_coef', None) is None:
            return None
        flag = kwargs.get('output_router_logits')
        if flag is None:
            flag = getattr(self._text_config(), 'output_router_logits', False)
        kwargs['output_router_logits'] = flag
        return func if flag else None

    def _has_linear_attention(self) -> bool:
        """Gated-DeltaNet layers (Qwen3-Next, Qwen3.5): the family record's flag."""
        from swift_plt import families
        family = families.family(getattr(self.config, 'model_type', None))
        return family is not None and family.linear_attention

    def _sync_sliding_window(self, k: int) -> None:
        """The decoder's sliding window (its config's ``sliding_window``, read by the mask, and each attention layer's
        copy, read by flash kernels) in the units it runs over: ceil(W / K) patches for K > 1, W tokens for K=1. Left
        so until K changes: a layer recomputed in the backward pass (gradient checkpointing) sees its forward's."""
        text = self._text_config()
        current = getattr(text, 'sliding_window', None)
        if not current:  # None, or 0 (Qwen2-MoE without use_sliding_window): no window
            return
        if getattr(self, '_plt_window_tokens', None) is None:
            self._plt_window_tokens = current  # the first call sees config.json's W (only this method changes it)
        wanted = patch_window(self._plt_window_tokens, k)
        if wanted == current:
            return
        for module in self.modules():
            if getattr(module, 'sliding_window', None) == current:
                module.sliding_window = wanted
        text.sliding_window = wanted

    def _text_config(self):
        """The config of the decoder (layer types, router settings): a multimodal checkpoint's text config, else the
        config."""
        return getattr(self.config, 'text_config', self.config)

    def generate(self, *args, **kwargs):
        if self.patch_size > 1:
            raise NotImplementedError(GENERATE_ERROR.format(k=self.patch_size, name=self.plain_class().__name__))
        self._sync_sliding_window(1)  # the cache is sized from the config's window
        return super().generate(*args, **kwargs)

    def save_pretrained(self, save_directory, *args, is_main_process: bool = True, **kwargs):
        """Save as the plain family model (its own ``architectures``, no ``patch_size`` in config.json, the sliding
        window in tokens): K is a training setting, so the checkpoint loads anywhere as a token-level model."""
        config = self.config
        patch_size = self.patch_size
        self._sync_sliding_window(1)
        k = config.__dict__.pop('patch_size', None)
        try:
            super().save_pretrained(save_directory, *args, is_main_process=is_main_process, **kwargs)
            config.architectures = [self.plain_class().__name__]  # upstream wrote type(self).__name__
            if is_main_process:
                config.save_pretrained(save_directory)
        finally:
            if k is not None:
                config.patch_size = k
            self._sync_sliding_window(patch_size)


def patch_packing_kwargs(kwargs: dict, patch_pos: torch.Tensor, patch_size: int, linear_attention=False) -> dict:
    """A packed row's varlen kwargs (``cu_seq_lens_q/k``, ``max_length_q/k``: ms-swift's multimodal collator passes
    them; attention and the Gated DeltaNet read them) at patch level: the documents' patch boundaries. A model with
    linear-attention layers gets them for any packed row (attention finds them from the positions). Whether its Gated
    DeltaNet then restarts per document depends on the kernels: where it would not, packed rows are refused before
    step 1 (swift_plt.plugin.arguments.packed_hybrid_problem)."""
    out = dict(kwargs)
    if linear_attention and out.get('cu_seq_lens_q') is None and patch_pos.shape[0] == 1 and \
            int((patch_pos == 0).sum()) > 1:
        cu = patch_cu_seqlens(patch_pos)
        longest = int((cu[1:] - cu[:-1]).max())
        out.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)
        return out
    for name in ('cu_seq_lens_q', 'cu_seq_lens_k'):
        if out.get(name) is not None:
            out[name] = patch_cu_seqlens(patch_pos).to(out[name].dtype)
    for name in ('max_length_q', 'max_length_k'):
        if out.get(name) is not None:
            out[name] = -(-int(out[name]) // patch_size)
    return out


_CLASSES = {}


def plt_causal_lm_class(base: type) -> type:
    """``PLT<Base>``: the PLT model over transformers' ``base`` (a ``*ForCausalLM``), one class per base."""
    if issubclass(base, PLTCausalLM):
        return base
    if base not in _CLASSES:
        cls = type(f'PLT{base.__name__}', (PLTCausalLM, base), {'__module__': __name__})
        setattr(sys.modules[__name__], cls.__name__, cls)  # picklable by reference
        _CLASSES[base] = cls
    return _CLASSES[base]


def causal_lm_class(config) -> type:
    """The family's transformers class for ``config``: its ``*ForCausalLM``; for a multimodal checkpoint trained on
    text (Qwen3.5) its ``*ForConditionalGeneration``, so the vision tower is loaded and saved as it came."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from swift_plt import families
    family = families.family(getattr(config, 'model_type', None))
    if family is not None and family.text_only_multimodal:
        return AutoModelForImageTextToText._model_mapping[type(config)]
    return AutoModelForCausalLM._model_mapping[type(config)]


def plt_auto_model_class(patch_size: int) -> type:
    """An ``auto_model_cls`` for ms-swift's model loading: the config's own ``*ForCausalLM`` as its PLT class."""

    class PLTAutoModelForCausalLM:

        @classmethod
        def from_pretrained(cls, *args, config=None, **kwargs):
            from transformers import AutoConfig
            if config is None:
                config = AutoConfig.from_pretrained(args[0], trust_remote_code=kwargs.get('trust_remote_code', False))
            base = causal_lm_class(config)
            config.patch_size = patch_size
            return plt_causal_lm_class(base).from_pretrained(*args, config=config, **kwargs)

    return PLTAutoModelForCausalLM
