"""transformers compatibility in one place (the supported range: swift_plt/compat/supported.py): its version,
``hf_rope_guard`` against mcore-bridge's RoPE-table hazard (docs/hf-backend.md#transformers-versions), and the
critic's HF head: bias-free on 5.x, a zero ``score.bias`` on 4.57.x (``critic_head_has_bias``); the Megatron head is
bias-free on both, so a non-zero ``score.bias`` is refused (``swift_plt.critic.keys``).
"""
import contextlib
import functools
from importlib import metadata


def parse_version(text: str) -> tuple:
    """``'5.19.0'`` -> ``(5, 19, 0)``, ``'4.57.6.dev0'`` -> ``(4, 57, 6)`` (the release components)."""
    from packaging.version import Version  # a dependency of transformers
    return Version(text).release


def transformers_version() -> tuple:
    """The installed transformers version as a tuple (from the distribution metadata: no transformers import)."""
    return parse_version(metadata.version('transformers'))


def is_transformers_5(version: tuple = None) -> bool:
    return (version or transformers_version())[0] >= 5


def own_default_rope_fn():
    """transformers' own ``ROPE_INIT_FUNCTIONS['default']``: ``None`` on 5.x (there is none),
    ``modeling_rope_utils._compute_default_rope_parameters`` on 4.x."""
    from swift_plt.compat.transformers_rope import own_default_rope_fn as own
    return own(is_transformers_5())


@contextlib.contextmanager
def hf_rope_guard():
    """Build/load HF models inside this block: ``ROPE_INIT_FUNCTIONS['default']`` is transformers' own (none on 5.x)
    for its duration and restored afterwards; the guarded touch is ``swift_plt.compat.transformers_rope``."""
    from swift_plt.compat.transformers_rope import own_default_rope
    with own_default_rope(is_transformers_5()):
        yield


@functools.lru_cache(maxsize=None)
def has_bias_free_token_classification() -> bool:
    """Whether transformers' ``LlamaForTokenClassification`` honours ``token_classification_bias=False``: 5.17 / 5.19
    yes; 4.57.x no (its ``score`` always has a bias). Probed on a 1-layer, 8-wide model (milliseconds)."""
    from transformers import LlamaConfig, LlamaForTokenClassification
    config = LlamaConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=1,
                         num_key_value_heads=1, num_labels=1, token_classification_bias=False)
    with hf_rope_guard():
        return LlamaForTokenClassification(config).score.bias is None


def critic_head_has_bias() -> bool:
    """Whether the critic's HF format on this transformers has a zero ``score.bias`` [1] (4.57.x, whose head always
    has one) or none (5.x, ``token_classification_bias=False``); the Megatron head is bias-free."""
    return not has_bias_free_token_classification()
