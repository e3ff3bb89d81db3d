"""The PLT models: ``PLTGPTModel`` (Megatron, mcore-bridge's GPTModel) and ``PLTLlamaForCausalLM`` (transformers)."""
