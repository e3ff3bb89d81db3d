"""What swift-plt knows of one decoder family: a ``Family`` record (one per HF ``model_type``). Every table the
plugin, the critic, the recipe and the tests read is derived from these records (swift_plt.families.registry)."""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Tuple

# mcore-bridge's default loader and bridge (the `gpt` type's), as ``module:Class`` (resolved lazily: no torch here)
GPT_LOADER = 'mcore_bridge.model.register:ModelLoader'
GPT_BRIDGE = 'mcore_bridge.bridge:GPTBridge'


@dataclass(frozen=True)
class Tiny:
    """The tiny random-init HF model the tests build of a family (swift_plt.tools.tiny_families)."""
    config_cls: str  # transformers config class
    model_cls: str  # transformers model class (``*ForConditionalGeneration``: a multimodal checkpoint)
    kwargs: Dict[str, Any] = field(default_factory=dict)  # config fields on top of the common tiny shape
    core: bool = False  # one of the structures every harness test builds (else built on demand)
    norm_scale: float = 0.0  # RMSNorm weights drawn as 1 + N(0, scale²): a dropped or swapped norm shows
    random_biases: bool = False  # biases drawn as N(0, 0.1²)
    vision: Optional[Dict[str, Any]] = None  # a multimodal checkpoint's vision config (a tower of a few k parameters)


@dataclass(frozen=True)
class Critic:
    """The family's critic model type: the decoder with a ``[1, H]`` value head (swift_plt.critic)."""
    critic_type: str
    template: str  # ms-swift's default template of the family
    model_arch: Optional[str]  # ms-swift's ModelArch (None: as ms-swift registers the family)
    ignored_on_load: Tuple[str, ...] = ()  # regexes of checkpoint keys transformers 5.x ignores on load, 4.57 does not


@dataclass(frozen=True)
class Family:
    """A decoder family PLT trains at K > 1."""
    hf_type: str  # config.json ``model_type``
    mcore_type: str = 'gpt'  # mcore-bridge's model type that builds it (PLT registers ``<mcore_type>_plt``)
    loader: str = GPT_LOADER  # the mcore-bridge loader and bridge swift-plt was verified with (``module:Class``)
    bridge: str = GPT_BRIDGE
    swift_type: Optional[str] = None  # ms-swift's model type of its checkpoints (None: ``hf_type``)
    moe: bool = False
    mla: bool = False  # multi-head latent attention
    linear_attention: bool = False  # Gated-DeltaNet hybrid: a recurrence that must restart per document
    # HF side: ms-swift replaces its Gated DeltaNet for rows of several documents (swift.model.models.qwen): fla's
    # convolution and recurrence restart per document (without it, packed rows are refused at K > 1)
    hf_packed_rows_with_fla: bool = False
    attention_sinks: bool = False  # learned per-head logits in the softmax
    text_only_multimodal: bool = False  # a multimodal checkpoint whose language model PLT trains on text
    hf_side_refusal: Optional[str] = None  # why the HF backend (``swift pt/sft``) refuses it at K > 1
    default_topk_method: Optional[str] = None  # transformers' topk_method where config.json names none
    critic: Optional[Critic] = None
    no_critic: Optional[str] = None  # why ``<hf_type>_critic`` does not exist (refused by name, with what to use)
    tiny: Optional[Tiny] = None
    # upstream differences (stock Megatron vs transformers) only this family has: ``check(config, model_type)``
    upstream_checks: Tuple[Callable, ...] = ()
    note: str = ''  # what PLT has to get right beyond its structure

    @property
    def structure(self) -> str:
        """'dense', 'moe', 'mla+moe', 'hybrid' or 'hybrid+moe': the structure the CPU tests cover."""
        base = 'hybrid' if self.linear_attention else 'mla' if self.mla else ''
        return '+'.join(p for p in (base, 'moe' if self.moe else '') if p) or 'dense'

    @property
    def ms_swift_type(self) -> str:
        return self.swift_type or self.hf_type


@dataclass(frozen=True)
class Refused:
    """A model type mcore-bridge builds that PLT refuses at K > 1, and why (its HF ``model_type`` is the same name)."""
    model_type: str
    reason: str
    mcore_type: str = ''  # '' : mcore-bridge builds it with a type of its own name; 'gpt': as `gpt`
    # registered by mcore-bridge only with some megatron-core versions (models.hybrid)
    conditional: bool = False

# shapes of the tiny models shared by several families (on top of tools/tiny_families' common shape)
TINY_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1)
# a vision tower of a few thousand parameters (Qwen-VL's vision config keys)
TINY_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
                   num_position_embeddings=64)
# the Gated-DeltaNet hybrids: 3 linear-attention layers, then 1 gated full-attention layer
TINY_HYBRID = dict(num_hidden_layers=4, full_attention_interval=4, head_dim=32, partial_rotary_factor=0.25,
                   linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                   linear_num_value_heads=4)
