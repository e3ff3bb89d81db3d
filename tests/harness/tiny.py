"""The tiny offline fixtures live in the package (``swift_plt/tools/tiny.py``: users run them through
``swift-plt-make-tiny`` / ``examples/make_tiny_llama.py``); the RoPE guard lives in ``swift_plt/compat/transformers.py``.
Re-exported here under the harness names the tests use."""
from swift_plt.compat.transformers import hf_rope_guard
from swift_plt.tools.tiny import _fork_rng, make_jsonl, make_tiny_critic, make_tiny_llama, sentences

__all__ = ['hf_rope_guard', 'make_jsonl', 'make_tiny_critic', 'make_tiny_llama', 'sentences', '_fork_rng']
