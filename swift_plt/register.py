"""Registration of ``llama3_2_plt`` and ``llama3_2_critic`` with ms-swift (HF side) and mcore-bridge (Megatron
side). Idempotent."""
from . import PLT_MODEL_TYPE
from .critic import CRITIC_MODEL_TYPE


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


def ignore_token_labels(model) -> None:
    """ms-swift hands the HF model ``labels`` = token ids (e.g. ``swift export --test_convert_precision``);
    transformers' token-classification loss would treat them as class indices of the one-label head (IndexError).
    Token ids are no value targets: the HF critic drops ``labels`` (the value loss lives in swift_plt.critic)."""
    import functools
    forward = model.forward

    @functools.wraps(forward)
    def forward_without_labels(*args, **kwargs):
        kwargs.pop('labels', None)
        return forward(*args, **kwargs)

    model.forward = forward_without_labels


def init_missing_hf_head(model, model_dir: str) -> None:
    """From a causal-LM dir transformers initialises ``score`` randomly; set it like the Megatron side does
    (swift_plt.critic.model: zeros, with the warning), so that both sides of ``swift export`` agree."""
    import torch

    from .critic.keys import HEAD_KEY, read_safetensors_shapes
    try:
        has_head = HEAD_KEY in read_safetensors_shapes(model_dir)
    except FileNotFoundError:
        return
    if not has_head:
        from swift.utils import get_logger
        with torch.no_grad():
            model.score.weight.zero_()
        get_logger().warning(f'[swift-plt] {CRITIC_MODEL_TYPE} (HF side): {model_dir} has no value head '
                             f'({HEAD_KEY}): initialised the value head with zeros.')


def register_critic_swift() -> None:
    """HF side of ``llama3_2_critic``: transformers' LlamaForTokenClassification(num_labels=1), from a critic dir or
    a causal LM dir (``swift export``, ms-swift's HF model loading)."""
    from swift.model import ModelGroup, ModelMeta, register_model
    from swift.model.model_arch import ModelArch
    from swift.model.register import ModelLoader
    from swift.template import TemplateType
    from transformers import AutoModelForTokenClassification

    from .critic.keys import HF_ARCHITECTURE, critic_hf_config

    class CriticHFLoader(ModelLoader):

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.auto_model_cls = self.auto_model_cls or AutoModelForTokenClassification

        def get_config(self, model_dir):
            return critic_hf_config(super().get_config(model_dir))

        def get_model(self, model_dir, config, processor, model_kwargs):
            model = super().get_model(model_dir, config, processor, model_kwargs)
            ignore_token_labels(model)
            if not self.return_dummy_model:
                init_missing_hf_head(model, model_dir)
            return model

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
    from .critic.model import CriticBridge, CriticModelConfig, CriticModelLoader
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
