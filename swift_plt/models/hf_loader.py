"""ms-swift (HF backend) model loader of ``llama3_2_plt``: ``PLTLlamaForCausalLM`` at patch size K > 1, else
transformers' own ``LlamaForCausalLM`` (K=1 loads exactly what model type ``llama`` loads)."""
from swift.model.register import ModelLoader

from swift_plt.compat.transformers import hf_rope_guard
from swift_plt.patch_level.patch_size import resolve_patch_size


class PLTLlamaLoader(ModelLoader):

    def __init__(self, *args, patch_size=None, **kwargs):
        # patch_size: from the HF-side arguments (plugin/patches/swift_arguments_base_args.py); None (direct API
        # use): `patch_size` of the config.json, else 1
        super().__init__(*args, **kwargs)
        self.patch_size = patch_size

    def get_model(self, model_dir, config, processor, model_kwargs):
        k = resolve_patch_size(self.patch_size, config)
        if k > 1 and self.auto_model_cls is None:
            from swift_plt.models.hf_llama import PLTLlamaForCausalLM
            config.patch_size = k
            self.auto_model_cls = PLTLlamaForCausalLM
        # safe after mcore-bridge ran in this process (e.g. `swift export --to_hf --test_convert_precision`)
        with hf_rope_guard():
            return super().get_model(model_dir, config, processor, model_kwargs)
