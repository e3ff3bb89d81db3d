"""``PLTLlamaForCausalLM``: the HF model of ``llama3_2_plt`` (the PLT class over transformers' Llama)."""
from transformers import LlamaForCausalLM

from swift_plt.models.hf_causal_lm import GENERATE_ERROR, plt_causal_lm_class

PLTLlamaForCausalLM = plt_causal_lm_class(LlamaForCausalLM)

__all__ = ['GENERATE_ERROR', 'PLTLlamaForCausalLM']
