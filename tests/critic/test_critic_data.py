"""Critic rows through the real ms-swift template + collator (swift_plt/plugin/patches/swift_template.py): returns land on exactly
the tokens ms-swift trains on, padded and padding-free layouts match input_ids/labels, bad rows fail at encode time,
and templates of other runs are untouched (patched vs original)."""
import copy

import pytest
import torch

from harness.tiny import make_tiny_llama

IGN = -100


@pytest.fixture(scope='module')
def template(tmp_path_factory):
    model_dir = make_tiny_llama(str(tmp_path_factory.mktemp('tiny')))
    from swift.model import get_model_processor
    from swift.template import get_template
    _, processor = get_model_processor(model_dir, model_type='llama', load_model=False, download_model=False)
    tpl = get_template(processor, template_type='chatml', max_length=256, remove_unused_columns=False)
    tpl.set_mode('train')
    tpl.use_megatron = True
    return tpl


def chat(response, **fields):
    return {'messages': [{'role': 'user', 'content': 'How far is it to the harbour?'},
                         {'role': 'assistant', 'content': response}], **fields}


def critic(template, clipped=False):
    tpl = copy.copy(template)
    tpl.critic_clipped = clipped
    return tpl


def test_reward_row_returns_on_labelled_tokens(template):
    e = critic(template).encode(chat('the red door', reward=0.75))
    assert len(e['returns']) == len(e['input_ids']) == len(e['labels'])
    for y, r in zip(e['labels'], e['returns']):
        assert r == (0.75 if y != IGN else 0.0)
    assert 'reward' not in (e.get('_extra_kwargs') or {})  # consumed, not collated again as a row field


def test_token_id_response_with_add_eos_false_is_exactly_the_response(template):
    ids = [300, 301, 302, 303]
    e = critic(template, clipped=True).encode(
        chat({'token_ids': ids}, add_eos=False, returns=[1.0, 2.0, 3.0, 4.0], old_values=[0.5, 0.5, 0.5, 0.5]))
    assert e['input_ids'][-4:] == ids and e['labels'][-4:] == ids and set(e['labels'][:-4]) == {IGN}
    assert e['returns'][-4:] == [1.0, 2.0, 3.0, 4.0] and set(e['returns'][:-4]) == {0.0}
    assert e['old_values'][-4:] == [0.5] * 4


IDS3 = {'token_ids': [300, 301, 302]}


@pytest.mark.parametrize('row, clipped, message', [
    (chat('the red door'), False, 'neither "returns"'),
    (chat(IDS3, add_eos=False, returns=[1.0, 2.0]), False, '"returns" has 2 values but the response has 3'),
    (chat(IDS3, add_eos=False, reward=1.0), True, 'needs "old_values"'),
    (chat(IDS3, add_eos=False, reward=1.0, old_values=[0.0] * 4), True, '"old_values" has 4 values'),
    (chat(IDS3, add_eos=False, reward=1.0, old_values=[0.0] * 3), False, 'only the PPO clipped value loss uses'),
])
def test_bad_rows_fail_at_encode(template, row, clipped, message):
    from swift_plt.critic.data import CriticDataError
    with pytest.raises(CriticDataError, match=message):
        critic(template, clipped).encode(row)


@pytest.mark.parametrize('padding_free', [False, True])
def test_collated_returns_follow_labels(template, padding_free):
    tpl = critic(template, clipped=True)
    tpl.padding_free = padding_free
    rows = [chat('the red door', reward=1.5), chat({'token_ids': [300, 301]}, add_eos=False, returns=[2.0, 3.0])]
    n1 = sum(y != IGN for y in critic(template).encode(rows[0])['labels'])  # response length of the text row
    encoded = [tpl.encode(dict(rows[0], old_values=[0.25] * n1), return_length=True),
               tpl.encode(dict(rows[1], old_values=[0.5, 0.5]), return_length=True)]
    batch = tpl.data_collator(copy.deepcopy(encoded), padding_to=8)
    labels = batch['labels']
    assert batch['returns'].shape == labels.shape == batch['input_ids'].shape
    assert batch['returns'].dtype == torch.float32
    assert labels.shape[-1] % 8 == 0
    assert torch.equal(batch['returns'] != 0, labels != IGN)
    assert torch.equal(batch['old_values'] != 0, labels != IGN)
    flat = batch['returns'][labels != IGN].tolist()
    assert flat == [1.5] * n1 + [2.0, 3.0]


def test_other_templates_untouched(template):
    """No critic attribute: _encode_truncated and _data_collator return exactly upstream's result."""
    from swift.template.base import Template
    rows = [chat('the red door', reward=1.0), chat('seven apples and a basket of bread')]
    for padding_free in (False, True):
        tpl = copy.copy(template)
        tpl.padding_free = padding_free
        got = [tpl.encode(copy.deepcopy(r), return_length=True) for r in rows]
        assert all('returns' not in e for e in got)
        patched = tpl.data_collator(copy.deepcopy(got), padding_to=4)
        tpl._data_collator = Template._data_collator.__wrapped__.__get__(tpl)  # the original
        original = tpl.data_collator(copy.deepcopy(got), padding_to=4)
        assert patched.keys() == original.keys()
        for k in patched:
            a, b = patched[k], original[k]
            assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, k
