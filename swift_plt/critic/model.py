"""The Megatron side of the critics (``llama3_2_critic``, ``qwen3_critic``, ...: swift_plt.critic.families): config,
GPTModel, loader and bridge for mcore-bridge, the same for every family: ``critic_model_meta`` puts the critic's
classes over the family's own mcore-bridge meta (``gpt``: ``CriticModelLoader`` / ``CriticBridge``; the hybrid
``qwen3_next`` and the multimodal ``qwen3_5``: ``CriticLoaderMixin`` / ``CriticBridgeMixin`` over their
``Qwen3NextLoader`` and bridge, the vision tower kept, the head on the language model: ``CriticMultimodalGPTModel``),
and refuses to build where upstream's loader or bridge is not the one verified (``upstream_refusal``).

Design: the critic reuses mcore-bridge's own sequence-classification path instead of a hand-written head.
``CriticModelConfig`` pins ``task_type='seq_cls'``, ``num_labels=1`` and untied embeddings, so mcore-bridge's
GPTModel builds, on every post_process chunk (the last pipeline stage, each VPP chunk with ``post_process``),
``output_layer = OutputLayerLinear(H, 1, bias=False, parallel_mode='duplicated')`` instead of the vocab-parallel LM
head, and its forward returns that layer's per-token output ``[B, S, 1]`` (``labels`` are ignored for seq_cls: no
LM loss). What this buys, all upstream code:
  * TP: the head is replicated ('duplicated' TELinear: no TP split, initialised from the data-parallel RNG, so it
    is the same on every TP rank); without sequence parallel every TP rank sees every token and the gradients are
    equal; with sequence parallel the TELinear marks its weight ``sequence_parallel`` and megatron's
    finalize_model_grads all-reduces it over TP; the values are gathered over the sequence after the head
    (``gather_from_sequence_parallel_region``; gathering before or after a per-token linear map is the same);
  * PP: only post_process stages have ``output_layer``; the others return hidden states;
  * checkpoints: ``output_layer.weight`` is in the mcore distributed checkpoint (replicated tensor), and mcore-bridge
    maps it to/from the HF key ``score.weight`` for seq_cls (HF ``<Family>ForTokenClassification``).
The module keeps upstream's name ``output_layer`` (``CriticGPTModel.value_head`` is an alias), so all of the above
and ms-swift's export apply unchanged. What this module adds on top:
  * the head is zero-initialised at construction (see ``init_value_head``) and, when a checkpoint has no head,
    set explicitly with a loud warning: mcore-bridge skips ``score.weight`` silently when it is absent, which would
    leave whatever the constructor produced (``torch.empty`` memory under ms-swift's default
    ``--perform_initialization false``);
  * ``CriticBridge.load_weights`` checks every key and shape of the HF dir before loading (swift_plt.critic.keys):
    a causal LM (its ``lm_head.weight`` is expected and dropped) or an existing critic (its head is loaded), nothing
    else; a ``score.bias`` only if it is exactly zero (the head has no bias to put it in);
  * ``CriticBridge._set_weight`` copies the ``[1, H]`` head as is: mcore-bridge 1.6.5 treats ``output_layer.weight``
    as a vocabulary matrix and pads its rows to a multiple of TP (``[1, H]`` -> ``[2, H]`` at TP=2, which then no
    longer fits the replicated ``[1, H]`` parameter);
  * the exported HF config is the family's ``*ForTokenClassification`` with ``num_labels=1``,
    ``tie_word_embeddings=False`` and, on transformers 5.x, ``token_classification_bias=False`` (plain transformers
    builds ``score`` without bias and loads it exactly); on 4.57.x, whose head always has a bias, ``CriticBridge``
    adds a zero ``score.bias`` [1] to the export (``token_classification_bias=True``), so that transformers loads it
    with no missing key.

Head initialisation (no head in the checkpoint): zeros. Every value is 0 at step 0 (no random offset the critic has
to unlearn, a neutral baseline for the first advantages), the head's gradient sum_t (dL/dv_t) h_t is non-zero so it
trains from the first step (the trunk receives gradient from the second step on), and zeros are identical on every
TP/PP/DP layout and seed, so runs on different layouts start from the same critic.

Context parallel: the model runs as any GPTModel under CP (each CP rank outputs the values of its slice of the
sequence); training (``megatron sft``, swift_plt.critic.trainer) shifts the targets to value positions before the CP
split, so each value/target pair is local to a rank. The ``MegatronCritic`` engine gathers each micro-batch's values
over the CP ranks before the shift (see swift_plt.critic.engine).

Not supported (refused in ``CriticModelConfig`` with a message): MTP, a checkpoint of another family than the critic
model type's (``families.family_refusal``), patch-level training (``--patch_size`` > 1 is refused for critics by
swift_plt.plugin.arguments).
"""
from dataclasses import dataclass

