"""The model family of a run, from the HF config.json's ``model_type``: the ms-swift model type every step passes
(Llama: the design type ``llama3_2_plt``; other supported families their own) and the plain class the export writes."""
import json
import os
from typing import List, Optional, Sequence

from swift_plt import PLT_MODEL_TYPE
from swift_plt.families import FAMILIES, plt_refusal
from swift_plt.recipe.process import flag_value

# The file ms-swift imports for `--custom_register_path` (registers llama3_2_plt), shipped in the package.
REGISTER_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'custom_register.py')
# config.json model_type -> ms-swift model type, where they differ (``Family.swift_type``)
SWIFT_MODEL_TYPES = {t: f.ms_swift_type for t, f in FAMILIES.items() if f.ms_swift_type != t}


def read_config(model_dir: str) -> dict:
    """``model_dir``/config.json as a dict; ValueError when it is missing or not a JSON mapping."""
    path = os.path.join(model_dir, 'config.json')
    try:
        with open(path, encoding='utf-8') as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f'cannot read {path} ({e}); pass a local HF model dir.') from None
    if not isinstance(config, dict):
        raise ValueError(f'{path} is not a JSON mapping.')
    return config


def check_family(model_type: Optional[str]) -> None:
    """ValueError unless HF model type ``model_type`` trains at K > 1 (the message: why not, what is supported)."""
    refusal = plt_refusal(model_type, advice='The two-stage recipe trains stage 1 at patch size K > 1.')
    if refusal:
        raise ValueError(refusal)


def swift_model_type(hf_model_type: str) -> str:
    """The ms-swift model type the steps pass for a config.json model_type (SWIFT_MODEL_TYPES, else the same)."""
    return SWIFT_MODEL_TYPES.get(hf_model_type, hf_model_type)


def run_model_type(model_dir: str, argv: Sequence[str] = ()) -> str:
    """The ms-swift model type of a run: ``--model_type`` in ``argv`` if given, else from config.json."""
    return flag_value(argv, 'model_type') or swift_model_type(read_config(model_dir).get('model_type'))


def model_type_flags(model_type: str) -> List[str]:
    """``--model_type`` (and, for the design type, the file that registers it) of a `megatron` command."""
    extra = ['--custom_register_path', REGISTER_FILE] if model_type == PLT_MODEL_TYPE else []
    return ['--model_type', model_type, *extra]


def causal_lm_class(config: dict) -> str:
    """The family's own transformers class for ``config``: transformers' AutoModelForCausalLM mapping of its
    model_type (for a multimodal checkpoint trained on text, Qwen3.5, its AutoModelForImageTextToText class: the export
    keeps the vision tower), else its own ``architectures`` when that is a transformers class of it; ValueError
    otherwise."""
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)

    from swift_plt.families import TEXT_ONLY_MULTIMODAL
    model_type = config.get('model_type')
    names = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES if model_type in TEXT_ONLY_MULTIMODAL else \
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    name = names.get(model_type)
    if name:
        return name
    own = (config.get('architectures') or [''])[0]
    if own.endswith('ForCausalLM'):
        import transformers
        cls = getattr(transformers, own, None)
        if cls is not None and getattr(cls.config_class, 'model_type', None) == model_type:
            return own
    raise ValueError(f'model_type {model_type!r} has no causal LM class in transformers (this version): the export '
                     'cannot write a plain model that transformers loads without remote code.')
