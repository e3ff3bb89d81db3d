"""Registration of ``llama3_2_plt`` and the critic types (``llama3_2_critic``, ``qwen3_critic``, ...) with ms-swift
(HF side) and mcore-bridge (Megatron side), and of ``<mcore type>_plt`` (``gpt_plt``, ``qwen3_next_plt``, ...), the
mcore-bridge model types the families train through at K > 1. Idempotent. The plugin registers them when it activates
(``register_hf``: ms-swift's model registry imported; ``register_megatron``: ms-swift's Megatron arguments
imported), so no ``--custom_register_path`` is needed; ``custom_model/llama.py`` (``register_all``) re-registers them
harmlessly."""
from swift_plt import PLT_MODEL_TYPE


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


def plt_gpt_model_meta():
    """mcore-bridge's meta of ``gpt_plt``: its `gpt` meta (bridge, loader) with ``PLTGPTModel`` and ``PLTModelConfig``;
    no HF model type maps to it, so only ``--patch_size K > 1`` selects it (swift_plt.plugin.arguments)."""
    from swift_plt.families import MCORE_GPT_TYPE
    return plt_model_meta(MCORE_GPT_TYPE)


def plt_model_meta(mcore_type: str):
    """mcore-bridge's meta of ``<mcore_type>_plt`` (``gpt_plt``, ``qwen3_next_plt``, ``qwen3_5_plt``, an own type's
    such as ``olmoe_plt``): the upstream meta (bridge, vision tower, loader) with PLT's model classes and
    ``PLTModelConfig``; no HF model type maps to it, so only ``--patch_size K > 1`` selects it
    (swift_plt.plugin.arguments)."""
    from mcore_bridge.model.register import ModelMeta, get_model_meta, register_model

    from swift_plt import families
    from swift_plt.models.megatron_gpt import PLTModelConfig, plt_loader
    plt_type = families.plt_mcore_type(mcore_type)
    meta = get_model_meta(plt_type)
    if meta is None:
        upstream = get_model_meta(mcore_type)
        families.check_mcore_family_types(mcore_type, upstream.model_types)
        meta = ModelMeta(plt_type, [], bridge_cls=upstream.bridge_cls, visual_cls=upstream.visual_cls,
                         loader=plt_loader(mcore_type, upstream), config_cls=PLTModelConfig)
        register_model(meta)
    return meta


def register_critic_swift() -> None:
    """HF side of every critic model type (swift_plt.critic.families): the family's transformers
    ``*ForTokenClassification(num_labels=1)``, from a critic dir or a causal LM dir (``swift export``, HF loading)."""
    from swift.model import ModelGroup, ModelMeta, register_model

    from swift_plt.critic.families import CRITIC_FAMILIES, CRITIC_REQUIRES
    from swift_plt.critic.hf import CriticHFLoader
    from swift_plt.critic.keys import token_classification_class

    for model_type, family in CRITIC_FAMILIES.items():
        try:
            architectures = [token_classification_class(family.hf_model_type).__name__]
        except ValueError:  # not in this transformers: the loader refuses such checkpoints with the reason
            architectures = []
        register_model(
            ModelMeta(
                model_type,
                [ModelGroup([])],  # pass --model <local causal-LM or critic dir of the family> --model_type <critic>
                loader=CriticHFLoader,
                template=family.template,
                model_arch=family.model_arch,
                architectures=architectures,
                mcore_model_type=model_type,
                requires=list(CRITIC_REQUIRES),
            ),
            exist_ok=True)


def register_critic_mcore() -> bool:
    """Megatron side of every critic model type (config, GPTModel, loader, bridge); False without mcore-bridge."""
    try:
        from mcore_bridge.model.register import register_model
    except ImportError:
        return False
    from swift_plt.critic.families import CRITIC_FAMILIES
    from swift_plt.critic.model import critic_model_meta
    for model_type, family in CRITIC_FAMILIES.items():
        # over the family's own mcore-bridge loader and bridge (`gpt`, or a hybrid's); refuses if upstream moved
        register_model(critic_model_meta(model_type, family.mcore_type), exist_ok=True)
    return True


def plugin_model_types() -> tuple:
    """Every model type registered here with ms-swift: ``llama3_2_plt`` and the critic types."""
    from swift_plt.critic.families import CRITIC_FAMILIES
    return (PLT_MODEL_TYPE, *CRITIC_FAMILIES)


def register_hf() -> None:
    """ms-swift side of ``plugin_model_types()`` (cheap: no mcore-bridge import)."""
    register_swift()
    register_critic_swift()


def register_megatron() -> bool:
    """mcore-bridge side of ``plugin_model_types()``; False without mcore-bridge."""
    return register_mcore() and register_critic_mcore()


def register_all() -> None:
    register_hf()
    register_megatron()
