"""Imported once by the forkserver that ``spawn`` forks ranks from: ``install()``, then what every rank imports."""
from .patches import install

install()
import megatron.core.parallel_state  # noqa: E402,F401
import mcore_bridge  # noqa: E402,F401
import swift.megatron  # noqa: E402,F401
import transformers  # noqa: E402,F401

from . import model  # noqa: E402,F401
