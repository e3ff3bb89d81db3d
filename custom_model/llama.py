"""Optional: the plugin registers its model types when it activates (swift_plt.plugin.register). Passing this file to
ms-swift (`--custom_register_path custom_model/llama.py` or `--external_plugins`) registers them again, harmlessly.

Registers `llama3_2_plt` (patch-level training for Llama checkpoints, `--patch_size K`; HF backend:
`PLTLlamaForCausalLM`, see custom_model/modeling_llama.py; Megatron backend: `PLTGPTModel`) and the critic types
(`llama3_2_critic`, `qwen3_critic`, ...; docs/critic.md) with ms-swift and, where mcore-bridge is importable, with
mcore-bridge. Importing it again (every rank, every dataloader worker) is harmless. Needs the swift-plt package
installed (`pip install .` at the repo root).
"""
from swift_plt.plugin.register import register_all

register_all()
