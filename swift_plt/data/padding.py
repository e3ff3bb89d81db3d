"""Encoded documents at patch size K: padded to a multiple of K (or of 2*CP*K under context parallel)."""
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
        if encoded.get('length') is not None:
            encoded['length'] += n
    return encoded
