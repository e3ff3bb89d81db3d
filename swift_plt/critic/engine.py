"""``MegatronCritic``: the critic as an in-process engine for RL drivers (PPO), on the Megatron model with TP/PP.

In the spirit of verl's engine API (a worker drives ``forward_backward_batch`` + ``optimizer_step`` with a loss
function it sets), on megatron's own pipeline schedules (``get_forward_backward_func``) and optimizer:

    critic = MegatronCritic(models, optimizer, max_tokens_per_micro_batch=16384, clip_range=0.2)
    old_values = critic.compute_values(batch)                        # [B, S-1], on every rank
    batch.update(returns=..., value_mask=..., old_values=old_values)  # value-aligned [B, S-1]
    metrics = critic.update_critic(batch)                            # one optimizer step

Batch (the same on every TP/PP rank of a data-parallel group; each data-parallel rank passes its own shard):
  ``input_ids`` [B, S] (long); ``attention_mask`` [B, S] (1 = token, 0 = padding, left or right; default all 1);
  ``position_ids`` [B, S] (default: ``cumsum(attention_mask) - 1``, as verl);
  for updates, value-aligned [B, S-1] tensors like ``compute_values``' output: ``returns``, ``value_mask``
  (1 where a return exists), optional ``old_values`` (needed with ``clip_range``); checked and left-aligned by
  swift_plt.critic.batch.
Alignment (swift_plt.critic.data): ``values[:, t]`` is the value of the state after token t, trained towards the
return of token t+1; for a response of R tokens at the end of the sequence, ``values[:, -R:]`` (verl's
``values[:, -R-1:-1]`` of the [B, S] output). ``response_to_values`` places [B, R] response tensors there.

Padding removal (``remove_padding=True``, the default, as verl's ``use_remove_padding``): each micro-batch runs as
one packed THD row, each row's tokens one sequence (megatron ``PackedSeqParams`` from ms-swift's
``get_packed_seq_params``: no attention across rows, RoPE positions 0..n-1 per row), so a micro-batch costs its real
tokens, not rows x S (swift_plt.critic.thd). Rows are grouped ``micro_batch_size`` at a time, or with
``max_tokens_per_micro_batch`` into balanced micro-batches of at most that many tokens (a longer row alone); the
values come back to the caller's ``[B, S-1]`` layout and the loss is the token mean over the whole batch either way.
``remove_padding=False`` runs the left-aligned rows padded (the causal mask alone is exact, see ``left_align``).
Layout padding, as ms-swift pads its batches: under sequence parallel the row / packed row to a multiple of TP, under
context parallel each row / sequence to a multiple of 2*CP (``thd.layout_multiples``).

Context parallel (the model built with ``context_parallel_size`` N > 1, megatron DDP-wrapped for updates): each
micro-batch is split like ms-swift splits its batches (mcore-bridge ``split_cp_inputs``, zigzag: the layout of
Transformer Engine's CP attention; per sequence for THD); the per-token values are gathered back (ms-swift
``reconstruct_tensor_cp``, which keeps the autograd graph of this rank's slice) to the caller's ``[B, S-1]`` layout
on every rank. The loss function therefore sees the whole micro-batch, as without CP, on every CP rank; its gradient
reaches the weights through each rank's own slice only, and megatron sums the ranks' gradients (DDP over data x
context parallel, the schedule's CP factor), so the step is the 1-rank step. Virtual pipeline: every model chunk
reads the same micro-batches (by tokens: their number rounded up to a multiple of PP).

Loss function (``set_loss_fn``): ``fn(values [b, S-1] fp32, micro_batch) -> (loss, metrics)`` where ``loss`` is the
mean over the micro-batch's value tokens (``value_mask``); the engine weights micro-batches by their token counts,
so the step minimises the token mean over the whole batch whatever the micro-batch size. The default is
``swift_plt.critic.loss.value_loss`` (masked MSE, or PPO clipped with ``clip_range``).
"""
from typing import Callable, Dict, List, Optional

import torch
import torch.distributed as dist

from swift_plt.critic.batch import (
    check_batch,
    check_positions,
    default_position_ids,
    left_align,
    response_to_values,
    unalign_values,
)
from swift_plt.critic.loss import STAT_KEYS, explained_variance_from_sums, value_loss, value_stats

