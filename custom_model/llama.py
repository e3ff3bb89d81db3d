"""Pass this file to ms-swift: `--custom_register_path custom_model/llama.py` (or `--external_plugins`).

Registers the model type `llama3_2_plt` (patch-level training for Llama checkpoints, `--patch_size K`) with
ms-swift (HF backend: `PLTLlamaForCausalLM`, see custom_model/modeling_llama.py) and, where mcore-bridge is
importable, with mcore-bridge (Megatron backend: `PLTGPTModel`). Importing it again (every rank, every dataloader
worker) is harmless. Needs the swift-plt package installed (`pip install .` at the repo root).
"""
from swift_plt.plugin.register import register_all

register_all()
