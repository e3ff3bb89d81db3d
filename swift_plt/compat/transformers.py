"""transformers compatibility, in one place: the supported range and the RoPE work-around.

Supported: transformers 4.57.x and 5.x below ms-swift 4.6's cap (``transformers<5.20.0`` in its requirements), i.e.
``>=4.57,<5.20``; verified on 4.57.6 (CPU suite) and 5.17 (GPU) / 5.19 (CPU suite). setup.py declares the same
range, and ``swift_plt.compat.versions.check_versions`` refuses anything else at activation.

The RoPE hazard. mcore-bridge 1.6.5 (``mcore_bridge/model/rope.py:get_rope_inv_freq``) copies its own table into
transformers' process-global ``ROPE_INIT_FUNCTIONS`` every time it computes RoPE frequencies (any mcore model build):

* transformers 5.x has no ``'default'`` entry (each model computes its default RoPE itself), and mcore-bridge adds
  one (its ``_compute_default_rope_parameters``, which reads ``config.rope_theta``). ``PreTrainedModel.
  _init_weights`` of 5.19 prefers that table entry over the model's ``compute_default_rope_parameters``, so every
  Llama built or loaded afterwards in the process fails: ``'LlamaConfig' object has no attribute 'rope_theta'``.
* transformers 4.57.x has its own ``'default'`` entry, which the Llama rotary embedding needs; mcore-bridge does not
  touch it on 4.x (it adds ``'default'`` only when transformers >= 5).

``hf_rope_guard()`` gives every HF model built inside it transformers' own ``'default'``: none on 5.x (the entry is
lifted), transformers' ``_compute_default_rope_parameters`` on 4.x; the previous entry is put back afterwards (so
mcore-bridge's own computations are unaffected; it re-adds its entry on every call anyway). Product code that may
build an HF model in a process where mcore-bridge ran uses it: the HF-side loaders of ``llama3_2_plt`` /
``llama3_2_critic`` (``swift export --to_hf --test_convert_precision`` loads the HF model after the mcore one) and
``swift_plt.recipe.export.check_vanilla``; so do the tiny-model generator (``swift_plt.tools.tiny``) and the test harness.

The value-head critic (``llama3_2_critic``) runs on both majors. Its HF format is ``LlamaForTokenClassification
(num_labels=1)`` as the installed transformers builds it: bias-free on 5.x (``token_classification_bias=False``), with
a zero ``score.bias`` [1] on 4.57.x, whose head always has a bias (``critic_head_has_bias``); the Megatron head is
bias-free on both, so a checkpoint with a non-zero ``score.bias`` is refused (``swift_plt.critic.keys``).
"""
import contextlib
import functools
from importlib import metadata

MIN_VERSION = (4, 57)  # ms-swift 4.6 recommends 4.57.6 (or 5.12.1); older 4.x is not supported by swift-plt
CAP_VERSION = (5, 20)  # exclusive; ms-swift 4.6.0 requires transformers<5.20.0
SUPPORTED = '>=4.57,<5.20'  # as in setup.py
SHOWN = '4.57.x or 5.x below 5.20'


def parse_version(text: str) -> tuple:
    """``'5.19.0'`` -> ``(5, 19, 0)``, ``'4.57.6.dev0'`` -> ``(4, 57, 6)`` (the release components)."""
    from packaging.version import Version  # a dependency of transformers
    return Version(text).release


def transformers_version() -> tuple:
    """The installed transformers version as a tuple (from the distribution metadata: no transformers import)."""
    return parse_version(metadata.version('transformers'))


def is_supported(version: tuple) -> bool:
    return MIN_VERSION <= tuple(version[:2]) < CAP_VERSION


def is_transformers_5(version: tuple = None) -> bool:
    return (version or transformers_version())[0] >= 5


def own_default_rope_fn():
    """transformers' own ``ROPE_INIT_FUNCTIONS['default']``: ``None`` on 5.x (there is none),
    ``modeling_rope_utils._compute_default_rope_parameters`` on 4.x."""
    from swift_plt.compat.transformers_rope import own_default_rope_fn as own
    return own(is_transformers_5())


@contextlib.contextmanager
def hf_rope_guard():
    """Build/load HF models inside this block: ``ROPE_INIT_FUNCTIONS['default']`` is transformers' own for its
    duration (lifted on 5.x, transformers' function on 4.x) and restored afterwards. See the module docstring. The
    touch itself, with the guard that fails loudly if transformers moved it, is
    ``swift_plt/compat/transformers_rope.py`` (``swift_plt.plugin.patches``: every upstream touch point)."""
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
