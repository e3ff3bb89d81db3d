"""The HF-side PLT model (swift_plt.models.hf_llama.PLTLlamaForCausalLM) on CPU, fp32: K=1 is LlamaForCausalLM bit
for bit; K>1 packed rows (padding-free, positions restarting per document) = the same documents one per row;
generate() refuses at K>1; checkpoints are saved as a plain Llama. (Its loss against the brute-force PatchTrain
formula and against the Megatron model: tests/models/test_plt_model_cpu.py::test_backend_parity_*.)"""
import json
import os

import pytest
import torch

from harness.tiny import make_tiny_llama

VOCAB = 512


@pytest.fixture(scope='module')
def hf_dir(tmp_path_factory):
    return make_tiny_llama(str(tmp_path_factory.mktemp('tiny')), vocab_size=VOCAB)


def load(hf_dir, k, cls=None):
    from transformers import AutoConfig

    from swift_plt.models.hf_llama import PLTLlamaForCausalLM
    config = AutoConfig.from_pretrained(hf_dir)
    config.patch_size = k
    return (cls or PLTLlamaForCausalLM).from_pretrained(hf_dir, config=config, dtype=torch.float32)


def random_batch(seed=0, B=2, S=24, pad_from=16):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, VOCAB, (B, S), generator=g)
    mask = torch.ones(B, S, dtype=torch.long)
    mask[1, pad_from:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[torch.rand(B, S, generator=g) < 0.2] = -100
    return ids, mask, labels


def test_k1_is_llama_bit_for_bit(hf_dir):
    from transformers import LlamaForCausalLM
    ids, mask, labels = random_batch()
    outs = []
    for cls in (None, LlamaForCausalLM):
        model = load(hf_dir, 1, cls)
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        outs.append((out.logits.detach(), out.loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (lg, ls, gr), (lg0, ls0, gr0) = outs
    assert torch.equal(lg, lg0) and torch.equal(ls, ls0)
    assert gr.keys() == gr0.keys() and all(torch.equal(gr[n], gr0[n]) for n in gr)
    g = torch.Generator().manual_seed(1)
    model = load(hf_dir, 1)
    ref = LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    prompt = torch.randint(4, VOCAB, (1, 5), generator=g)
    assert torch.equal(model.generate(prompt, max_new_tokens=4, do_sample=False),
                       ref.generate(prompt, max_new_tokens=4, do_sample=False))


def test_packed_rows_equal_separate_rows(hf_dir):
    """Padding-free/packed batch ([1, S] with position_ids restarting at 0 per document, no attention mask): the
    loss sum and each document's logits equal those of the documents run one per row."""
    k = 4
    model = load(hf_dir, k)
    g = torch.Generator().manual_seed(2)
    docs = [torch.randint(4, VOCAB, (n, ), generator=g) for n in (12, 20, 8)]
    packed_ids = torch.cat(docs)[None]
    position_ids = torch.cat([torch.arange(len(d)) for d in docs])[None]
    with torch.no_grad():
        packed = model(input_ids=packed_ids, position_ids=position_ids, labels=packed_ids)
        count = sum(len(d) - k for d in docs)
        total, start = 0.0, 0
        for d in docs:
            one = model(input_ids=d[None], labels=d[None])
            total += float(one.loss) * (len(d) - k)
            p0, p1 = start // k, (start + len(d)) // k
            torch.testing.assert_close(packed.logits[0, p0:p1], one.logits[0], rtol=1e-5, atol=1e-5)
            start += len(d)
    assert float(packed.loss) == pytest.approx(total / count, rel=1e-5)


def test_num_items_in_batch_and_bad_lengths(hf_dir):
    k = 4
    model = load(hf_dir, k)
    ids, mask, labels = random_batch()
    with torch.no_grad():
        mean = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        total = model(input_ids=ids, attention_mask=mask, labels=labels, num_items_in_batch=1).loss
        from swift_plt.patch_level.layout import mask_first_patch
        count = (mask_first_patch(labels, torch.arange(ids.shape[1]).expand_as(ids), k) != -100).sum()
        assert float(total) == pytest.approx(float(mean) * int(count), rel=1e-6)
        with pytest.raises(ValueError, match='not a multiple of patch_size 4'):
            model(input_ids=ids[:, :22])
        with pytest.raises(ValueError, match='straddles two documents'):
            model(input_ids=ids[:, :8], position_ids=torch.tensor([[0, 1, 2, 3, 4, 5, 0, 1]] * 2))


def test_generate_refuses_at_k_gt_1(hf_dir):
    model = load(hf_dir, 4)
    with pytest.raises(NotImplementedError, match=r'patch_size=4: .* does not generate token by token.*plain model \(LlamaForCausalLM'):
        model.generate(torch.tensor([[5, 6, 7, 8]]), max_new_tokens=2)
    with pytest.raises(NotImplementedError, match='does not generate token by token'):
        model(input_ids=torch.tensor([[5, 6, 7, 8]]), use_cache=True)


def test_saved_as_plain_llama(hf_dir, tmp_path):
    from transformers import AutoModelForCausalLM, LlamaForCausalLM
    from safetensors.torch import load_file
    model = load(hf_dir, 4)
    model.save_pretrained(tmp_path)
    assert model.config.patch_size == 4  # the live model keeps training at K
    with open(tmp_path / 'config.json') as f:
        config = json.load(f)
    assert config['architectures'] == ['LlamaForCausalLM'] and config['model_type'] == 'llama'
    assert 'patch_size' not in config and 'auto_map' not in config
    assert not [f for f in os.listdir(tmp_path) if f.endswith('.py')]
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert type(reloaded) is LlamaForCausalLM
    saved, orig = load_file(tmp_path / 'model.safetensors'), load_file(os.path.join(hf_dir, 'model.safetensors'))
    assert saved.keys() == orig.keys() and all(torch.equal(saved[n], orig[n]) for n in orig)