import torch
from mcore_bridge.bridge import GPTBridge
from mcore_bridge.config import ModelConfig
from mcore_bridge.model import GPTModel, MultimodalGPTModel
from mcore_bridge.model.register import ModelLoader
from mcore_bridge.utils import get_logger, unwrap_model

from swift_plt.compat.transformers import critic_head_has_bias
from swift_plt.critic import CRITIC_MODEL_TYPE
from swift_plt.critic.families import CRITIC_FAMILIES, family_refusal
from swift_plt.critic.keys import (HEAD_BIAS_KEY, HEAD_KEY, check_critic_keys, check_head_bias, critic_hf_config,
                                   read_head_bias, read_safetensors_shapes)

logger = get_logger()

HEAD_INIT = 'zeros'


def values(output: torch.Tensor) -> torch.Tensor:
    """Per-token critic output ``[B, S, 1]`` -> values of the first S-1 positions ``[B, S-1]``."""
    return output[:, :-1].squeeze(-1)


@dataclass
class CriticModelConfig(ModelConfig):

    def __post_init__(self):
        unsupported = {
            'mtp_num_layers (no multi-token prediction for a critic)': bool(self.mtp_num_layers),
            f'task_type={self.task_type} (the critic is seq_cls with num_labels=1)':
            self.task_type not in ('causal_lm', 'seq_cls'),
            f'num_labels={self.num_labels} (a critic has one value per token)': self.num_labels not in (None, 1),
        }
        bad = [k for k, v in unsupported.items() if v]
        name = critic_name(self)
        if bad:
            raise ValueError(f'{name} does not support: {"; ".join(bad)}.')
        if self.hf_config is not None and name in CRITIC_FAMILIES:
            refusal = family_refusal(name, getattr(self.hf_config, 'model_type', None))
            if refusal:
                raise ValueError(refusal)
        self.task_type = 'seq_cls'
        self.num_labels = 1
        self.untie_embeddings_and_output_weights = True
        if self.hf_config is not None:
            self.hf_config = critic_hf_config(self.hf_config)
        super().__post_init__()


def critic_name(config) -> str:
    """The critic model type a config was built for (mcore-bridge's ``mcore_model_type``)."""
    return getattr(config, 'mcore_model_type', None) or CRITIC_MODEL_TYPE


def init_value_head(weight: torch.Tensor) -> None:
    """The documented scheme for a head the checkpoint does not have (module docstring): zeros."""
    with torch.no_grad():
        weight.zero_()


class CriticGPTModel(GPTModel):
    """mcore-bridge GPTModel whose post_process ``output_layer`` is the ``[1, H]`` value head (see module doc)."""
    config: CriticModelConfig

    is_critic = True

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        # True while loading a causal-LM mcore checkpoint (swift_plt/plugin/patches/swift_megatron_utils_megatron_lm_utils.py): the
        # head is then left out of the sharded state dict and initialised instead.
        self.checkpoint_without_head = False
        if self.post_process:
            assert tuple(self.output_layer.weight.shape) == (1, config.hidden_size), self.output_layer.weight.shape
            init_value_head(self.output_layer.weight)

    def sharded_state_dict(self, prefix='', sharded_offsets=(), metadata=None):
        sharded = super().sharded_state_dict(prefix, sharded_offsets, metadata)
        key = f'{prefix}output_layer.weight'
        if key in sharded:
            if self.checkpoint_without_head:
                del sharded[key]
            else:
                # megatron's LanguageModule allows a shape mismatch here (vocabulary padding of an LM head); for the
                # [1, H] head a mismatch means a wrong checkpoint (e.g. an LM head [V, H]): let dist-checkpointing
                # refuse it instead of loading part of it.
                sharded[key].allow_shape_mismatch = False
        return sharded

    @property
    def value_head(self):
        """The ``Linear(hidden, 1, bias=False)`` value head (post_process stages only, else None)."""
        return self.output_layer if self.post_process else None


class CriticMultimodalGPTModel(MultimodalGPTModel):
    """A multimodal family's critic (Qwen3.5): the wrapper (vision tower, token embeddings) as upstream, its language
    model a ``CriticGPTModel`` (``language_model.output_layer`` is the head)."""
    language_model_cls = CriticGPTModel

    is_critic = True

    @property
    def value_head(self):
        return self.language_model.value_head

    @property
    def checkpoint_without_head(self):
        return self.language_model.checkpoint_without_head

    @checkpoint_without_head.setter
    def checkpoint_without_head(self, value):
        self.language_model.checkpoint_without_head = value


class CriticLoaderMixin:
    """Over an mcore-bridge loader (the `gpt` one or a hybrid family's): build the critic's model classes."""

    def __init__(self, config):
        super().__init__(config)
        self.model_cls = CriticMultimodalGPTModel if config.is_multimodal else CriticGPTModel


class CriticModelLoader(CriticLoaderMixin, ModelLoader):
    model_cls = CriticGPTModel


