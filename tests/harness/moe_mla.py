"""CPU stand-ins for the Transformer Engine modules that MoE experts and MLA need (patches P17/P18, see patches.py).

Imported lazily by the P3 layer spec (megatron-core 0.16.1 is already imported then).
"""
import copy
from functools import partial
from typing import List, Optional

import torch
import torch.nn.functional as F
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.mlp import MLPSubmodules
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.moe.experts import TEGroupedMLP
from megatron.core.transformer.moe.moe_layer import MoESubmodules
from megatron.core.transformer.multi_latent_attention import MLASelfAttentionSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.utils import divide


# ---------------------------------------------------------------------------------------------------------- P17
class GroupedLinear(MegatronModule):
    """megatron's ``TEGroupedLinear`` (0.16.1) over TE's ``GroupedLinear`` on CPU: ``weight{i}`` / ``bias{i}`` per
    local expert, ``forward(x, m_splits)`` = one ``F.linear`` per expert on its rows. No communication: like TE with
    ``explicit_expert_comm``, the MoE token dispatcher moves tokens between EP / expert-TP ranks."""

    parallel_mode: Optional[str] = None

    def __init__(self, num_gemms: int, input_size: int, output_size: int, *, config, init_method, bias: bool,
                 skip_bias_add: bool, is_expert: bool = False, tp_comm_buffer_name: Optional[str] = None,
                 pg_collection=None, name: Optional[str] = None):  # name: megatron-core >= 0.19
        super().__init__(config=config)
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker, get_expert_parallel_rng_tracker_name
        from megatron.core.transformer.moe.moe_utils import ProcessGroupCollection
        assert is_expert, 'TEGroupedLinear only supports expert parallelism'
        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups()
        self._pg_collection = pg_collection
        self._tp_group = pg_collection.expt_tp
        tp_size = self._tp_group.size()
        self.is_expert = True
        self.expert_parallel = config.expert_model_parallel_size > 1
        self.explicit_expert_comm = tp_size > 1 or self.expert_parallel
        mode = self.parallel_mode
        if self.explicit_expert_comm:  # TE then gets parallel_mode=None and this rank's slice
            if mode == 'column':
                output_size = divide(output_size, tp_size)
            elif mode == 'row':
                input_size = divide(input_size, tp_size)
            mode = None
        self.num_gemms, self.in_features, self.out_features = num_gemms, input_size, output_size
        self.use_bias, self.te_return_bias = bias, skip_bias_add and bias
        for i in range(num_gemms):
            weight = torch.nn.Parameter(torch.empty(output_size, input_size, dtype=config.params_dtype))
            if config.perform_initialization:
                with get_cuda_rng_tracker().fork(get_expert_parallel_rng_tracker_name()):
                    init_method(weight)
            # TE GroupedLinear.reset_parameters: every weight is "parallel", split dim by TE's parallel_mode
            weight.tensor_model_parallel, weight.partition_dim, weight.partition_stride = True, int(mode == 'row'), 1
            self.register_parameter(f'weight{i}', weight)
            if bias:
                b = torch.nn.Parameter(torch.zeros(output_size, dtype=config.params_dtype))
                if mode == 'row':
                    b.sequence_parallel = config.sequence_parallel
                elif mode == 'column':
                    b.tensor_model_parallel, b.partition_dim, b.partition_stride = True, 0, 1
                self.register_parameter(f'bias{i}', b)
        for param in self.parameters():  # megatron TEGroupedLinear: expert grads stay out of the dense all-reduce
            param.allreduce = not (is_expert and self.expert_parallel)

    def forward(self, x, m_splits: List[int]):
        chunks = torch.split(x.reshape(-1, x.shape[-1]), list(m_splits))
        add_bias = self.use_bias and not self.te_return_bias
        out = torch.cat([
            F.linear(c, getattr(self, f'weight{i}'), getattr(self, f'bias{i}') if add_bias else None)
            for i, c in enumerate(chunks)
        ])
        out = out.view(*x.shape[:-1], self.out_features)
        if self.te_return_bias:
            return out, [getattr(self, f'bias{i}') for i in range(self.num_gemms)]
        return out, None

    def backward_dw(self):
        pass

    def _tp_axis_map(self):
        raise NotImplementedError

    def sharded_state_dict(self, prefix='', sharded_offsets=(), metadata=None):
        # == TEGroupedLinear._sharded_state_dict_grouped of megatron-core 0.16.1, without TE's _extra_state
        from megatron.core.dist_checkpointing.utils import replace_prefix_for_sharding
        from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint
        singleton_local_shards = (metadata or {}).get('singleton_local_shards', False)
        ep = self._pg_collection.ep
        full = self.state_dict(prefix='', keep_vars=True)
        out = {}
        for i in range(self.num_gemms):
            global_idx = ep.rank() * self.num_gemms + i
            sd = {f'{i}.weight': full[f'weight{i}']}
            if self.use_bias:
                sd[f'{i}.bias'] = full[f'bias{i}']
            if singleton_local_shards:
                expert_prefix, offsets = f'{global_idx}.{prefix}', sharded_offsets
            else:
                expert_prefix = prefix
                offsets = (*sharded_offsets, (len(sharded_offsets), global_idx, ep.size() * self.num_gemms))
            sub = make_sharded_tensors_for_checkpoint(sd, '', self._tp_axis_map(), offsets, tp_group=self._tp_group,
                                                      dp_cp_group=metadata['dp_cp_group'])
            replace_prefix_for_sharding(sub, f'{i}.', expert_prefix)
            out[f'{prefix}weight{i}'] = sub[f'{i}.weight']
            if self.use_bias:
                out[f'{prefix}bias{i}'] = sub[f'{i}.bias']
        edp_rank = self._pg_collection.expt_dp.rank()
        for sh_ten in out.values():  # replication along DP modulo EP
            if not getattr(sh_ten, 'is_data_parallel_fully_shard', False):
                sh_ten.replica_id = (*sh_ten.replica_id[:2], edp_rank)
        return out


