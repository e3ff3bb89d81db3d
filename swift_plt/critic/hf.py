"""HF side of the critics (ms-swift's HF model loading, e.g. ``swift export``): the family's transformers
``*ForTokenClassification(num_labels=1)`` from a critic dir or a causal-LM dir (on transformers 4.57.x its head
has a ``score.bias``, which is zero, as on the bias-free Megatron side)."""
import functools

import torch
from swift.model.register import ModelLoader
from transformers import AutoModelForTokenClassification

from swift_plt.compat.transformers import hf_rope_guard
from swift_plt.critic.families import family_refusal
from swift_plt.critic.keys import (HEAD_BIAS_KEY, HEAD_KEY, check_head_bias, critic_hf_config, read_head_bias,
                                   read_safetensors_shapes)


def ignore_token_labels(model) -> None:
    """ms-swift hands the HF model ``labels`` = token ids (e.g. ``swift export --test_convert_precision``);
    transformers' token-classification loss would treat them as class indices of the one-label head (IndexError).
    Token ids are no value targets: the HF critic drops ``labels`` (the value loss lives in swift_plt.critic)."""
    forward = model.forward

    @functools.wraps(forward)
    def forward_without_labels(*args, **kwargs):
        kwargs.pop('labels', None)
        return forward(*args, **kwargs)

    model.forward = forward_without_labels


def check_hf_head_bias(model_dir: str, critic_type: str) -> None:
    """Refuse a dir whose ``score.bias`` is non-zero before loading it (the Megatron head has no bias; transformers
    5.x would drop it silently, 4.57.x would load it): the same rule as the Megatron side."""
    try:
        has_bias = HEAD_BIAS_KEY in read_safetensors_shapes(model_dir)
    except FileNotFoundError:
        return
    if has_bias:
        check_head_bias(read_head_bias(model_dir), f'{critic_type} (HF side): {model_dir}')


def init_missing_hf_head(model, model_dir: str, critic_type: str) -> None:
    """Set what transformers initialised randomly as the Megatron side does, so both sides of ``swift export`` agree:
    a head the dir lacks to zeros (with the warning), a ``score.bias`` it lacks (4.57.x) to zero (bias-free head)."""
    try:
        shapes = read_safetensors_shapes(model_dir)
    except FileNotFoundError:
        return
    bias = getattr(model.score, 'bias', None)
    if bias is not None and HEAD_BIAS_KEY not in shapes:
        with torch.no_grad():
            bias.zero_()
    if HEAD_KEY not in shapes:
        from swift.utils import get_logger
        with torch.no_grad():
            model.score.weight.zero_()
        get_logger().warning(f'[swift-plt] {critic_type} (HF side): {model_dir} has no value head '
                             f'({HEAD_KEY}): initialised the value head with zeros.')


class CriticHFLoader(ModelLoader):

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.auto_model_cls = self.auto_model_cls or AutoModelForTokenClassification

    def get_config(self, model_dir):
        config = super().get_config(model_dir)
        refusal = family_refusal(self.model_meta.model_type, getattr(config, 'model_type', None))
        if refusal:
            raise ValueError(refusal)
        return critic_hf_config(config)

    def get_model(self, model_dir, config, processor, model_kwargs):
        check_hf_head_bias(model_dir, self.model_meta.model_type)
        with hf_rope_guard():  # safe after mcore-bridge ran in this process (swift_plt/compat/transformers.py)
            model = super().get_model(model_dir, config, processor, model_kwargs)
        ignore_token_labels(model)
        if not self.return_dummy_model:
            init_missing_hf_head(model, model_dir, self.model_meta.model_type)
        return model
