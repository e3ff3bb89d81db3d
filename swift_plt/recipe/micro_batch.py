"""The stages' micro-batch sizes (pure: no torch, no ms-swift). The training math depends on the global batch only,
so the recipe may choose the micro-batch size freely:

* ``fitting_micro_batch``: a stage whose global batch splits over the data-parallel ranks but not into micro batches
  of the asked size gets a smaller one (rather than fewer GPUs);
* ``pick_stage1_micro_batch``: the patch stage gets the largest one its GPU memory holds. A stage-1 sequence is T
  positions like a stage-2 sequence (the same transformer activations), but the PLT loss at K > 1 keeps far less per
  position than stock cross entropy over the vocabulary, so stage 1 fits more sequences than stage 2.

Memory estimate per GPU = static + micro-batch size x activations per sequence.
* Static: bf16 weights 2 + fp32 main grads 4 + Adam's fp32 master copy, m and v 12 = 18 bytes per parameter, the 12
  sharded over the data-parallel ranks by the distributed optimizer (ms-swift's default), split by TP·PP (experts:
  also by EP).
* Activations: the tensors saved for backward per token and layer with flash/fused attention (Korthikanti et al.,
  2022, without the attention scores): two norms' input and output 4h, q + k + v + attention output, the MLP's fc1
  output + activation 3f (an MoE layer: its routed copies top-k x (2h + 3 f_expert), shared experts, router), times
  TRANSFORMER_CALIBRATION; plus, per position and vocabulary entry, the output: stock K=1 keeps the logits and an
  fp32 softmax and working copy in the fused cross entropy (dtype + 8 bytes), the fused PLT loss at K > 1 only the
  logits (it writes their gradient in place).
* Calibration (one H100 80GB, Llama-3.2-1B config, bf16, fused attention, MBS 8, T=2048 positions, packing; peak
  allocated): stock K=1 58.2 GiB (estimate 60.6, +4.2 %), PLT K=4 44.9 GiB (estimate 45.0, +0.2 %); PLT K=4 at
  MBS 16 67.8 GiB (estimate 69.2, +2.1 %; ran, and 5 % faster than MBS 8); checked by tests/recipe/test_micro_batch.py.
"""
from dataclasses import dataclass, field
from typing import List, Mapping, Optional, Sequence, Tuple

from swift_plt.recipe.process import flag_bool, flag_int, flag_value

STAGE1_MICRO_BATCH = ('auto', 'keep')  # the first is the default
SAFETY = 0.9  # of the GPU's total memory: the CUDA context, the allocator's cache and what the estimate leaves out
# the transformer's saved tensors counted above miss ~10 % (softmax statistics, norm statistics, RoPE and embedding
# temporaries): fitted to the PLT K=4 point above, where the output part is small
TRANSFORMER_CALIBRATION = 1.1
STOCK_LOSS_EXTRA_BYTES = 8  # per logit at K=1 on top of the logits: fp32 softmax + fp32 working copy (fused CE)
FULL_RECOMPUTE = ('--recompute_granularity', 'full', '--recompute_method', 'uniform', '--recompute_num_layers', '1')
NO_RECOMPUTE = ('--recompute_granularity', 'none')
GIB = 2**30
# per GPU, what stage 2's process holds while it waits beside stage 1 (early_start.py): its CUDA context and NCCL
# buffers, 1.15 GiB measured on an H100 (1B Llama config), rounded up
EARLY_STAGE2_BYTES = int(1.5 * GIB)
# stage 1 runs close to the memory limit: the allocator's expandable segments keep fragmentation from breaking it (an
# early-start run at MBS 16 failed with 7.9 GiB reserved but unallocated; upstream's default otherwise)
STAGE1_ALLOC_CONF = {'PYTORCH_CUDA_ALLOC_CONF': 'expandable_segments:True'}


def _first(config: Mapping, *keys, default=None):
    return next((config[k] for k in keys if config.get(k) is not None), default)