# the batch helpers stay importable from here (the engine's API, docs/critic_training.md)
__all__ = ['MegatronCritic', 'LossFn', 'response_to_values', 'default_position_ids', 'left_align', 'unalign_values']

LossFn = Callable[[torch.Tensor, Dict[str, torch.Tensor]], tuple]


class MegatronCritic:
    """See the module docstring. ``models``: this rank's model chunk(s) of the critic (a list, as mcore-bridge's
    ``get_mcore_model`` / ms-swift build them; megatron DDP-wrapped for training with a megatron optimizer).
    ``optimizer``: a megatron ``MegatronOptimizer`` (``get_megatron_optimizer``) or any torch optimizer.
    ``micro_batch_size``: rows per micro-batch (default: the whole batch); ``max_tokens_per_micro_batch`` (packed
    only, instead): tokens per micro-batch; ``remove_padding``: packed THD rows (default) or padded rows."""

    def __init__(self,
                 models: List[torch.nn.Module],
                 optimizer=None,
                 *,
                 micro_batch_size: Optional[int] = None,
                 max_tokens_per_micro_batch: Optional[int] = None,
                 remove_padding: bool = True,
                 clip_range: Optional[float] = None,
                 loss_fn: Optional[LossFn] = None):
        from megatron.core.utils import get_model_config
        self.models = list(models)
        self.optimizer = optimizer
        self.micro_batch_size = micro_batch_size
        self.max_tokens_per_micro_batch = max_tokens_per_micro_batch
        self.remove_padding = remove_padding
        if max_tokens_per_micro_batch is not None and (micro_batch_size is not None or not remove_padding):
            raise ValueError('MegatronCritic(max_tokens_per_micro_batch=...) groups packed rows by tokens: it needs '
                             'remove_padding=True and no micro_batch_size (rows per micro-batch).')
        self.clip_range = clip_range
        self.loss_fn = loss_fn or self.default_loss_fn
        config = get_model_config(self.models[0])
        self.cp_size = getattr(config, 'context_parallel_size', 1) or 1
        if self.cp_size > 1 and optimizer is not None and not hasattr(self.models[0], 'zero_grad_buffer'):
            raise ValueError(f'MegatronCritic with context parallel (context_parallel_size={self.cp_size}) trains a '
                             'megatron DDP-wrapped model (megatron.core.distributed.DistributedDataParallel): the '
                             'gradients of the CP ranks must be summed. Wrap the model chunks in DDP, as ms-swift '
                             'does.')
        if optimizer is not None and hasattr(optimizer, 'scale_loss') and config.grad_scale_func is None:
            config.grad_scale_func = optimizer.scale_loss
        if hasattr(self.models[0], 'zero_grad_buffer') and config.finalize_model_grads_func is None:
            from megatron.core.distributed import finalize_model_grads
            config.finalize_model_grads_func = finalize_model_grads  # DP/TP grad reduction, as ms-swift sets it
        self.config = config

    # ---- loss -------------------------------------------------------------------------------------------------
    def set_loss_fn(self, loss_fn: LossFn) -> None:
        self.loss_fn = loss_fn

    def default_loss_fn(self, values, micro_batch):
        mask, returns, old = micro_batch['value_mask'], micro_batch['returns'], micro_batch.get('old_values')
        if self.clip_range is not None and old is None:
            raise ValueError('MegatronCritic(clip_range=...) needs batch["old_values"] (e.g. from compute_values '
                             'before the update), value-aligned [B, S-1].')
        loss = value_loss(values, returns, mask, old if self.clip_range is not None else None, self.clip_range)
        return loss, {}

    # ---- core step ----------------------------------------------------------------------------------------------
    @property
    def _multiples(self):
        """(per-sequence, per-row/total) token multiples of this model's layout (swift_plt.critic.thd)."""
        if getattr(self, '_multiples_cache', None) is None:
            from swift_plt.critic.thd import layout_multiples
            self._multiples_cache = layout_multiples(self.config)
        return self._multiples_cache

    def _row_groups(self, batch) -> List[List[int]]:
        """Row indices of each micro-batch: ``micro_batch_size`` consecutive rows (default: the whole batch), or
        rows grouped by token count up to ``max_tokens_per_micro_batch`` (``thd.partition_by_tokens``)."""
        B = batch['input_ids'].shape[0]
        if getattr(self, 'max_tokens_per_micro_batch', None) is not None:
            from megatron.core import parallel_state as mpu

            from swift_plt.critic.thd import partition_by_tokens
            seq = self._multiples[0]
            n = batch['attention_mask'].long().sum(1).clamp(min=1)
            lengths = ((n + seq - 1) // seq * seq).tolist()
            vpp = len(self.models) > 1  # interleaved schedule: a multiple of PP micro-batches
            return partition_by_tokens(lengths, self.max_tokens_per_micro_batch,
                                       mpu.get_pipeline_model_parallel_world_size() if vpp else 1)
        mbs = self.micro_batch_size or B
        if B % mbs:
            raise ValueError(f'batch size {B} is not a multiple of micro_batch_size {mbs}')
        return [list(range(i, i + mbs)) for i in range(0, B, mbs)]

    def _micro_batches(self, batch) -> List[Dict[str, torch.Tensor]]:
        """``batch`` (already ``left_align``-ed: attention_mask and position_ids set) -> micro-batches (each with
        ``_rows``: its rows' indices in ``batch``)."""
        out = []
        for rows in self._row_groups(batch):
            idx = torch.tensor(rows, device=batch['input_ids'].device)
            mb = {k: v[idx] if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            mb['_rows'] = idx
            out.append(mb)
        return out

    def forward_backward_step(self, batch: Dict[str, torch.Tensor], forward_only: bool) -> List[dict]:
        """One pass of megatron's schedule over ``batch`` split into micro-batches; gradients accumulate unless
        ``forward_only``. Returns, on the last pipeline stage, one dict per micro-batch (``values`` and their
        ``rows`` when ``forward_only``, in the row layout of ``left_align``; else ``loss``, the sums of
        ``loss.STAT_KEYS`` and the loss function's metrics); elsewhere an empty list."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        from swift_plt.critic.model import values as values_of  # [B, S, 1] -> [B, S-1]
        check_batch(batch, forward_only)
        batch, _ = left_align(batch)
        device = next(self.models[0].parameters()).device
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        if self.remove_padding:
            check_positions(batch)
        micro_batches = self._micro_batches(batch)
        total_tokens = None if forward_only else sum(float(mb['value_mask'].sum()) for mb in micro_batches)
        num_mb = len(micro_batches)
        S = batch['input_ids'].shape[1]
        inputs = self._packed_inputs(micro_batches) if self.remove_padding else \
            [self._padded_inputs(mb) for mb in micro_batches]
        items = list(zip(micro_batches, inputs))
        # one iterator per model chunk (virtual pipeline: each chunk reads every micro-batch in order)
        data = [iter(items) for _ in self.models] if len(self.models) > 1 else iter(items)

        def forward_step(data_iterator, model):
            mb, inp = next(data_iterator)
            # padded: rows are left-aligned (padding at the right only), so the causal mask is exact for every token
            # on every attention backend (see left_align); packed (THD): one sequence per row, padding after its
            # tokens. Outputs at padding positions are never used.
            output = model(input_ids=inp['input_ids'], position_ids=inp['position_ids'], attention_mask=None,
                           packed_seq_params=inp['packed_seq_params'])

            def loss_func(output_tensor):
                output_tensor = self._to_rows(output_tensor, inp, S)  # [b, S, 1], every CP rank
                values = values_of(output_tensor).float()  # [b, S-1], value-aligned
                if forward_only:
                    return values.sum() * 0, {'values': values.detach(), 'rows': mb['_rows']}
                loss, metrics = self.loss_fn(values, mb)
                n = mb['value_mask'].float().sum()
                # the schedule divides by the number of micro-batches: weight by this micro-batch's token share
                scaled = loss * (n / max(total_tokens, 1.0) * num_mb)
                stats = value_stats(values, mb['returns'], mb['value_mask'])
                out = {'loss': loss.detach() * n, **{f'sum_{k}': v for k, v in stats.items()}}
                out.update({k: torch.as_tensor(v, dtype=torch.float32) for k, v in metrics.items()})
                return scaled, out

            return output, loss_func

        return get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=data,
            model=self.models,
            num_microbatches=num_mb,
            seq_length=max(inp['seq_length'] for inp in inputs),
            micro_batch_size=inputs[0]['input_ids'].shape[0],
            forward_only=forward_only)

    def _padded_inputs(self, mb):
        """Model inputs of a padded micro-batch: rows right-padded to the layout's multiple (2*CP under context
        parallel, TP under sequence parallel: ms-swift's ``get_padding_to``), then this CP rank's zigzag slice
        (as ms-swift splits a padded batch)."""
        inputs = {k: mb[k] for k in ('input_ids', 'position_ids')}
        S = inputs['input_ids'].shape[1]
        pad = -S % self._multiples[1]  # right padding: the causal mask keeps it out of every real token
        if pad:
            inputs = {k: torch.nn.functional.pad(v, (0, pad)) for k, v in inputs.items()}
        if self.cp_size > 1:
            from mcore_bridge import split_cp_inputs
            inputs = {k: split_cp_inputs(v, None, 1) for k, v in inputs.items()}
        return dict(inputs, packed_seq_params=None, seq_length=S + pad)

    def _packed_inputs(self, micro_batches):
        """Model inputs of each micro-batch as one packed THD row (swift_plt.critic.thd): its rows' tokens without
        their padding, one sequence per row, then this CP rank's slice (mcore-bridge ``split_cp_inputs`` per
        sequence, as ms-swift splits a padding-free batch). Under a pipeline without ``variable_seq_lengths``
        every micro-batch is padded to the longest."""
        from swift_plt.critic.thd import pack_rows, packed_seq_params
        seq_m, total_m = self._multiples
        lengths = [mb['attention_mask'].long().sum(1) for mb in micro_batches]
        packed = [pack_rows(mb['input_ids'], n, seq_m, total_m) for mb, n in zip(micro_batches, lengths)]
        if len(self.models) > 1 or self.config.pipeline_model_parallel_size > 1:
            if not getattr(self.config, 'variable_seq_lengths', False):
                T = max(p['input_ids'].shape[1] for p in packed)
                packed = [pack_rows(mb['input_ids'], n, seq_m, total_m, total=T)
                          for mb, n in zip(micro_batches, lengths)]
        out = []
        for p, n in zip(packed, lengths):
            psp = packed_seq_params(p['position_ids'])
            psp.seq_lens, psp.num_samples = n, int(n.shape[0])  # as ms-swift's prepare_batch sets them
            inputs = {k: p[k] for k in ('input_ids', 'position_ids')}
            if self.cp_size > 1:
                from mcore_bridge import split_cp_inputs
                inputs = {k: split_cp_inputs(v, psp.cu_seqlens_q, 1) for k, v in inputs.items()}
            out.append(dict(inputs, packed_seq_params=psp, seq_length=p['input_ids'].shape[1], lengths=n,
                            cu_seqlens=p['cu_seqlens']))
        return out

    def _to_rows(self, output, inputs, S):
        """This rank's model output -> [b, S, 1] in the micro-batch's row layout, on every CP rank (autograd through
        this rank's slice)."""
        psp = inputs['packed_seq_params']
        if psp is None:
            return self._cp_gather(output)[:, :S]
        from swift_plt.critic.thd import unpack_rows
        if self.cp_size > 1:
            # ms-swift's THD gather (swift.megatron.utils' variant needs Transformer Engine's index helper for THD)
            from swift.megatron.trainers.utils import reconstruct_tensor_cp as reconstruct_thd
            output = reconstruct_thd(self.cp_size, output, psp, psp.num_samples, 'zigzag')
        return unpack_rows(output, inputs['cu_seqlens'], inputs['lengths'], S)

    def _cp_gather(self, output):
        """[b, S/CP, 1] of this rank -> [b, S, 1] in sequence order (autograd through this rank's slice)."""
        if self.cp_size == 1:
            return output
        from swift.megatron.utils import reconstruct_tensor_cp
        return reconstruct_tensor_cp(output, None, dim=1, cp_partition_mode='zigzag')

    def zero_grad(self) -> None:
        for m in self.models:
            if hasattr(m, 'zero_grad_buffer'):
                m.zero_grad_buffer()
        if self.optimizer is not None:
            self.optimizer.zero_grad()

    def optimizer_step(self) -> Dict[str, float]:
        """Apply the accumulated gradients; returns ``grad_norm`` / ``update_successful`` where the optimizer reports
        them (megatron's does)."""
        if self.optimizer is None:
            raise ValueError('MegatronCritic has no optimizer (pass one to the constructor to train).')
        result = self.optimizer.step()
        if isinstance(result, tuple):  # megatron: (update_successful, grad_norm, num_zeros_in_grad)
            return {'update_successful': bool(result[0]), 'grad_norm': float(result[1] or 0.0)}
        return {}

    # ---- driver API ---------------------------------------------------------------------------------------------
    def compute_values(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        """Per-token values [B, S-1] (fp32, no grad; 0 where the token or the next token is padding), returned on
        every rank (broadcast from the last pipeline stage over the pipeline group)."""
        for m in self.models:
            m.eval()
        with torch.no_grad():
            out = self.forward_backward_step(batch, forward_only=True)
        B, S = batch['input_ids'].shape
        values = None
        if out:
            values = out[0]['values'].new_zeros(B, S - 1)
            for o in out:  # micro-batches may group rows out of order (max_tokens_per_micro_batch)
                values[o['rows']] = o['values']
        values = self._from_last_stage(values, (B, S - 1))
        _, start = left_align({k: batch.get(k) for k in ('input_ids', 'attention_mask')})
        return unalign_values(values, start, batch.get('attention_mask'))

    def update_critic(self, batch: Dict[str, torch.Tensor]) -> Dict[str, float]:
        """One optimizer step on ``batch`` (zero grads, forward/backward over its micro-batches, step). Returns the
        metrics of the batch (values before the step), on every rank: ``value_loss`` (token mean),
        ``explained_variance``, ``value_mean``, ``returns_mean``, the loss function's own metrics (mean over
        micro-batches), ``grad_norm``."""
        for m in self.models:
            m.train()
        self.zero_grad()
        out = self.forward_backward_step(batch, forward_only=False)
        step = self.optimizer_step()
        metrics = None
        if out:
            sums = {k: sum(o[f'sum_{k}'] for o in out) for k in STAT_KEYS}
            n = sums['n'].clamp(min=1)
            extra = sorted(set(out[0]) - {'loss'} - {f'sum_{k}' for k in STAT_KEYS})
            metrics = torch.stack([
                sum(o['loss'] for o in out) / n,
                explained_variance_from_sums(sums),
                sums['v'] / n,
                sums['r'] / n,
                *[sum(o[k] for o in out) / len(out) for k in extra],
            ]).float()
            names = ['value_loss', 'explained_variance', 'value_mean', 'returns_mean', *extra]
        else:
            names = None
        names = self._object_from_last_stage(names)
        metrics = self._from_last_stage(metrics, (len(names), ))
        result = {k: float(v) for k, v in zip(names, metrics)}
        result.update(step)
        return result

    # ---- pipeline broadcast -------------------------------------------------------------------------------------
    @staticmethod
    def _pp():
        from megatron.core import parallel_state as mpu
        if mpu.get_pipeline_model_parallel_world_size() == 1:
            return None
        return mpu.get_pipeline_model_parallel_group(), mpu.get_pipeline_model_parallel_last_rank()

    def _from_last_stage(self, tensor, shape):
        pp = self._pp()
        if pp is None:
            return tensor
        group, src = pp
        device = next(self.models[0].parameters()).device
        if tensor is None:
            tensor = torch.empty(shape, dtype=torch.float32, device=device)
        tensor = tensor.float().contiguous().to(device)
        dist.broadcast(tensor, src=src, group=group)
        return tensor

    def _object_from_last_stage(self, obj):
        pp = self._pp()
        if pp is None:
            return obj
        group, src = pp
        box = [obj]
        dist.broadcast_object_list(box, src=src, group=group)
        return box[0]
