"""Which model families have a critic: one row per critic model type, derived from the family records
(``Family.critic``) and registered from this table by swift_plt.plugin.register (ms-swift and mcore-bridge). Imports
no torch.

A critic is the family's own decoder with a ``[1, H]`` value head; its HF format is the family's transformers
``*ForTokenClassification`` with ``num_labels=1``. A family qualifies when mcore-bridge builds it with a loader and
bridge the critic was verified against (``gpt``, or the hybrid ``qwen3_next``: swift_plt.critic.model) and the
installed transformers has a ``*ForTokenClassification`` for its ``model_type`` (checked when a checkpoint
is loaded: ``swift_plt.critic.keys.token_classification_class``).
"""
import difflib
from typing import NamedTuple, Optional

from swift_plt.critic import CRITIC_MODEL_TYPE
from swift_plt.families import FAMILIES


class CriticFamily(NamedTuple):
    hf_model_type: str  # config.json `model_type` of the family's checkpoints
    template: str  # ms-swift's default template of the family
    model_arch: Optional[str]  # ms-swift's ModelArch of the family (None: as ms-swift registers it)
    mcore_type: str = 'gpt'  # mcore-bridge's model type of the family (its loader and bridge; swift_plt.critic.model)


# critic model type -> its family, from the family records (``Family.critic``)
CRITIC_FAMILIES = {f.critic.critic_type: CriticFamily(f.hf_type, f.critic.template, f.critic.model_arch, f.mcore_type)
                   for f in FAMILIES.values() if f.critic is not None}
# critic types that are asked for but have no critic, and why (refused by name: unknown_critic_refusal)
NO_CRITIC = {f'{f.hf_type}_critic': f.no_critic for f in FAMILIES.values() if f.no_critic}
CRITIC_REQUIRES = ['transformers>=4.43']


def critic_for(hf_model_type: Optional[str]) -> Optional[str]:
    """The critic model type of checkpoints with this config.json ``model_type``, or None."""
    return next((k for k, f in CRITIC_FAMILIES.items() if f.hf_model_type == hf_model_type), None)


def family_refusal(critic_type: str, hf_model_type: Optional[str]) -> Optional[str]:
    """None where ``critic_type`` can load a checkpoint of ``hf_model_type``, else why not and what to do.
    ``llama3_2_critic`` also takes other Llama-like model types (its trunk keys are checked on load)."""
    family = CRITIC_FAMILIES[critic_type].hf_model_type
    if hf_model_type == family:
        return None
    other = critic_for(hf_model_type)
    if other is not None:
        return (f'--model_type {critic_type} is for `{family}` checkpoints, this one is `{hf_model_type}` '
                f'(config.json): use --model_type {other}.')
    if critic_type == CRITIC_MODEL_TYPE:
        return None
    return (f'--model_type {critic_type} is for `{family}` checkpoints, this one is `{hf_model_type}` (config.json); '
            f'critics exist for: {supported_list()}.')


def supported_list() -> str:
    return ', '.join(f'{f.hf_model_type} ({k})' for k, f in CRITIC_FAMILIES.items())


def unknown_critic_refusal(model_type: Optional[str]) -> Optional[str]:
    """What to do about an unknown ``--model_type`` meant as a critic type (it names 'critic' or is close to one);
    None for any other name (upstream's error stands)."""
    if not isinstance(model_type, str) or model_type in CRITIC_FAMILIES:
        return None
    name = model_type.strip().lower().replace('-', '_')
    if name in NO_CRITIC:
        return f'--model_type {model_type}: {NO_CRITIC[name]}'

    close = difflib.get_close_matches(name, list(CRITIC_FAMILIES), n=1, cutoff=0.8)
    if 'critic' not in name and not close:
        return None
    hint = f' (did you mean {close[0]}?)' if close else ''
    types = ', '.join(f'{k} ({f.hf_model_type})' for k, f in CRITIC_FAMILIES.items())
    return (f'--model_type {model_type} is unknown{hint}. The critic model types (checkpoint family, '
            f'config.json `model_type`): {types}. Pass the critic of your checkpoint\'s family.')