@dataclass(frozen=True)
class ModelShape:
    """What the memory estimate needs from a HF config.json."""
    hidden: int
    vocab: int
    heads: int
    attention: int  # activation elements per token of q + k + v + attention output (full width, before TP)
    mlp: Tuple[int, ...]  # per layer: MLP activation elements per token (before TP), router included
    layer_params: int  # all decoder layers
    expert_params: int  # of which routed experts (split by expert parallelism)
    tied: bool

    @property
    def layers(self) -> int:
        return len(self.mlp)

    @property
    def params(self) -> int:
        return self.layer_params + self.vocab * self.hidden * (1 if self.tied else 2)

    @classmethod
    def from_config(cls, config: Mapping) -> 'ModelShape':
        """ValueError naming what is missing when config.json lacks a key the estimate needs."""
        try:
            return cls._from_config(config)
        except KeyError as e:
            raise ValueError(f'config.json has no {e.args[0]}') from None
        except (TypeError, ValueError) as e:
            raise ValueError(f'config.json: {e}') from None

    @classmethod
    def _from_config(cls, config: Mapping) -> 'ModelShape':
        missing = [k for k in ('hidden_size', 'num_hidden_layers', 'num_attention_heads', 'vocab_size')
                   if not config.get(k)]
        if missing:
            raise KeyError(', '.join(missing))
        h, layers, nh, vocab = (int(config[k]) for k in ('hidden_size', 'num_hidden_layers', 'num_attention_heads',
                                                        'vocab_size'))
        if config.get('kv_lora_rank'):  # MLA: per-head q/k of nope + rope dims, v of v_head_dim, from latent ranks
            nope, rope, vd = (int(config[k]) for k in ('qk_nope_head_dim', 'qk_rope_head_dim', 'v_head_dim'))
            q_lora, kv_lora = config.get('q_lora_rank'), int(config['kv_lora_rank'])
            attention = nh * (2 * (nope + rope) + 2 * vd)
            q_params = h * q_lora + q_lora * nh * (nope + rope) if q_lora else h * nh * (nope + rope)
            attn_params = q_params + h * (kv_lora + rope) + kv_lora * nh * (nope + vd) + nh * vd * h
        else:
            hd = int(config.get('head_dim') or h // nh)
            kv = int(config.get('num_key_value_heads') or nh) * hd
            attention = 2 * nh * hd + 2 * kv
            attn_params = h * (2 * nh * hd + 2 * kv)
        f = int(config.get('intermediate_size') or 0)
        experts = int(_first(config, 'num_experts', 'n_routed_experts', 'num_local_experts', 'moe_num_experts',
                             default=0))
        dense_layer = (3 * f, 3 * h * f)  # (activations, params): fc1 (gate, up) output + activation output
        if not experts:
            if not f:
                raise KeyError('intermediate_size')
            kinds = [dense_layer] * layers
            expert_params = 0
        else:  # every layer after the first dense ones is taken as MoE (at least as large: conservative)
            top_k = int(_first(config, 'num_experts_per_tok', 'moe_k', default=1))
            fe = int(_first(config, 'moe_intermediate_size', 'intermediate_size'))
            shared = int(config.get('shared_expert_intermediate_size') or
                         int(_first(config, 'n_shared_experts', 'moe_num_shared_experts', default=0)) * fe)
            moe_layer = (top_k * (2 * h + 3 * fe) + 3 * shared + 2 * experts,  # routed copies in and out, fp32 router
                         3 * h * (experts * fe + shared) + h * experts)
            dense = min(int(_first(config, 'first_k_dense_replace', 'moe_layer_start_index', default=0)), layers)
            kinds = [dense_layer] * dense + [moe_layer] * (layers - dense)
            expert_params = (layers - dense) * 3 * h * experts * fe
        return cls(hidden=h, vocab=vocab, heads=nh, attention=attention, mlp=tuple(a for a, _ in kinds),
                   layer_params=sum(attn_params + p + 2 * h for _, p in kinds), expert_params=expert_params,
                   tied=bool(config.get('tie_word_embeddings', False)))


@dataclass(frozen=True)
class Recompute:
    granularity: Optional[str] = None  # None, 'selective' or 'full'
    method: Optional[str] = None
    num_layers: Optional[int] = None
    given: bool = False  # on the command line (else ms-swift's default, selective core_attn)


NONE = Recompute()
FULL = Recompute('full', 'uniform', 1, True)


@dataclass(frozen=True)
class Layout:
    """The flags of a `megatron pt` command line the estimate depends on, with ms-swift's defaults."""
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    sequence_parallel: bool = False
    distributed_optimizer: bool = True  # ms-swift's default (megatron_args.py)
    dtype_bytes: int = 2
    flash: bool = True  # flash / fused attention: no attention scores kept
    recompute: Recompute = field(default_factory=lambda: Recompute('selective'))

    @classmethod
    def from_argv(cls, argv: Sequence[str], config: Optional[Mapping] = None) -> 'Layout':
        dtype = flag_value(argv, 'torch_dtype') or _first(config or {}, 'torch_dtype', 'dtype', default='bfloat16')
        granularity = flag_value(argv, 'recompute_granularity')
        recompute = Recompute('selective')  # ms-swift's default
        if granularity is not None:
            recompute = Recompute(None if granularity == 'none' else granularity, flag_value(argv, 'recompute_method'),
                                  flag_int(argv, 'recompute_num_layers', None), True)
        return cls(tp=flag_int(argv, 'tensor_model_parallel_size'), pp=flag_int(argv, 'pipeline_model_parallel_size'),
                   cp=flag_int(argv, 'context_parallel_size'), ep=flag_int(argv, 'expert_model_parallel_size'),
                   sequence_parallel=flag_bool(argv, 'sequence_parallel', False),
                   distributed_optimizer=flag_bool(argv, 'use_distributed_optimizer', True),
                   dtype_bytes=4 if str(dtype) in ('float32', 'fp32') else 2,
                   flash=(flag_value(argv, 'attention_backend') or 'flash') not in ('unfused', 'local'),
                   recompute=recompute)


def static_bytes(shape: ModelShape, layout: Layout, dp: int) -> float:
    """Weights, fp32 main grads and Adam state (fp32 master copy when training in 16 bit, m, v) on one GPU; the
    distributed optimizer shards the Adam state over the data-parallel (x context-parallel) ranks."""
    t = layout
    vocab_copies = 1 if shape.tied or t.pp > 1 else 2  # untied: embedding and output layer (one per PP stage)
    dense = ((shape.layer_params - shape.expert_params) / (t.tp * t.pp) +
             vocab_copies * shape.vocab * shape.hidden / t.tp)
    experts = shape.expert_params / (t.tp * t.ep * t.pp)
    adam = (4 if t.dtype_bytes < 4 else 0) + 8
    shards, expert_shards = (dp * t.cp, max(1, dp * t.cp // t.ep)) if t.distributed_optimizer else (1, 1)
    per_param = t.dtype_bytes + 4
    return dense * (per_param + adam / shards) + experts * (per_param + adam / expert_shards)


def activation_bytes(shape: ModelShape, layout: Layout, positions: int, patch_size: int,
                     recompute: Optional[Recompute] = None) -> float:
    """Activations of one sequence of ``positions`` model positions on one GPU, kept for backward at the peak."""
    t = layout
    recompute = t.recompute if recompute is None else recompute
    tokens = positions / t.cp
    norm_div = t.tp if t.sequence_parallel else 1
    scores = 0 if t.flash or recompute.granularity == 'selective' else 2.5 * shape.heads * tokens  # Korthikanti 5as
    per_layer = [(4 * shape.hidden / norm_div + (shape.attention + mlp + scores) / t.tp) * TRANSFORMER_CALIBRATION
                 for mlp in shape.mlp]
    if recompute.granularity == 'full':  # each recompute unit keeps its input; backward rebuilds one unit at a time
        n = max(1, min(recompute.num_layers or 1, len(per_layer)))
        layer_input = shape.hidden / norm_div
        if recompute.method == 'block':  # the first n layers recomputed, the rest as usual
            elements = n * layer_input + sum(per_layer[n:]) + max(per_layer[:n])
        else:
            units = [per_layer[i:i + n] for i in range(0, len(per_layer), n)]
            elements = len(units) * layer_input + max(sum(u) for u in units)
    else:
        elements = sum(per_layer)
    per_logit = t.dtype_bytes + (STOCK_LOSS_EXTRA_BYTES if patch_size == 1 else 0)
    return tokens * (elements * t.dtype_bytes + shape.vocab / t.tp * per_logit)


def estimate_bytes(shape: ModelShape, layout: Layout, positions: int, patch_size: int, micro_batch: int, dp: int,
                   recompute: Optional[Recompute] = None) -> float:
    """Peak memory of one GPU: static + micro batch x activations per sequence."""
    return static_bytes(shape, layout, dp) + micro_batch * activation_bytes(shape, layout, positions, patch_size,
                                                                           recompute)


def divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def fitting_micro_batch(per_rank: int, asked: int) -> int:
    """The largest micro-batch size dividing ``per_rank`` (sequences per rank and step) not above ``asked``."""
    return max(d for d in divisors(per_rank) if d <= max(asked, 1))


def gib(n: float) -> str:
    return f'{n / GIB:.1f} GiB'


@dataclass(frozen=True)
class MicroBatchChoice:
    micro_batch_size: int
    flags: Tuple[str, ...]  # added at the end of stage 1's command (they win)
    reason: str  # one line: the choice and why
    estimate: Optional[float] = None  # bytes per GPU at the choice
    budget: Optional[float] = None


def pick_stage1_micro_batch(shape: ModelShape, layout: Layout, positions: int, patch_size: int, per_rank: int,
                            dp: int, asked: int, total_memory: int, stage2: Optional[Tuple[Layout, int, int]] = None,
                            safety: float = SAFETY, beside: int = 0) -> MicroBatchChoice:
    """Stage 1's micro-batch size (a divisor of ``per_rank``, its sequences per rank and step) and recompute, for a
    GPU of ``total_memory`` bytes, budget ``safety`` of it. In this order:

    1. without recompute, the largest that fits, if not below ``asked`` (the size stage 1 would run otherwise);
       a recompute of both stages (``--recompute_granularity``) is dropped for stage 1: it is only slower there;
    2. with the stage's own recompute setting, the largest that fits (below ``asked``: a smaller micro batch);
    3. full recompute (uniform, 1 layer) at the largest that fits, at least 1.

    ``stage2``: (layout, micro-batch size, data-parallel size) of stage 2, whose estimate the reason reports;
    ``beside``: bytes another process holds on the GPU meanwhile (stage 2 started early), off the budget."""
    budget = safety * total_memory - beside
    base = layout.recompute

    def est(mbs, rc):
        return estimate_bytes(shape, layout, positions, patch_size, mbs, dp, rc)

    def best(rc):
        return max([d for d in divisors(per_rank) if est(d, rc) <= budget], default=0)

    d = best(NONE)
    if d >= asked:
        mbs, rc = d, NONE
        rc_flags = list(NO_RECOMPUTE) if base.given and base.granularity else []
        how = 'the largest that fits' + (f'; the --recompute_granularity {base.granularity} of both stages is dropped: '
                                         'stage 1 fits without it' if rc_flags else '')
    elif best(base):
        mbs, rc, rc_flags = best(base), base, []
        how = (f'--micro_batch_size {asked} does not fit: est. {gib(est(asked, base))}' if mbs < asked else
               f'the largest that fits with the --recompute_granularity {base.granularity} of both stages')
    else:
        mbs, rc, rc_flags = max(best(FULL), 1), FULL, list(FULL_RECOMPUTE)
        how = (f'without recompute --micro_batch_size 1 needs est. {gib(est(1, NONE))}' +
               ('' if est(mbs, FULL) <= budget else '; it may still not fit: more data-parallel GPUs (distributed '
                'optimizer) or tensor/pipeline parallelism lower it'))
    flags = ['--micro_batch_size', str(mbs), *rc_flags]
    estimate = est(mbs, rc)
    other = ''
    if stage2 is not None:
        layout2, mbs2, dp2 = stage2
        other = (f'; stage 2 (K=1) at --micro_batch_size {mbs2}: est. '
                 f'{gib(estimate_bytes(shape, layout2, positions, 1, mbs2, dp2))}')
    less = f' less {gib(beside)} for stage 2 started beside it' if beside else ''
    reason = (f'stage 1: {" ".join(flags)} ({how}; est. {gib(estimate)} of {gib(total_memory)} (budget '
              f'{safety:.0%}{less}) at K={patch_size}{other}; to choose: --stage1_args "--micro_batch_size N" or '
              '--stage1_micro_batch keep)')
    return MicroBatchChoice(mbs, tuple(flags), reason, estimate, budget)
