"""One training step of a megatron DDP model on a prepared batch, as ms-swift's trainer takes it: the model's
forward, ms-swift's loss form, megatron's forward-backward schedule; the loss reduced over DP x CP."""
import torch

IGNORE_INDEX = -100


def train_step(ddp, data) -> dict:
    """``{'loss', 'tokens', 'grads'}`` of one step on ``data`` (``prepare_batch``'s output), one micro-batch."""
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    def forward_step(data_iterator, model):
        d = next(data_iterator)
        labels = d['labels']
        output = model(input_ids=d['input_ids'], position_ids=d['position_ids'], attention_mask=d['attention_mask'],
                       labels=labels, packed_seq_params=d.get('packed_seq_params'))

        def loss_func(output_tensor):  # ms-swift MegatronTrainer.loss_func
            mask = labels != IGNORE_INDEX
            loss = torch.cat([torch.sum(output_tensor.float() * mask).view(1), mask.sum().view(1)])
            return loss[0].clone(), loss[1].detach().clone().to(torch.int), {'loss': loss.detach().clone()}

        return output, loss_func

    ddp.zero_grad_buffer()
    res = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=iter([data]), model=[ddp], num_microbatches=1,
        seq_length=data['input_ids'].shape[-1], micro_batch_size=data['input_ids'].shape[0], forward_only=False)
    total = res[0]['loss'].clone()
    torch.distributed.all_reduce(total, group=ps.get_data_parallel_group(with_context_parallel=True))
    grads = {n: p.main_grad.clone() for n, p in ddp.module.named_parameters()}
    return {'loss': float(total[0] / total[1]), 'tokens': int(total[1]), 'grads': grads}
