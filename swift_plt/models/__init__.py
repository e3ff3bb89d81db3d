"""The PLT models: the family table, ``PLTGPTModel`` (Megatron, mcore-bridge's GPTModel) and the PLT class over a
family's own ``*ForCausalLM`` (transformers)."""
