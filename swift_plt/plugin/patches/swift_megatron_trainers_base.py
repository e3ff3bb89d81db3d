"""ms-swift ``BaseMegatronTrainer.train_step``: at K > 1, after upstream's step, a step with no loss token on any rank
fails (``check_step_loss_tokens``) before it is logged or saved. Counts come from ms-swift's ``loss_func`` metrics:
one all-reduce (every rank raises together) and one host copy per step.
"""
import functools

from swift_plt.compat.guard import guard
from swift_plt.compat.supported import VERIFIED_STACKS
from swift_plt.compat.versions import check_once
from swift_plt.patch_level.patch_size import patch_size_of

TARGET = 'swift.megatron.trainers.base'
VERIFIED = f'ms-swift 4.6.0 on {VERIFIED_STACKS}'


def local_loss_tokens(metrics, device=None):
    """Loss tokens of this rank's micro-batches (loss_func metrics 'loss' = [sum, count]) as a float64 scalar on
    ``device``, no host copy (0 on a pipeline stage other than the last)."""
    import torch
    counts = [torch.as_tensor(m['loss'][1]).to(device=device, dtype=torch.float64).reshape(())
              for m in metrics or [] if isinstance(m, dict) and 'loss' in m]
    return torch.stack(counts).sum() if counts else torch.zeros((), dtype=torch.float64, device=device)


def apply(module):
    check_once(('ms-swift', 'mcore-bridge', 'megatron-core'))
    cls = module.BaseMegatronTrainer
    upstream = guard(cls, 'train_step', ['self', 'train_data_iterator'], VERIFIED)
    if getattr(upstream, '_swift_plt', False):
        return
    from swift_plt.data.report import check_step_loss_tokens

    @functools.wraps(upstream)
    def train_step(self, train_data_iterator):
        result = upstream(self, train_data_iterator)
        k = patch_size_of(self.args)
        if k > 1:
            import torch
            import torch.distributed as dist
            count = local_loss_tokens(result[0], torch.cuda.current_device())
            if dist.is_initialized():
                dist.all_reduce(count)
            check_step_loss_tokens(int(count.item()), k, self.state.iteration + 1)  # the step's one host sync
        return result

    train_step._swift_plt = True
    cls.train_step = train_step
