"""Registration of ``llama3_2_plt`` and ``llama3_2_critic`` with ms-swift (HF side) and mcore-bridge (Megatron side).
Idempotent."""
from swift_plt import PLT_MODEL_TYPE
from swift_plt.critic import CRITIC_MODEL_TYPE


def register_swift() -> None:
    from swift.model import ModelGroup, ModelMeta, register_model
    from swift.model.model_arch import ModelArch
    from swift.template import TemplateType

    from swift_plt.models.hf_loader import PLTLlamaLoader
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
    from swift_plt.models.megatron_gpt import PLTModelConfig, PLTModelLoader
    register_model(
        ModelMeta(PLT_MODEL_TYPE, [PLT_MODEL_TYPE], loader=PLTModelLoader, config_cls=PLTModelConfig), exist_ok=True)
    return True


def register_critic_swift() -> None:
    """HF side of ``llama3_2_critic``: transformers' LlamaForTokenClassification(num_labels=1), from a critic dir or
    a causal LM dir (``swift export``, ms-swift's HF model loading)."""
    from swift.model import ModelGroup, ModelMeta, register_model
    from swift.model.model_arch import ModelArch
    from swift.template import TemplateType

    from swift_plt.critic.hf import CriticHFLoader
    from swift_plt.critic.keys import HF_ARCHITECTURE

    register_model(
        ModelMeta(
            CRITIC_MODEL_TYPE,
            [ModelGroup([])],  # pass --model <local Llama or critic dir> --model_type llama3_2_critic
            loader=CriticHFLoader,
            template=TemplateType.llama3_2,
            model_arch=ModelArch.llama,
            architectures=[HF_ARCHITECTURE],
            mcore_model_type=CRITIC_MODEL_TYPE,
            requires=['transformers>=4.43'],
        ),
        exist_ok=True)


def register_critic_mcore() -> bool:
    """Megatron side of ``llama3_2_critic`` (config, GPTModel, loader, bridge); False without mcore-bridge."""
    try:
        from mcore_bridge.model.register import ModelMeta, register_model
    except ImportError:
        return False
    from swift_plt.critic.model import CriticBridge, CriticModelConfig, CriticModelLoader
    register_model(
        ModelMeta(CRITIC_MODEL_TYPE, [CRITIC_MODEL_TYPE], loader=CriticModelLoader, config_cls=CriticModelConfig,
                  bridge_cls=CriticBridge),
        exist_ok=True)
    return True


def register_all() -> None:
    register_swift()
    register_mcore()
    register_critic_swift()
    register_critic_mcore()
