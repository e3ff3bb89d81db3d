"""Registration of ``llama3_2_plt`` with ms-swift (HF side) and mcore-bridge (Megatron side). Idempotent."""
from . import PLT_MODEL_TYPE


def register_swift() -> None:
    from swift.model import ModelGroup, ModelMeta, register_model
    from swift.model.model_arch import ModelArch
    from swift.template import TemplateType

    from .loader import PLTLlamaLoader
    register_model(
        ModelMeta(
            PLT_MODEL_TYPE,
            [ModelGroup([])],  # no hub ids: pass --model <local Llama dir> --model_type llama3_2_plt
            loader=PLTLlamaLoader,  # PLTLlamaForCausalLM at --patch_size K > 1 (HF backend), else LlamaForCausalLM
            template=TemplateType.llama3_2,
            model_arch=ModelArch.llama,
            architectures=['LlamaForCausalLM'],
            # explicit: mcore-bridge builds its hf->mcore model-type map once, lazily
            mcore_model_type=PLT_MODEL_TYPE,
            requires=['transformers>=4.43'],
        ),
        exist_ok=True)


def register_mcore() -> bool:
    """Register the PLT GPTModel loader with mcore-bridge; False where mcore-bridge cannot be imported (e.g. no
    Transformer Engine): the HF side still works there."""
    try:
        from mcore_bridge.model.register import ModelMeta, register_model
    except ImportError:
        return False
    from .model import PLTModelConfig, PLTModelLoader
    register_model(
        ModelMeta(PLT_MODEL_TYPE, [PLT_MODEL_TYPE], loader=PLTModelLoader, config_cls=PLTModelConfig), exist_ok=True)
    return True


def register_all() -> None:
    register_swift()
    register_mcore()
