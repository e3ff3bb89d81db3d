"""ms-swift ``swift.template.base.Template``: ``_encode_truncated`` and ``_data_collator``.

PLT (``template.plt_patch_size`` K > 1): pad every encoded document (input_ids with the pad token, labels -100,
loss_scale 0) to a multiple of K, so that no patch straddles two documents in padding-free/packed batches and
padded batches hold whole patches; and set the labels of its first patch, which nothing predicts, to -100, so that
every count of `labels != -100` (ms-swift's per-token normalisation on both backends, the HF trainer's
`num_items_in_batch`) counts exactly the tokens that carry a PLT loss. Runs before packing, so packed lengths include
the padding. ``--max_length`` is required to be a multiple of K, so padding never exceeds it.

Critic (``template.critic_clipped`` not None, set for --model_type llama3_2_critic): the row's "returns"/"reward"/
"old_values" become token-aligned float lists next to ``labels`` (swift_plt.critic.data.encode_targets, which
validates them while the dataset is encoded, before step 1), and the collator lays them out like ``input_ids``
(padded or padding-free; under Megatron context parallel each row is padded to the collator's CP row length,
``Template._get_megatron_cp_length``, before packing, as upstream pads input_ids/labels). Otherwise both methods return upstream's result untouched."""
import functools

from ._guard import check_once, guard

TARGET = 'swift.template.base'
VERIFIED = 'ms-swift 4.6.0'


def pad_encoded(encoded: dict, patch_size: int, pad_token_id: int) -> dict:
    from swift_plt.plt import IGNORE_INDEX, pad_to_multiple
    if encoded.get('labels') is not None:  # the first patch (the model masks it too: swift_plt.plt.mask_first_patch)
        encoded['labels'] = [IGNORE_INDEX] * min(patch_size, len(encoded['labels'])) + list(
            encoded['labels'][patch_size:])
    n = pad_to_multiple(len(encoded['input_ids']), patch_size)
    if n:
        encoded['input_ids'] = list(encoded['input_ids']) + [pad_token_id] * n
        for key, value in (('labels', IGNORE_INDEX), ('loss_scale', 0)):
            if encoded.get(key) is not None:
                encoded[key] = list(encoded[key]) + [value] * n
        if encoded.get('length') is not None:
            encoded['length'] += n
    return encoded


def apply(module):
    check_once()
    cls = module.Template
    upstream = guard(cls, '_encode_truncated', ['self', 'inputs'], VERIFIED)
    upstream_collator = guard(cls, '_data_collator', ['self', 'batch'], VERIFIED)
    guard(cls, '_get_megatron_cp_length', ['self', 'length'], VERIFIED)  # row padding under CP (critic collate)
    if getattr(upstream, '_swift_plt', False):
        return
    from swift_plt.critic.data import TARGET_KEYS, TOKEN_KEYS, collate_token_lists, encode_targets

    @functools.wraps(upstream)
    def _encode_truncated(self, inputs):
        encoded = upstream(self, inputs)
        clipped = getattr(self, 'critic_clipped', None)
        if clipped is not None and self.is_training:
            # consumed here, so they do not also travel as `_extra_kwargs` lists
            row = {k: inputs.extra_kwargs.pop(k, None) for k in TARGET_KEYS}
            for e in encoded if isinstance(encoded, list) else [encoded]:
                encode_targets(e, row, clipped)
        k = getattr(self, 'plt_patch_size', 1)
        if k > 1:
            pad_id = self.tokenizer.pad_token_id
            if pad_id is None:
                pad_id = self.tokenizer.eos_token_id
            for e in encoded if isinstance(encoded, list) else [encoded]:
                pad_encoded(e, k, pad_id)
        return encoded

    _encode_truncated._swift_plt = True
    cls._encode_truncated = _encode_truncated

    @functools.wraps(upstream_collator)
    def _data_collator(self, batch, *, padding_to=None):
        lists = {k: [b.pop(k) for b in batch] for k in TOKEN_KEYS if batch and k in batch[0]}
        res = upstream_collator(self, batch, padding_to=padding_to)
        if lists:
            length = res['input_ids'].shape[-1]
            res.update({
                k: collate_token_lists(v, length, self.padding_free, self._get_megatron_cp_length)
                for k, v in lists.items()
            })
        return res

    _data_collator._swift_plt = True
    cls._data_collator = _data_collator
