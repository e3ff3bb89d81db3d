"""Sliding-window attention at patch level, for both backends: a window of W tokens becomes ceil(W / K) patches, the
same span of text rounded up to whole patches. Attention sinks (GPT-OSS's learned per-head logits) do not count
positions and stay as they are. K=1: the window as it is. Imports no torch."""
from typing import Optional, Tuple


def patch_window(window: Optional[int], patch_size: int) -> Optional[int]:
    """HF ``sliding_window`` W (a query sees itself and the W - 1 positions before it; None or 0: no window, as is) at
    patch size K: ceil(W / K) patches."""
    if not window:
        return window
    if window < 1 or patch_size < 1:
        raise ValueError(f'sliding window {window} / patch size {patch_size}: both must be >= 1.')
    return -(-window // patch_size)


def patch_window_size(window_size: Optional[Tuple[int, int]], patch_size: int) -> Optional[Tuple[int, int]]:
    """megatron / Transformer Engine ``window_size`` (left, right) at patch size K. mcore-bridge converts HF's W to
    (W - 1, 0) (the query plus W - 1 keys to its left); at patch level that is (ceil(W / K) - 1, 0). A left size of
    -1 (no window) stays; a window that looks right (right != 0) is refused: PLT's models are causal."""
    if window_size is None:
        return None
    left, right = window_size
    if right != 0:
        raise ValueError(f'window_size={tuple(window_size)}: PLT supports causal sliding windows (right size 0) only.')
    if left < 0:
        return tuple(window_size)
    return patch_window(left + 1, patch_size) - 1, 0
