"""ms-swift ``Template``. ``_encode_truncated``: at K > 1 a sample with media refused, every document padded to a
multiple of K (padding-free under CP: 2*CP*K) with its first patch -100; critic row targets encoded.
``_handle_megatron_cp`` / ``_get_megatron_cp_length``: CP padding 2*CP*K instead of 2*CP. ``_data_collator``: CP tail
positions restart every 2*CP*K; critic targets collated like input_ids (docs/parallel-layouts.md#context-parallel,
docs/critic_training.md). ``_get_model``: a plugin model type's meta-device model built by its type.
"""
import functools

from swift_plt.compat.guard import guard
from swift_plt.compat.supported import VERIFIED_STACKS
from swift_plt.compat.versions import check_once
from swift_plt.patch_level.patch_size import patch_size_of

TARGET = 'swift.template.base'
VERIFIED = f'ms-swift 4.6.0 on {VERIFIED_STACKS}'


def _plt_cp(template) -> int:
    """2*CP*K when the template collates PLT batches for Megatron context parallel, else 0."""
    from swift_plt.patch_level.layout import cp_multiple
    k = patch_size_of(template)
    cp = getattr(template, 'sequence_parallel_size', 1) or 1
    if k > 1 and cp > 1 and getattr(template, 'use_megatron', False):
        return cp_multiple(k, cp)
    return 0


def apply(module):
    check_once()
    cls = module.Template
    upstream = guard(cls, '_encode_truncated', ['self', 'inputs'], VERIFIED)
    upstream_collator = guard(cls, '_data_collator', ['self', 'batch'], VERIFIED)
    upstream_cp_length = guard(cls, '_get_megatron_cp_length', ['self', 'length'], VERIFIED)  # row padding under CP
    upstream_handle_cp = guard(cls, '_handle_megatron_cp', ['self', 'batch'], VERIFIED)
    upstream_get_model = guard(cls, '_get_model', ['self'], VERIFIED)
    if getattr(upstream, '_swift_plt', False):
        return
    from swift_plt.critic.data import TARGET_KEYS, TOKEN_KEYS, collate_token_lists, encode_targets
    from swift_plt.data.padding import check_text_only, pad_encoded, pad_encoded_to

    @functools.wraps(upstream)
    def _encode_truncated(self, inputs):
        encoded = upstream(self, inputs)
        clipped = getattr(self, 'critic_clipped', None)
        if clipped is not None and self.is_training:
            # consumed here, so they do not also travel as `_extra_kwargs` lists
            row = {k: inputs.extra_kwargs.pop(k, None) for k in TARGET_KEYS}
            for e in encoded if isinstance(encoded, list) else [encoded]:
                encode_targets(e, row, clipped)
        k = patch_size_of(self)
        if k > 1:
            pad_id = self.tokenizer.pad_token_id
            if pad_id is None:
                pad_id = self.tokenizer.eos_token_id
            m = _plt_cp(self) if self.padding_free else 0  # padded batches: the collator pads each row
            for e in encoded if isinstance(encoded, list) else [encoded]:
                check_text_only(e, k)
                pad_encoded(e, k, pad_id)  # before packing; --max_length is a multiple of K, so never past it
                if m:  # the collator's CP padding, done here so that `length` (packing's bin size) counts it
                    pad_encoded_to(e, m, pad_id)
        return encoded

    _encode_truncated._swift_plt = True
    cls._encode_truncated = _encode_truncated

    @functools.wraps(upstream_cp_length)
    def _get_megatron_cp_length(self, length):
        m = _plt_cp(self)
        return upstream_cp_length(self, length) if not m else -(-length // m) * m

    _get_megatron_cp_length._swift_plt = True
    cls._get_megatron_cp_length = _get_megatron_cp_length

    @functools.wraps(upstream_handle_cp)
    def _handle_megatron_cp(self, batch):
        m = _plt_cp(self)
        if m:
            pad_id = self.tokenizer.pad_token_id
            for encoded in batch:
                pad_encoded_to(encoded, m, pad_id)
        return upstream_handle_cp(self, batch)  # then a no-op padding: already a multiple of 2*CP

    _handle_megatron_cp._swift_plt = True
    cls._handle_megatron_cp = _handle_megatron_cp

    @functools.wraps(upstream_collator)
    def _data_collator(self, batch, *, padding_to=None):
        lists = {k: [b.pop(k) for b in batch] for k in TOKEN_KEYS if batch and k in batch[0]}
        m = _plt_cp(self) if self.padding_free else 0
        if m:  # the documents' length once padded (by _handle_megatron_cp, inside the upstream collator)
            content = sum(self._get_megatron_cp_length(len(b['input_ids'])) for b in batch)
        res = upstream_collator(self, batch, padding_to=padding_to)
        if m:
            _plt_cp_tail_positions(res, content, m)
        if lists:
            length = res['input_ids'].shape[-1]
            res.update({
                k: collate_token_lists(v, length, self.padding_free, self._get_megatron_cp_length)
                for k, v in lists.items()
            })
        return res

    _data_collator._swift_plt = True
    cls._data_collator = _data_collator

    @functools.wraps(upstream_get_model)
    def _get_model(self):
        if self.model is None and self.dummy_model is None:
            self.dummy_model = plugin_dummy_model(self.model_info)
        return upstream_get_model(self)

    cls._get_model = _get_model


def plugin_dummy_model(model_info):
    """The meta-device model a multimodal template reads (Qwen3.5's rope index) for a plugin model type (a critic):
    upstream builds it from the dir's ``architectures``, which the plugin's types do not match (swift_model.py); so
    name the type. None for any other type (upstream's way)."""
    from swift_plt.plugin.register import plugin_model_types
    if getattr(model_info, 'model_type', None) not in plugin_model_types():
        return None
    import torch
    from swift.model import get_model_processor
    with torch.device('meta'):
        return get_model_processor(model_info.model_dir, model_type=model_info.model_type, return_dummy_model=True)[0]


def _plt_cp_tail_positions(res: dict, content: int, multiple: int) -> None:
    """Padding-free batch under CP at K > 1: position ids of the padding after the documents restart every
    ``multiple`` (2*CP*K) tokens, not every 2*CP, so each padding document is whole patches and splits like one."""
    import torch
    pos = res['position_ids']
    tail = pos.shape[-1] - content
    if tail <= 0:
        return
    if tail % multiple:
        raise ValueError(f'PLT with context parallel: the padding-free batch ends with {tail} padding tokens, not a '
                         f'multiple of 2 x context_parallel_size x patch_size = {multiple} (padding_to should be a '
                         'multiple of it; report this with your command line).')
    pos = pos.clone()
    pos[..., content:] = torch.arange(multiple, dtype=pos.dtype).repeat(tail // multiple)
    res['position_ids'] = pos