class CriticBridgeMixin:
    """Over an mcore-bridge bridge (GPTBridge or a hybrid family's): the critic's key checks, the ``[1, H]`` head
    copied as is, and the zero ``score.bias`` of the HF format on transformers 4.57.x."""

    def load_weights(self, mg_models, hf_model_dir: str, peft_format: bool = False, *args, **kwargs):
        head = None
        if not peft_format:
            source = f'HF checkpoint {hf_model_dir}'
            shapes = read_safetensors_shapes(hf_model_dir)
            head = check_critic_keys(shapes, self.config.hf_config, source=source)
            if HEAD_BIAS_KEY in shapes:
                check_head_bias(read_head_bias(hf_model_dir), source)
        result = super().load_weights(mg_models, hf_model_dir, peft_format, *args, **kwargs)
        if head == 'missing':
            models = unwrap_model(mg_models)
            for model in models if isinstance(models, list) else [models]:
                if model.value_head is not None:
                    init_value_head(model.value_head.weight)
            logger.warning(f'[swift-plt] {critic_name(self.config)}: {hf_model_dir} has no value head ({HEAD_KEY}): '
                           f'initialised the value head with {HEAD_INIT} (a causal LM: its lm_head is dropped).')
        return result

    def _convert_post_process(self, mg_model, hf_state_dict, hf_prefix: str, to_mcore):
        """Export on transformers 4.57.x: a zero ``score.bias`` [1] beside ``score.weight`` (its head always has a
        bias; the Megatron head has none), wherever mcore-bridge yields the head."""
        result = super()._convert_post_process(mg_model, hf_state_dict, hf_prefix, to_mcore)
        key = f'{hf_prefix}{HEAD_KEY}'
        if not to_mcore and not self._peft_format and result.get(key) is not None and critic_head_has_bias():
            weight = result[key]
            result[f'{hf_prefix}{HEAD_BIAS_KEY}'] = torch.zeros(1, dtype=weight.dtype, device=weight.device)
        return result

    def _set_weight(self, mg_param, hf_weight, mg_key, offset=0, is_expert=False, **kwargs):
        if mg_key == 'output_layer.weight':
            params = mg_param if isinstance(mg_param, (list, tuple)) else [mg_param]
            for param in params:
                if tuple(hf_weight.shape) != tuple(param.shape):
                    raise ValueError(f'{critic_name(self.config)}: value head {HEAD_KEY} has shape '
                                     f'{list(hf_weight.shape)}, the model needs {list(param.shape)}.')
                param.data.copy_(hf_weight)
            return
        return super()._set_weight(mg_param, hf_weight, mg_key, offset, is_expert, **kwargs)


class CriticBridge(CriticBridgeMixin, GPTBridge):
    """The critic's bridge for the `gpt` families (mcore-bridge's GPTBridge)."""


def upstream_refusal(critic_type: str, mcore_type: str, upstream) -> str:
    """None where mcore-bridge's meta ``upstream`` of ``mcore_type`` builds the family with the loader and bridge
    its record names, else what differs and what to do."""
    from swift_plt.families.mcore_bridge import upstream_problem
    problem = upstream_problem(mcore_type, upstream)
    return f'{critic_type}: {problem}' if problem else None


def critic_loader(upstream_loader):
    """The critic loader over a family's mcore-bridge loader (``CriticModelLoader`` over the default one)."""
    from swift_plt.families.mcore_bridge import over
    return over('Critic', CriticLoaderMixin, upstream_loader, CriticModelLoader)


def critic_bridge(upstream_bridge):
    """The critic bridge over a family's mcore-bridge bridge (``CriticBridge`` over GPTBridge)."""
    from swift_plt.families.mcore_bridge import over
    return over('Critic', CriticBridgeMixin, upstream_bridge, CriticBridge)


def refusing_loader(refusal: str):
    """A loader that refuses to build (the family's upstream moved: ``upstream_refusal``)."""

    def __init__(self, config):
        raise RuntimeError(refusal)

    return type('RefusedCriticLoader', (ModelLoader, ), {'__init__': __init__})


def critic_model_meta(critic_type: str, mcore_type: str = 'gpt'):
    """mcore-bridge's meta of ``critic_type`` over the family's mcore-bridge meta ``mcore_type`` (its bridge, vision
    tower and loader, with the critic's classes and ``CriticModelConfig``); where upstream no longer builds the
    family as verified, a meta whose loader refuses with the reason (the plugin still activates)."""
    from mcore_bridge.model.register import ModelMeta, get_model_meta
    upstream = get_model_meta(mcore_type)
    refusal = upstream_refusal(critic_type, mcore_type, upstream)
    if refusal:
        return ModelMeta(critic_type, [critic_type], loader=refusing_loader(refusal), config_cls=CriticModelConfig,
                         bridge_cls=CriticBridge)
    return ModelMeta(critic_type, [critic_type], bridge_cls=critic_bridge(upstream.bridge_cls),
                     visual_cls=upstream.visual_cls, loader=critic_loader(upstream.loader),
                     config_cls=CriticModelConfig)
