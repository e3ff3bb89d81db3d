"""The HF side of ``llama3_2_plt``: ``PLTLlamaForCausalLM``, transformers' ``LlamaForCausalLM`` plus ``patch_size`` K.
K=1: Llama's methods as is. K > 1 (training only): pooled patches and the PLT loss on unshifted, token-aligned
labels, with the Megatron model's functions (``swift_plt.patch_level``); ``generate()`` refuses. Saved as a plain
Llama (docs/hf-backend.md).
"""
from typing import Optional

import torch
from transformers import LlamaForCausalLM
from transformers.modeling_outputs import CausalLMOutputWithPast

from swift_plt.patch_level import IGNORE_INDEX
from swift_plt.patch_level.layout import (
    check_patch_aligned,
    mask_first_patch,
    patch_padding_mask,
    patch_position_ids,
    pool_patches,
)
from swift_plt.patch_level.loss import plt_token_losses
from swift_plt.patch_level.patch_size import patch_size_of

GENERATE_ERROR = ('patch_size={k}: a patch-level (PLT) model does not generate token by token. Generate with the '
                  'token-level model: load the checkpoint as a plain Llama (LlamaForCausalLM; swift-plt saves it '
                  'so), or set config.patch_size = 1.')


class PLTLlamaForCausalLM(LlamaForCausalLM):

    @property
    def patch_size(self) -> int:
        return patch_size_of(self.config)

    def forward(self,
                input_ids: Optional[torch.LongTensor] = None,
                attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.LongTensor] = None,
                past_key_values=None,
                inputs_embeds: Optional[torch.FloatTensor] = None,
                labels: Optional[torch.LongTensor] = None,
                use_cache: Optional[bool] = None,
                **kwargs):
        # No `logits_to_keep` parameter (it still reaches Llama's forward through **kwargs at K=1): ms-swift's HF
        # trainer turns on `use_logits_to_keep`, which trims the labels token by token, when the signature has it.
        k = self.patch_size
        if k == 1:
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                   past_key_values=past_key_values, inputs_embeds=inputs_embeds, labels=labels,
                                   use_cache=use_cache, **kwargs)
        if past_key_values is not None or use_cache:
            raise NotImplementedError(GENERATE_ERROR.format(k=k))
        if inputs_embeds is None:
            inputs_embeds = self.model.embed_tokens(input_ids)
        B, S, _ = inputs_embeds.shape
        if position_ids is None:
            position_ids = torch.arange(S, device=inputs_embeds.device).expand(B, S)
        check_patch_aligned(position_ids, k)  # S % K == 0 and no patch straddles two documents
        if attention_mask is not None:
            attention_mask = patch_padding_mask(attention_mask, k)
        num_items_in_batch = kwargs.pop('num_items_in_batch', None)
        outputs = self.model(
            inputs_embeds=pool_patches(inputs_embeds.transpose(0, 1), k).transpose(0, 1),  # [B, P, H]
            attention_mask=attention_mask,
            position_ids=patch_position_ids(position_ids, k),
            use_cache=False,
            **kwargs)
        logits = self.lm_head(outputs.last_hidden_state)  # [B, P, V]: patch p predicts the tokens of patch p+1
        loss = None
        if labels is not None:
            labels = mask_first_patch(labels, position_ids, k)
            total = plt_token_losses(logits.transpose(0, 1), labels, k).sum()
            count = num_items_in_batch if num_items_in_batch is not None else (labels != IGNORE_INDEX).sum()
            loss = total / count
        return CausalLMOutputWithPast(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions)

    def generate(self, *args, **kwargs):
        if self.patch_size > 1:
            raise NotImplementedError(GENERATE_ERROR.format(k=self.patch_size))
        return super().generate(*args, **kwargs)

    def save_pretrained(self, save_directory, *args, is_main_process: bool = True, **kwargs):
        """Save as a plain Llama (architectures ``LlamaForCausalLM``, no ``patch_size`` in config.json): K is a
        training setting, so the checkpoint loads anywhere as a token-level Llama."""
        config = self.config
        k = config.__dict__.pop('patch_size', None)
        try:
            super().save_pretrained(save_directory, *args, is_main_process=is_main_process, **kwargs)
            config.architectures = [LlamaForCausalLM.__name__]  # upstream wrote type(self).__name__
            if is_main_process:
                config.save_pretrained(save_directory)
        finally:
            if k is not None:
                config.patch_size = k
