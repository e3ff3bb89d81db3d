"""ms-swift's model registry (``swift.model``): registers the plugin's model types (``llama3_2_plt``, the critics) as
soon as it is imported, so ``--model_type qwen3_critic`` needs no ``--custom_register_path``.
``model_meta._get_model_info``: an unknown model type meant as a critic fails with the list of critic types
(``swift_plt.critic.families.unknown_critic_refusal``) instead of upstream's list of every model type.
``model_meta.get_matched_model_types``: matching a checkpoint's ``architectures`` to a model type (no ``--model_type``)
stays upstream's: the plugin's types are only used when named.
"""
import functools

from swift_plt.compat.guard import guard
from swift_plt.compat.supported import VERIFIED_STACKS
from swift_plt.compat.versions import check_once

TARGET = 'swift.model'
VERIFIED = f'ms-swift 4.6.0 on {VERIFIED_STACKS}'


def apply(module):
    check_once()
    meta = guard(module, 'model_meta', None, VERIFIED)
    get_info = guard(meta, '_get_model_info', ['model_dir', 'model_type', 'quantization_config'], VERIFIED)
    match = guard(meta, 'get_matched_model_types', ['architectures'], VERIFIED)
    from swift_plt.plugin.register import plugin_model_types, register_hf
    register_hf()
    if getattr(get_info, '_swift_plt', False):
        return
    from swift_plt.critic.families import unknown_critic_refusal
    own = frozenset(plugin_model_types())

    @functools.wraps(get_info)
    def _get_model_info(model_dir, model_type, quantization_config):
        if model_type is not None and model_type not in meta.MODEL_MAPPING:
            refusal = unknown_critic_refusal(model_type)
            if refusal:
                raise ValueError(refusal)
        return get_info(model_dir, model_type, quantization_config)

    @functools.wraps(match)
    def get_matched_model_types(architectures):
        return [t for t in match(architectures) if t not in own]

    _get_model_info._swift_plt = get_matched_model_types._swift_plt = True
    meta._get_model_info = _get_model_info
    meta.get_matched_model_types = get_matched_model_types
