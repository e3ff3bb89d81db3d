"""At K > 1 a sample with images, video or audio is refused when it is encoded, before step 1
(swift_plt.data.padding.check_text_only, called by the template patch for every family; Qwen3.5 trains text only)."""
import pytest

from swift_plt.data.padding import MEDIA_KEYS, check_text_only


@pytest.mark.parametrize('key', MEDIA_KEYS)
def test_a_sample_with_media_is_refused_with_what_to_do(key):
    with pytest.raises(ValueError, match=rf'--patch_size 4: a sample carries {key} .*text only.*--patch_size 1'):
        check_text_only({'input_ids': [1, 2, 3, 4], key: [[0.0]]}, 4)


def test_text_samples_pass():
    check_text_only({'input_ids': [1, 2, 3, 4], 'labels': [1, 2, 3, 4], 'pixel_values': None}, 4)
