"""ms-swift ``get_batch_on_this_pp_rank``: at K > 1 no label roll by 1 (PLT labels stay token-aligned), the first
patch of every document -100 and patch alignment checked on the CPU batch; under CP the labels and loss_scale are
rolled by K instead, so targets stay local after the split (docs/parallel-layouts.md#context-parallel).
"""
import functools

from swift_plt.compat.guard import guard
from swift_plt.compat.supported import VERIFIED_STACKS
from swift_plt.compat.versions import check_once
from swift_plt.patch_level.patch_size import patch_size_of

TARGET = 'swift.megatron.trainers.utils'
VERIFIED = f'ms-swift 4.6.0 on {VERIFIED_STACKS}'


class _WithoutLabelRoll:
    """``args`` as upstream sees them: the same, except ``task_type``, which is what gates the roll upstream."""
    task_type = 'causal_lm_plt'

    def __init__(self, args):
        self._args = args

    def __getattr__(self, name):
        return getattr(self._args, name)


def apply(module):
    check_once()
    upstream = guard(module, 'get_batch_on_this_pp_rank', ['args', 'data', 'vp_stage'], VERIFIED)
    if getattr(upstream, '_swift_plt', False):
        return
    # the CP helpers are looked up at call time (the tests' mutations swap them)
    from swift_plt.patch_level import layout as patch_layout
    from swift_plt.patch_level import loss as patch_loss
    from swift_plt.patch_level.layout import check_patch_aligned, mask_first_patch

    @functools.wraps(upstream)
    def get_batch_on_this_pp_rank(args, data, vp_stage=None):
        k = patch_size_of(args)
        if k == 1:
            return upstream(args, data, vp_stage=vp_stage)
        position_ids = data['position_ids']
        check_patch_aligned(position_ids, k)  # multimodal RoPE's [3, B, S] ids too: every row patch-aligned
        # the [B, S] text positions (a multimodal template's, beside its RoPE ids), for the label and CP layout
        if data.get('text_position_ids') is not None:
            position_ids = data['text_position_ids']
        cp = getattr(args, 'context_parallel_size', 1) or 1
        if cp > 1:
            patch_layout.check_cp_patch_layout(position_ids, k, cp, bool(getattr(args, 'padding_free', False)))
        if data.get('labels') is not None:
            data['labels'] = mask_first_patch(data['labels'], position_ids, k)
            if cp > 1:
                data['labels'] = patch_loss.roll_patch_labels(data['labels'], k)
        if cp > 1 and data.get('loss_scale') is not None:
            data['loss_scale'] = patch_loss.roll_patch_labels(data['loss_scale'], k)
        return upstream(_WithoutLabelRoll(args), data, vp_stage=vp_stage)

    get_batch_on_this_pp_rank._swift_plt = True
    module.get_batch_on_this_pp_rank = get_batch_on_this_pp_rank
