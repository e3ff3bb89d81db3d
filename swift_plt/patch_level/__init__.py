"""The PLT method, framework-free (torch, numpy): patch layout, the PLT loss and its fused kernel, the reference."""
IGNORE_INDEX = -100  # label of a position that carries no loss (ms-swift's and transformers' convention)
