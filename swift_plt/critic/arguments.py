"""Critic training arguments: ``--value_clip_range`` and the checks that must fail before step 1."""
from typing import List

from swift_plt.critic import CRITIC_MODEL_TYPE
from swift_plt.critic.families import CRITIC_FAMILIES

VALUE_CLIP_RANGE_HELP = (f'Critic training ({", ".join(CRITIC_FAMILIES)}): PPO clipped value loss with this clip '
                         'range eps, '
                         '0.5*max((v-R)^2, (clamp(v, v_old-eps, v_old+eps)-R)^2); every row then needs "old_values". '
                         'Default: None, the plain masked MSE 0.5*(v-R)^2.')


def is_critic(args) -> bool:
    """Whether ``--model_type`` is one of the critic model types (swift_plt.critic.families)."""
    return getattr(args, 'model_type', None) in CRITIC_FAMILIES


def resolve_critic_args(args) -> None:
    """Validate a critic run and set what its data path needs; raise ValueError (what, what to do) otherwise.

    Sets ``remove_unused_columns=False`` (ms-swift's loader otherwise drops the row fields "returns"/"reward"/
    "old_values", as for GRPO) and ``strict=True`` (a row with wrong returns stops the run with its message while
    the dataset is encoded, instead of being dropped with a warning).
    """
    clip = getattr(args, 'value_clip_range', None)
    if not is_critic(args):
        if clip is not None:
            raise ValueError(f'--value_clip_range trains a critic: use --model_type {CRITIC_MODEL_TYPE} (or the '
                             'critic of your family, e.g. qwen3_critic), or drop --value_clip_range.')
        return
    if clip is not None and not clip >= 0:
        raise ValueError(f'--value_clip_range must be >= 0, got {clip}.')
    problems: List[str] = []
    if getattr(args, 'rlhf_type', None) is not None:
        problems.append(f'rlhf_type={args.rlhf_type} (train the critic with `megatron sft` or `megatron pt`)')
    if getattr(args, 'task_type', 'causal_lm') != 'causal_lm':
        problems.append(f'--task_type {args.task_type} (the critic reads the response from causal-LM labels; '
                        'use the default causal_lm)')
    if getattr(args, 'lazy_tokenize', False) or getattr(args, 'streaming', False):
        problems.append('--lazy_tokenize/--streaming (critic rows are validated when the dataset is encoded, '
                        'before step 1; drop them)')
    truncation = getattr(args, 'truncation_strategy', None)
    if truncation not in (None, 'delete', 'raise'):
        problems.append(f'--truncation_strategy {truncation} (truncating a row would cut its returns; use delete '
                        'or raise, and a --max_length that fits your rows)')
    if getattr(args, 'mtp_num_layers', None):
        problems.append('--mtp_num_layers (no multi-token prediction on a value head; drop it)')
    if problems:
        raise ValueError(f'--model_type {args.model_type} cannot be trained with: ' + '; '.join(problems) + '.')
    args.remove_unused_columns = False
    args.strict = True
