"""transformers ``Trainer.get_batch_samples`` (ms-swift's HF backend): for a PLT model (``PLTCausalLM``) at K > 1, a step
with micro-batches but no loss token fails before its forward (``check_step_loss_tokens``; one all-reduce and one
host copy per step). Other models, K=1: upstream's result.
"""
import functools

from swift_plt.compat.guard import guard

TARGET = 'transformers.trainer'
VERIFIED = 'transformers 5.19 (ms-swift 4.6.0)'


def model_patch_size(model) -> int:
    """K of a (possibly DDP/PEFT-wrapped) PLT model; 1 for any other model (a plain model keeps a ``patch_size``
    of its config.json at --patch_size 1, which must not count)."""
    from swift_plt.models.hf_causal_lm import PLTCausalLM
    for _ in range(4):
        if isinstance(model, PLTCausalLM):
            return model.patch_size
        if hasattr(model, 'get_base_model'):  # PEFT (LoRA): its .base_model is the LoraModel, whose own
            model = model.get_base_model()  # .base_model would skip past the PLT model to the inner decoder
            continue
        model = getattr(model, 'module', None) or getattr(model, 'base_model', None)
        if model is None:
            break
    return 1


def local_loss_tokens(batch_samples, device=None):
    """Labels != -100 of this rank's micro-batches as a float64 scalar on ``device``, no host copy."""
    import torch
    counts = [(b['labels'] != -100).sum().to(device=device, dtype=torch.float64)
              for b in batch_samples if isinstance(b, dict) and b.get('labels') is not None]
    return torch.stack(counts).sum() if counts else torch.zeros((), dtype=torch.float64, device=device)


def apply(module):
    # no version check here: transformers' Trainer is used outside ms-swift too; the PLT path runs only under
    # ms-swift, whose own patches check the versions
    cls = module.Trainer
    upstream = guard(cls, 'get_batch_samples', ['self', 'epoch_iterator', 'num_batches', 'device'], VERIFIED)
    if getattr(upstream, '_swift_plt', False):
        return
    from swift_plt.data.report import check_step_loss_tokens

    @functools.wraps(upstream)
    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batch_samples, num_items_in_batch = upstream(self, epoch_iterator, num_batches, device)
        k = model_patch_size(self.model)
        if k > 1:
            import torch
            import torch.distributed as dist
            count = torch.zeros(2, dtype=torch.float64, device=device)  # [loss tokens, micro-batches], on the device
            count[0] = local_loss_tokens(batch_samples, device)
            count[1] = len(batch_samples)
            if dist.is_initialized() and dist.get_world_size() > 1:
                # every rank, also one with no micro-batch at the end of an uneven epoch: none waits alone
                dist.all_reduce(count)
            tokens, batches = count.tolist()  # the step's one host sync
            if batches:
                check_step_loss_tokens(int(tokens), k, self.state.global_step + 1)
        return batch_samples, num_items_in_batch

    get_batch_samples._swift_plt = True
    cls.get_batch_samples = get_batch_samples
