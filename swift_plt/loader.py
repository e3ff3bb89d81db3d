"""ms-swift (HF backend) model loader of ``llama3_2_plt``: ``PLTLlamaForCausalLM`` at patch size K > 1, else
transformers' own ``LlamaForCausalLM`` (K=1 loads exactly what model type ``llama`` loads)."""
from swift.model.register import ModelLoader


class PLTLlamaLoader(ModelLoader):

    def __init__(self, *args, patch_size=None, **kwargs):
        # patch_size: from the HF-side arguments (patches/swift_arguments_base_args.py); None (direct API use):
        # `patch_size` of the config.json, else 1
        super().__init__(*args, **kwargs)
        self.patch_size = patch_size

    def get_model(self, model_dir, config, processor, model_kwargs):
        k = self.patch_size or getattr(config, 'patch_size', None) or 1
        if k > 1 and self.auto_model_cls is None:
            from .modeling_llama import PLTLlamaForCausalLM
            config.patch_size = k
            self.auto_model_cls = PLTLlamaForCausalLM
        return super().get_model(model_dir, config, processor, model_kwargs)
