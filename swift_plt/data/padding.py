"""Encoded documents at patch size K: text only, padded to a multiple of K (or of 2*CP*K under context parallel)."""
from swift_plt.patch_level import IGNORE_INDEX
from swift_plt.patch_level.layout import mask_first_patch_of_document, pad_to_multiple


def pad_encoded(encoded: dict, patch_size: int, pad_token_id: int) -> dict:
    """An encoded document at patch size K: its first patch's labels -100 (nothing predicts them), then padded to a
    multiple of K, so that no patch straddles two documents and every count of labels != -100 is the PLT loss's."""
    if encoded.get('labels') is not None:
        encoded['labels'] = mask_first_patch_of_document(encoded['labels'], patch_size)
    return pad_encoded_to(encoded, patch_size, pad_token_id)


def pad_encoded_to(encoded: dict, multiple: int, pad_token_id: int) -> dict:
    """Pad an encoded document (input_ids with the pad token, labels -100, loss_scale 0, length) to a multiple of
    ``multiple`` tokens, as upstream's ``Template._handle_megatron_cp`` does for 2*CP."""
    n = pad_to_multiple(len(encoded['input_ids']), multiple)
    if n:
        encoded['input_ids'] = list(encoded['input_ids']) + [pad_token_id] * n
        for key, value in (('labels', IGNORE_INDEX), ('loss_scale', 0)):
            if encoded.get(key) is not None:
                encoded[key] = list(encoded[key]) + [value] * n
        # per-token media type ids of multimodal templates (Qwen3.5's collator adds zeros for a text sample, before
        # the CP padding): padded as upstream pads them, so they keep the length of input_ids (mRoPE's
        # get_rope_index indexes them with the attention mask)
        for key, value in (('mm_token_type_ids', 0), ('image_token_types', -1)):
            if encoded.get(key) is not None:
                encoded[key] = _pad_token_values(encoded[key], n, value)
        if encoded.get('length') is not None:
            encoded['length'] += n
    return encoded


def _pad_token_values(values, n: int, value):
    """``values`` (a list or a 1-d tensor, as the template holds them) with ``n`` more entries ``value``."""
    if isinstance(values, (list, tuple)):
        return list(values) + [value] * n
    import torch.nn.functional as F
    return F.pad(values, (0, n), value=value)


# what a multimodal template puts into an encoded sample with images, video or audio
MEDIA_KEYS = ('pixel_values', 'pixel_values_videos', 'image_grid_thw', 'video_grid_thw', 'input_features')


def check_text_only(encoded: dict, patch_size: int) -> None:
    """Refuse a sample with images, video or audio at K > 1: PLT trains a multimodal checkpoint's language model on
    text only (a patch would pool vision and text embeddings)."""
    media = [key for key in MEDIA_KEYS if encoded.get(key) is not None]
    if media:
        raise ValueError(f'--patch_size {patch_size}: a sample carries {", ".join(media)} (images, video or audio); '
                         'patch-level training trains the language model on text only. Drop the media from the '
                         'dataset, or train this data with --patch_size 1.')
