"""ms-swift ``swift.megatron.trainers.base.BaseMegatronTrainer.train_step``: at K > 1, a step with no loss token fails.

A step whose micro-batches (all of them, on every data-parallel rank) hold no label != -100 trains nothing: at K > 1
that happens when every document of the step is at most K tokens long (its first patch is never predicted), and
upstream would log no loss and a zero grad norm and go on. After upstream's step, the token counts that ms-swift's
``loss_func`` already returns per micro-batch (``metrics['loss'][1]``, last pipeline stage) are summed over the whole
world (one scalar all-reduce, every rank takes part, so every rank raises together: no hang) and the run stops with
swift_plt.data.report.check_step_loss_tokens's message, before the step is logged or saved. The counts are summed
on the device: one all-reduce and one device-to-host copy (``.item()``) per step, whatever the number of
micro-batches (ms-swift's ``loss_func`` defers its own reductions to log time). K=1: upstream unchanged (ms-swift
accepts such steps).
"""
import functools

from swift_plt.compat.guard import check_once, guard
from swift_plt.patch_level.patch_size import patch_size_of

TARGET = 'swift.megatron.trainers.base'
VERIFIED = 'ms-swift 4.6.0'


def local_loss_tokens(metrics, device=None):
    """Loss tokens of this rank's micro-batches (ms-swift's loss_func metrics: 'loss' = [loss sum, token count]), as
    a float64 scalar tensor on ``device``, summed there without a device-to-host copy (0 with no micro-batch: a
    pipeline stage other than the last)."""
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