class ColumnParallelGroupedLinear(GroupedLinear):
    """``TEColumnParallelGroupedLinear`` on CPU (P17)."""
    parallel_mode = 'column'

    def _tp_axis_map(self):
        return {f'{i}.{k}': 0 for i in range(self.num_gemms) for k in ('weight', 'bias')}


class RowParallelGroupedLinear(GroupedLinear):
    """``TERowParallelGroupedLinear`` on CPU (P17)."""
    parallel_mode = 'row'

    def _tp_axis_map(self):
        return {f'{i}.weight': 1 for i in range(self.num_gemms)}


# ---------------------------------------------------------------------------------------------------------- P18
class MLACoreAttention(DotProductAttention):
    """megatron's local ``DotProductAttention`` with TE's MLA arguments: query/key head dim ``k_channels``, value head
    dim ``v_channels``, ``softmax_scale`` from MLA. Masks and THD (P14) as for ``DotProductAttention``."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type, attention_dropout=None,
                 softmax_scale=None, k_channels=None, v_channels=None, cp_comm_type=None, pg_collection=None):
        # Attention.__init__ first builds a core attention without k/v channels, which MLA then replaces
        k_channels = k_channels or config.kv_channels or 1
        v_channels = v_channels or k_channels
        sizing = copy.copy(config)
        sizing.kv_channels = k_channels  # MLA configs leave it None; the sizes it sets are overwritten below
        super().__init__(sizing, layer_number, attn_mask_type, attention_type, attention_dropout=attention_dropout,
                         softmax_scale=softmax_scale, cp_comm_type=cp_comm_type, pg_collection=pg_collection)
        self.config = config
        heads = self.num_attention_heads_per_partition
        self.num_query_groups_per_partition = heads  # MLA expands keys/values to every head
        self.hidden_size_per_attention_head = k_channels
        self.hidden_size_per_partition = v_channels * heads  # output [s, b, heads * v_channels]

    def forward(self, query, key, value, *args, **kwargs):
        # under THD megatron's MLA pads the values to the query/key head dim and slices the output back
        self.hidden_size_per_partition = value.shape[-1] * self.num_attention_heads_per_partition
        return super().forward(query, key, value, *args, **kwargs)


def _grouped_mlp_experts():
    """megatron's ``TEGroupedMLP`` over the stand-in grouped linears, in the form this megatron-core builds experts
    from: a ``ModuleSpec`` (0.16) or a builder, ``partial(TEGroupedMLP, submodules=GroupedMLPSubmodules(...))``
    (0.19)."""
    try:
        from megatron.core.transformer.moe.experts import GroupedMLPSubmodules
    except ImportError:  # megatron-core 0.16
        return ModuleSpec(module=TEGroupedMLP,
                          submodules=MLPSubmodules(linear_fc1=ColumnParallelGroupedLinear,
                                                   linear_fc2=RowParallelGroupedLinear))
    return partial(TEGroupedMLP, submodules=GroupedMLPSubmodules(linear_fc1=ColumnParallelGroupedLinear,
                                                                 linear_fc2=RowParallelGroupedLinear))


def _submodules(spec):
    """The submodules of a ``ModuleSpec`` or, from megatron-core 0.19 on, of a builder ``partial(cls, submodules=...)``."""
    if isinstance(spec, partial):
        return spec.keywords.get('submodules')
    return getattr(spec, 'submodules', None)


def localize_te_specs(block_spec, config=None) -> None:
    """Point the MoE experts and MLA core attention of a local-spec block at the stand-ins above (in place). Without a
    Q LoRA, MLA's local-spec ``q_layernorm`` is unused (0.16) or refused (0.19: "non-trivial, but q_lora_rank is
    None"): it becomes ``IdentityOp``, as TE's spec has it."""
    for layer_spec in block_spec.layer_specs:
        sub = layer_spec.submodules
        mlp_sub = _submodules(getattr(sub, 'mlp', None))
        if isinstance(mlp_sub, MoESubmodules):
            # the bridge maps experts to TEGroupedMLP's linear_fc{1,2}.weight{i}, whatever moe_grouped_gemm says
            mlp_sub.experts = _grouped_mlp_experts()
        attn_sub = _submodules(getattr(sub, 'self_attention', None))
        if isinstance(attn_sub, MLASelfAttentionSubmodules):
            attn_sub.core_attention = MLACoreAttention
            if config is not None and getattr(config, 'q_lora_rank', None) is None:
                attn_sub.q_layernorm = IdentityOp
