"""ms-swift ``load_mcore_checkpoint``: a critic (``llama3_2_critic``, ``qwen3_critic``, ...) loads a causal-LM mcore checkpoint without its ``[V, H]``
LM head (upstream would load it into the ``[1, H]`` value head) and zeros the value head; a critic checkpoint loads
as upstream; other head shapes fail (docs/critic.md#initialisation). Other models: upstream, unchanged.
"""
import functools
import os

from swift_plt.compat.guard import guard
from swift_plt.compat.supported import VERIFIED_STACKS
from swift_plt.compat.versions import check_once

TARGET = 'swift.megatron.utils.megatron_lm_utils'
VERIFIED = f'ms-swift 4.6.0 on {VERIFIED_STACKS}'


def apply(module):
    check_once()
    upstream = guard(module, 'load_mcore_checkpoint',
                     ['args', 'ddp_models', 'optimizer', 'opt_param_scheduler', 'load_arg', 'adapter_name'], VERIFIED)
    if getattr(upstream, '_swift_plt', False):
        return
    load_iteration = guard(module, '_load_iteration', ['tracker_path'], VERIFIED)
    unwrap_model = guard(module, 'unwrap_model', None, VERIFIED)

    @functools.wraps(upstream)
    def load_mcore_checkpoint(args, ddp_models, optimizer=None, opt_param_scheduler=None, load_arg='mcore_model',
                              adapter_name='default'):
        critics = [m for m in unwrap_model(ddp_models) if getattr(m, 'is_critic', False)]
        if not critics or load_arg not in {'mcore_model', 'mcore_ref_model'}:
            return upstream(args, ddp_models, optimizer, opt_param_scheduler, load_arg, adapter_name)
        from swift_plt.critic.keys import classify_mcore_checkpoint, mcore_checkpoint_head_shape
        from swift_plt.critic.model import HEAD_INIT, init_value_head, logger
        load_dir = getattr(args, load_arg)
        iteration = load_iteration(os.path.join(load_dir, 'latest_checkpointed_iteration.txt'))
        checkpoint_dir = os.path.join(load_dir, f'iter_{iteration:07d}')
        kind = classify_mcore_checkpoint(
            mcore_checkpoint_head_shape(checkpoint_dir), critics[0].config.hidden_size, f'mcore checkpoint {load_dir}')
        if kind == 'critic':
            return upstream(args, ddp_models, optimizer, opt_param_scheduler, load_arg, adapter_name)
        if optimizer is not None and not (args.finetune or args.no_load_optim):
            raise ValueError(f'{load_dir} is a causal-LM checkpoint: its optimizer state does not fit a critic. '
                             'Start the critic from it with --finetune true (or --no_load_optim true).')
        for m in critics:
            m.checkpoint_without_head = True
        try:
            result = upstream(args, ddp_models, optimizer, opt_param_scheduler, load_arg, adapter_name)
        finally:
            for m in critics:
                m.checkpoint_without_head = False
        for m in critics:
            if m.value_head is not None:  # post_process stages (a multimodal critic: its language model's head)
                init_value_head(m.value_head.weight)
        critic_type = getattr(args, 'model_type', 'critic')
        logger.warning(f'[swift-plt] {critic_type}: mcore checkpoint {load_dir} is a causal LM (no value head): '
                       f'initialised the value head with {HEAD_INIT} (its LM head, if any, is dropped).')
        return result

    load_mcore_checkpoint._swift_plt = True
    module.load_mcore_checkpoint = load_mcore_checkpoint
