"""``MegatronCriticTrainer``: ms-swift's Megatron trainer with the masked value loss (``megatron sft``/``pt`` with a
critic model type, e.g. ``--model_type qwen3_critic``; chosen by
swift_plt/plugin/patches/swift_megatron_pipelines_train_sft.py).

Everything else (data loading, schedules, optimizer, checkpointing, logging) is upstream's MegatronTrainer. The batch
carries token-aligned ``returns``/``old_values`` next to ``labels`` (swift_plt/plugin/patches/swift_template.py); here they become
value-aligned (swift_plt.critic.data.value_targets) before upstream's batch preparation rolls/slices the rest, and
the model is called without labels, so its output is the per-token values [B, S, 1] on the last pipeline stage.

Loss per micro-batch: (sum of per-token value losses, number of value tokens), the form of upstream's LM loss, so
megatron normalises by the global token count (``calculate_per_token_loss``, ms-swift's default for causal_lm) or
per micro-batch otherwise, exactly as for the LM loss. Logged: ``loss`` (= ``value_loss``), ``value_loss``,
``explained_variance``, ``value_mean``, ``returns_mean`` (+ ``value_clipfrac`` with --value_clip_range), reduced
over data-parallel x context-parallel ranks from sums (swift_plt.critic.loss.value_stats).

Context parallel: each CP rank receives its slice of the value-aligned targets (``split_targets_cp``, the same split
upstream applies to the rolled labels), its per-token values are those of the same positions, so its loss sum and
token count are local; megatron sums the token counts over DP x CP (finalize_model_grads) and the gradients over
DP x CP, exactly as for upstream's LM loss, and the logged sums are reduced over DP x CP in ``_log_callback``.
"""
from functools import partial

import torch
import torch.distributed as dist
from megatron.core import mpu
from megatron.core.utils import get_attr_wrapped_model

from swift.megatron.trainers import MegatronTrainer
from swift.utils import get_current_device, to_device
from swift_plt.critic.data import value_targets
from swift_plt.critic.loss import clipped_tokens, explained_variance_from_sums, masked_value_losses, value_stats

# what upstream's batch preparation and the model take; other collated keys (row fields kept because critic runs set
# remove_unused_columns=False, e.g. "dataset", "add_eos") are dropped.
_BATCH_KEYS = {
    'input_ids', 'position_ids', 'attention_mask', 'attention_mask_2d', 'labels', 'loss_scale', 'seq_lens',
    'num_samples', 'text_position_ids'
}
TARGET_KEYS = ('value_mask', 'returns', 'old_values')
# logged pairs [sum, count]; '_'-prefixed ones only feed explained_variance and are not printed
_SUM_KEYS = ('loss', 'value_mean', 'returns_mean', 'value_clipfrac', '_r2', '_d', '_d2')


def split_targets_cp(targets: dict, packed_seq_params=None, cp_partition_mode: str = 'zigzag') -> dict:
    """This context-parallel rank's slice of the value-aligned targets (identity without CP).

    Upstream's ``get_batch_on_this_cp_rank`` slices only its own keys (labels, position_ids, loss_scale, input_ids);
    the targets are sliced here with the same function and arguments (mcore-bridge ``split_cp_inputs`` along the
    sequence, per packed sequence by ``cu_seqlens_q`` for THD, zigzag or contiguous), so position i of a rank's
    targets belongs to position i of its tokens, values and rolled labels. The targets are already shifted to value
    positions before the split (like upstream rolls the labels), so every value/target pair is local to one rank."""
    if mpu.get_context_parallel_world_size() == 1:
        return targets
    from mcore_bridge import split_cp_inputs
    kwargs = {'cp_partition_mode': 'contiguous'} if cp_partition_mode == 'contiguous' else {}
    cu_seqlens = getattr(packed_seq_params, 'cu_seqlens_q', None)
    return {k: None if v is None else split_cp_inputs(v, cu_seqlens, -1, **kwargs) for k, v in targets.items()}


