"""The HF-side PLT Llama, ``PLTLlamaForCausalLM`` (config.patch_size K), re-exported from the installed package.

The implementation lives in ``swift_plt/models/hf_llama.py`` so that every process (torchrun ranks, dataloader
workers) imports the same class without this folder on sys.path; ``custom_model/llama.py`` registers it with ms-swift
as the HF-side model of ``llama3_2_plt``.
"""
from swift_plt.models.hf_llama import GENERATE_ERROR, PLTLlamaForCausalLM  # noqa: F401