def critic_loss_func(output_tensor, *, value_mask, returns, old_values=None, clip_range=None):
    """Megatron loss function of one micro-batch: ``(loss_sum, num_tokens, metrics)``."""
    values = output_tensor.squeeze(-1).float()  # [B, S]: position t = value of the state after token t
    if values.shape != returns.shape:
        raise ValueError(f'critic: model output {tuple(output_tensor.shape)} does not match the batch '
                         f'{tuple(returns.shape)} (expected per-token values [B, S, 1])')
    losses = masked_value_losses(values, returns, value_mask, old_values, clip_range)
    n = value_mask.sum().float()
    s = value_stats(values, returns, value_mask)
    metrics = {
        'loss': torch.stack([losses.detach().sum(), n]),
        'value_mean': torch.stack([s['v'], n]),
        'returns_mean': torch.stack([s['r'], n]),
        '_r2': torch.stack([s['r2'], n]),
        '_d': torch.stack([s['d'], n]),
        '_d2': torch.stack([s['d2'], n]),
    }
    if clip_range is not None:
        clipped = clipped_tokens(values, returns, value_mask, old_values, clip_range)
        metrics['value_clipfrac'] = torch.stack([clipped.float().sum(), n])
    return losses.sum(), n.to(torch.int), metrics


def finish_logs(logs: dict) -> None:
    """[sum, count] pairs (already summed over micro-batches, steps and ranks) -> the logged critic metrics."""
    if 'loss' not in logs:
        return
    sums = {k: logs.pop(k) for k in _SUM_KEYS if k in logs}
    n = sums['loss'][1]
    stats = {'n': n, 'r': sums['returns_mean'][0], 'r2': sums['_r2'][0], 'd': sums['_d'][0], 'd2': sums['_d2'][0]}
    logs['loss'] = sums['loss']
    logs['value_loss'] = sums['loss'].clone()
    logs['explained_variance'] = explained_variance_from_sums(stats)
    for k in ('value_mean', 'returns_mean', 'value_clipfrac'):
        if k in sums:
            logs[k] = sums[k]


class MegatronCriticTrainer(MegatronTrainer):

    def _prepare_batch(self, data, vp_stage=None):
        returns, old_values = data.pop('returns', None), data.pop('old_values', None)
        if returns is None:
            raise ValueError('critic: the batch has no "returns" (the critic template patch did not run; is the '
                             f'model type {self.args.model_type} and the plugin enabled?)')
        targets = value_targets(data['labels'], returns, old_values)  # before upstream rolls the labels
        data = {k: v for k, v in data.items() if k in _BATCH_KEYS}
        batch = super()._prepare_batch(data, vp_stage)
        batch.pop('labels', None)  # the value model is called without labels: its output is the values
        batch.pop('loss_scale', None)
        if mpu.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage):
            targets = to_device(targets, get_current_device())
            batch.update(split_targets_cp(targets, batch.get('packed_seq_params'),
                                          getattr(self.args, 'cp_partition_mode', 'zigzag')))
        return batch

    def forward_step(self, data_iterator, model):
        vp_stage = get_attr_wrapped_model(model, 'vp_stage')
        data = self.get_batch(data_iterator, vp_stage)
        targets = {k: data.pop(k, None) for k in TARGET_KEYS}
        output_tensor = model(**data)
        loss_func = partial(critic_loss_func, clip_range=self.args.value_clip_range, **targets)
        return output_tensor, loss_func

    def _log_callback(self, logs, n_steps):
        if mpu.is_pipeline_last_stage(ignore_virtual=True):
            # every last-stage rank enters the collective with the same keys (zeros where a rank saw no value token)
            keys = [k for k in _SUM_KEYS if k != 'value_clipfrac' or self.args.value_clip_range is not None]
            zeros = torch.zeros(2, dtype=torch.float32, device=get_current_device())
            stacked = torch.stack([logs.get(k, zeros).float() for k in keys])
            dist.all_reduce(stacked, group=mpu.get_data_parallel_group(with_context_parallel=True))
            if stacked[0, 1] > 0:
                logs.update({k: stacked[i] for i, k in enumerate(keys)})
                finish_logs(logs)
            else:
                for k in keys:
                    logs.pop(k, None)
        # skip MegatronTrainer._log_callback (it would all-reduce `loss` a second time): upstream's base logging
        super(MegatronTrainer, self)._log_callback(logs, n_steps)
