"""PLT data report (swift_plt.data.report) against brute-force counts written the obvious way; the report glue of
swift_plt/plugin/patches/swift_pipelines_train_sft.py through ms-swift's real template (in process); the step checks."""
import json
import os
import random

import pytest
import torch
from harness.host_sync import count_host_syncs

from swift_plt.data.report import (DocCounts, NoLossDataError, build_report, check_report,
                                   check_step_loss_tokens, document_counts, estimate_loss_tokens, expected_counts,
                                   length_bucket,
                                   max_docs_from_env, min_fraction_from_env, read_reports, write_reports)
from swift_plt.data.padding import pad_encoded

IGN = -100


def brute(labels, k):
    """tokens, pad tokens to a multiple of k, loss tokens at K=1 (positions 1..n-1), at K (positions k..n-1)."""
    n = len(labels)
    pad = 0
    while (n + pad) % k:
        pad += 1
    loss1 = 0
    for i in range(1, n):
        if labels[i] != IGN:
            loss1 += 1
    lossk = 0
    for i in range(n):
        if i >= k and labels[i] != IGN:
            lossk += 1
    return n, pad, loss1, lossk


def random_doc(rng, max_len=40, p_ignored=0.3):
    n = rng.randint(1, max_len)
    ids = [rng.randint(0, 99) for _ in range(n)]
    labels = [IGN if rng.random() < p_ignored else t for t in ids]
    return {'input_ids': ids, 'labels': labels}


def plt_encode(doc, k, pad_id=0):
    e = {'input_ids': list(doc['input_ids']), 'labels': list(doc['labels']), 'length': len(doc['input_ids'])}
    return pad_encoded(e, k, pad_id)


@pytest.mark.parametrize('k', [1, 2, 3, 4, 8])
def test_document_counts_equal_brute_force(k):
    rng = random.Random(k)
    for _ in range(400):
        doc = random_doc(rng, p_ignored=rng.choice([0.0, 0.3, 1.0]))
        got = document_counts(doc, plt_encode(doc, k))
        want = DocCounts(*brute(doc['labels'], k))
        assert got == want == expected_counts(doc['labels'], k)


def test_short_documents_carry_no_loss():
    for k in (2, 4):
        for n in range(1, k + 1):
            doc = {'input_ids': list(range(n)), 'labels': list(range(n))}
            c = document_counts(doc, plt_encode(doc, k))
            assert c.loss_tokens == 0 and c.loss_tokens_k1 == n - 1 and c.tokens + c.pad_tokens == k
        doc = {'input_ids': list(range(k + 1)), 'labels': list(range(k + 1))}
        assert document_counts(doc, plt_encode(doc, k)).loss_tokens == 1


def test_pads_from_any_source_are_counted():
    """Padding that something else adds at encode time (e.g. a context-parallel rule) counts as pad tokens."""
    doc = {'input_ids': list(range(5)), 'labels': list(range(5))}
    enc = plt_encode(doc, 4)  # 8 tokens
    enc = {'input_ids': enc['input_ids'] + [0] * 8, 'labels': enc['labels'] + [IGN] * 8}  # e.g. 2*CP*K = 16
    assert document_counts(doc, enc) == DocCounts(5, 11, 4, 1)


def test_report_aggregates_equal_brute_force():
    rng = random.Random(0)
    k = 4
    docs = [random_doc(rng, max_len=12) for _ in range(300)]
    pairs = [None if i % 17 == 0 else (d, plt_encode(d, k)) for i, d in enumerate(docs)]
    r = build_report('train', k, pairs)
    kept = [d for i, d in enumerate(docs) if i % 17]
    rows = [brute(d['labels'], k) for d in kept]
    assert r.documents == len(kept) and r.skipped == len(docs) - len(kept)
    assert r.tokens == sum(x[0] for x in rows) and r.pad_tokens == sum(x[1] for x in rows)
    assert r.loss_tokens_k1 == sum(x[2] for x in rows) and r.loss_tokens == sum(x[3] for x in rows)
    assert r.documents_without_loss == sum(1 for x in rows if x[3] == 0)
    assert r.documents_without_loss_k1 == sum(1 for x in rows if x[2] == 0)
    assert r.effective_fraction == sum(x[3] for x in rows) / sum(x[2] for x in rows)
    assert sum(r.doc_tokens_hist.values()) == len(kept)
    assert r.doc_tokens_hist[f'<={k}'] == sum(1 for x in rows if x[0] <= k)
    d = r.to_dict()
    assert d['encoded_tokens'] == r.tokens + r.pad_tokens and d['effective_fraction'] == r.effective_fraction


def test_length_bucket():
    assert [length_bucket(n, 4) for n in (1, 4, 5, 8, 9, 16, 17)] == ['<=4', '<=4', '<=8', '<=8', '<=16', '<=16',
                                                                      '<=32']


def test_no_loss_train_set_is_refused_with_advice():
    k = 4
    docs = [{'input_ids': [1, 2, 3], 'labels': [1, 2, 3]}] * 5
    r = build_report('train', k, [(d, plt_encode(d, k)) for d in docs])
    with pytest.raises(NoLossDataError, match=r'no document of the train data set \(5 documents\) carries a loss.*'
                       r'join short documents.*filter out documents of 4 tokens or fewer.*lower --patch_size'):
        check_report(r, 0.8)
    r.sampled = True  # streaming: only the first documents were seen -> warned, the step check stops the run
    (w, ) = check_report(r, 0.8)
    assert 'none of the first 5 documents of the train data set carries a loss' in w
    r.total_documents = 50  # an even sample of a sized data set: refused, saying how to count all
    with pytest.raises(NoLossDataError, match=r'none of the 5 documents counted \(SWIFT_PLT_REPORT_DOCS; evenly '
                       r'spaced over its 50; SWIFT_PLT_REPORT_DOCS=0 counts all\) of the train data set carries '
                       r'a loss'):
        check_report(r, 0.8)
    r.split = 'val'  # a val set: warned
    assert len(check_report(r, 0.8)) == 1
    r.total_documents, r.sampled = None, False
    assert len(check_report(r, 0.8)) == 1


def test_low_fraction_warns_names_causes():
    k = 4
    docs = [{'input_ids': list(range(n)), 'labels': list(range(n))} for n in (2, 3, 20, 9)]
    r = build_report('train', k, [(d, plt_encode(d, k)) for d in docs])
    # K=1: 1+2+19+8 = 30, K=4: 0+0+16+5 = 21 -> 70%
    assert (r.loss_tokens, r.loss_tokens_k1) == (21, 30)
    (w, ) = check_report(r, 0.8)
    assert '70.0% of the loss tokens that K=1 would (21 of 30)' in w and '2 of 4 documents' in w
    assert 'pad tokens' in w and 'lower --patch_size' in w
    assert check_report(r, 0.7) == []


def test_summary_and_json(tmp_path):
    k = 2
    docs = [{'input_ids': list(range(n)), 'labels': list(range(n))} for n in (1, 5)]
    r = build_report('train', k, [(d, plt_encode(d, k)) for d in docs], sampled=True)
    s = r.summary()
    assert 'first 2 documents (streaming)' in s and 'documents carrying no loss: 1 of 2' in s
    path = tmp_path / 'r.json'
    write_reports(str(path), [r])
    assert read_reports(str(path)) == {'train': json.loads(json.dumps(r.to_dict()))}


def test_env_settings():
    assert min_fraction_from_env({}) == 0.8 and min_fraction_from_env({'SWIFT_PLT_MIN_LOSS_FRACTION': '0.5'}) == 0.5
    assert max_docs_from_env({}) == 1_000 and max_docs_from_env({'SWIFT_PLT_REPORT_DOCS': '7'}) == 7
    assert max_docs_from_env({'SWIFT_PLT_REPORT_DOCS': '0'}) is None
    with pytest.raises(ValueError, match='SWIFT_PLT_REPORT_DOCS'):
        max_docs_from_env({'SWIFT_PLT_REPORT_DOCS': 'x'})


def test_step_check():
    check_step_loss_tokens(0, 1)  # K=1: upstream accepts such steps
    check_step_loss_tokens(3, 4)
    with pytest.raises(RuntimeError, match=r'no token of this step at step 7 carries a loss'):
        check_step_loss_tokens(0, 4, 7)


def test_step_loss_token_counts():
    from swift_plt.plugin.patches.swift_megatron_trainers_base import local_loss_tokens as megatron_count
    from swift_plt.plugin.patches.transformers_trainer import local_loss_tokens as hf_count
    from swift_plt.plugin.patches.transformers_trainer import model_patch_size
    assert float(megatron_count([{'loss': torch.tensor([2.5, 3.0])}, {'loss': torch.tensor([0.0, 0.0])}])) == 3
    assert float(megatron_count([])) == 0 and float(megatron_count(None)) == 0
    assert megatron_count([{'loss': torch.tensor([1.0, 5.0])}]).dtype == torch.float64
    batches = [{'labels': torch.tensor([[IGN, 1, 2], [IGN, IGN, IGN]])}, {'labels': torch.full((1, 3), IGN)}]
    assert float(hf_count(batches)) == 2 and float(hf_count([])) == 0

    from transformers import LlamaConfig, LlamaForCausalLM

    from swift_plt.models.hf_llama import PLTLlamaForCausalLM
    config = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    config.patch_size = 4
    plt = PLTLlamaForCausalLM(config)

    class Wrap(torch.nn.Module):

        def __init__(self, module):
            super().__init__()
            self.module = module

    assert model_patch_size(plt) == 4 and model_patch_size(Wrap(plt)) == 4
    from peft import LoraConfig, get_peft_model  # LoRA: PeftModel.base_model is the LoraModel, not the PLT model
    assert model_patch_size(Wrap(get_peft_model(plt, LoraConfig(r=2, target_modules=['q_proj'])))) == 4
    assert model_patch_size(LlamaForCausalLM(config)) == 1  # a config.json patch_size on a plain Llama: K=1
    assert model_patch_size(torch.nn.Linear(1, 1)) == 1


def _step_metrics(tokens):
    return [{'loss': torch.tensor([0.5 * n, float(n)])} for n in tokens]


def test_megatron_step_check_one_host_sync_per_step(monkeypatch):
    """Review #3: the patched BaseMegatronTrainer.train_step (on a stand-in class) copies one scalar to the host
    per step, whatever the number of micro-batches; a step whose micro-batches carry no loss token fails with the
    step's number; K=1 returns upstream's result untouched, without any copy."""
    from types import ModuleType, SimpleNamespace

    from swift_plt.plugin.patches import swift_megatron_trainers_base as patch
    monkeypatch.setattr(torch.cuda, 'current_device', lambda: 'cpu')
    module = ModuleType('stand_in')

    class BaseMegatronTrainer:

        def train_step(self, train_data_iterator):
            return train_data_iterator, 1.0, True

    module.BaseMegatronTrainer = BaseMegatronTrainer
    patch.apply(module)
    trainer = BaseMegatronTrainer()
    trainer.state = SimpleNamespace(iteration=6)
    for k, tokens in [(4, [0, 3, 0, 5, 0, 0, 1, 0]), (4, [7]), (1, [0, 0])]:
        trainer.args = SimpleNamespace(patch_size=k)
        metrics = _step_metrics(tokens)
        calls = count_host_syncs(monkeypatch)
        result = trainer.train_step(metrics)
        assert result[0] is metrics
        assert calls == (['item'] if k > 1 else []), (k, calls)
        monkeypatch.undo()
        monkeypatch.setattr(torch.cuda, 'current_device', lambda: 'cpu')
    trainer.args = SimpleNamespace(patch_size=4)
    for metrics in (_step_metrics([0, 0, 0]), []):  # [] : no micro-batch on this rank (not the last PP stage)
        with pytest.raises(RuntimeError, match=r'PLT \(patch_size=4\): no token of this step at step 7 carries'):
            trainer.train_step(metrics)


def test_hf_step_check_one_host_sync_per_step(monkeypatch):
    """Review #3, HF side: the patched Trainer.get_batch_samples (on a stand-in class) counts the step's labels
    on the device and copies them to the host once per step; a step without loss token fails; a rank without
    micro-batch (end of an uneven epoch) takes part and does not fail (review #7); K=1: no copy."""
    from types import ModuleType, SimpleNamespace

    from swift_plt.plugin.patches import transformers_trainer as patch
    module = ModuleType('stand_in')

    class Trainer:

        def get_batch_samples(self, epoch_iterator, num_batches, device):
            return epoch_iterator, 'n'

    module.Trainer = Trainer
    patch.apply(module)
    trainer = Trainer()
    trainer.model, trainer.state = None, SimpleNamespace(global_step=6)
    batches = [{'labels': torch.full((2, 8), IGN)} for _ in range(6)]
    batches[3]['labels'][1, 5] = 9
    for k in (4, 1):
        monkeypatch.setattr(patch, 'model_patch_size', lambda model, k=k: k)
        calls = count_host_syncs(monkeypatch)
        assert trainer.get_batch_samples(batches, 6, torch.device('cpu')) == (batches, 'n')
        assert calls == (['tolist'] if k > 1 else []), (k, calls)
        monkeypatch.undo()
    monkeypatch.setattr(patch, 'model_patch_size', lambda model: 4)
    with pytest.raises(RuntimeError, match=r'no token of this step at step 7 carries a loss'):
        trainer.get_batch_samples(batches[:3], 3, torch.device('cpu'))
    assert trainer.get_batch_samples([], 3, torch.device('cpu')) == ([], 'n')


def _hf_uneven_worker():
    """2 gloo ranks, K=4: rank 0 got a micro-batch with loss tokens, rank 1 none (end of an uneven epoch). Both take
    part in the all-reduce (with the check only on ranks that got batches, rank 0 would wait for rank 1 alone)."""
    from types import ModuleType, SimpleNamespace

    import torch.distributed as dist

    from swift_plt.plugin.patches import transformers_trainer as patch
    module = ModuleType('stand_in')

    class Trainer:

        def get_batch_samples(self, epoch_iterator, num_batches, device):
            return epoch_iterator, None

    module.Trainer = Trainer
    patch.apply(module)
    patch.model_patch_size = lambda model: 4
    trainer = Trainer()
    trainer.model, trainer.state = None, SimpleNamespace(global_step=0)
    mine = [{'labels': torch.tensor([[IGN, 5]])}] if dist.get_rank() == 0 else []
    trainer.get_batch_samples(mine, 1, torch.device('cpu'))
    after = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(after)  # a second collective: it pairs up only if both ranks made the same number before
    return float(after)


def test_hf_step_check_rank_without_batches_does_not_hang():
    from harness.dist import spawn
    assert spawn(_hf_uneven_worker, 2, timeout=120) == [1.0, 1.0]


# ------------------------------------------------------------------ the report glue, ms-swift's template in process
@pytest.fixture(scope='module')
def template(tmp_path_factory):
    from harness.tiny import make_tiny_llama
    model_dir = make_tiny_llama(str(tmp_path_factory.mktemp('tiny')))
    from swift_plt.plugin.register import register_swift
    register_swift()
    from swift.model import get_model_processor
    from swift.template import get_template
    _, processor = get_model_processor(model_dir, model_type='llama3_2_plt', load_model=False, download_model=False)
    tpl = get_template(processor, template_type='llama', use_chat_template=False, max_length=64)
    tpl.set_mode('train')
    return tpl


def _rows(texts):
    return [{'messages': [{'role': 'assistant', 'content': t}]} for t in texts]


def test_report_glue_equals_brute_force_over_encoded_rows(template, tmp_path):
    from datasets import Dataset

    from swift_plt.data.template_report import plt_data_report
    texts = ['a', 'hi', 'the quick brown fox jumps over the lazy dog', 'x y', 'hello world, this is a test',
             'word ' * 200]  # the last exceeds --max_length 64: dropped by the encoder
    k = 4

    class Args:
        output_dir = str(tmp_path)
        streaming = False

    template.patch_size = k
    try:
        (r, ) = plt_data_report(Args, template, [Dataset.from_list(_rows(texts)), None], k)
    finally:
        template.patch_size = 1
    rows = []
    for row in _rows(texts):  # brute force: the upstream (K=1) encoding and the formula
        try:
            rows.append(brute(template.encode(row)['labels'], k))
        except Exception:
            continue
    assert r.skipped == 1 and r.documents == len(rows) == 5
    assert (r.tokens, r.pad_tokens, r.loss_tokens_k1, r.loss_tokens) == tuple(sum(x[i] for x in rows)
                                                                              for i in range(4))
    assert r.documents_without_loss == sum(1 for x in rows if x[3] == 0) >= 2
    assert read_reports(str(tmp_path / 'plt_data_report.json'))['train']['loss_tokens'] == r.loss_tokens
    # streaming: the first N documents, said so
    template.patch_size = k
    try:
        (s, ) = plt_data_report(Args, template, [Dataset.from_list(_rows(texts)).to_iterable_dataset(), None], k)
    finally:
        template.patch_size = 1
    assert s.sampled and s.total_documents is None and s.loss_tokens == r.loss_tokens
    # more documents than SWIFT_PLT_REPORT_DOCS: that many, evenly spaced (rows 0, 2, 4 of 6), said so
    template.patch_size = k
    try:
        os.environ['SWIFT_PLT_REPORT_DOCS'] = '3'
        (e, ) = plt_data_report(Args, template, [Dataset.from_list(_rows(texts)), None], k)
    finally:
        template.patch_size = 1
        del os.environ['SWIFT_PLT_REPORT_DOCS']
    picked = [brute(template.encode(row)['labels'], k) for row in _rows(texts[0:6:2])]
    assert e.sampled and e.total_documents == 6 and e.documents == 3 and e.skipped == 0
    assert (e.tokens, e.pad_tokens, e.loss_tokens_k1, e.loss_tokens) == tuple(sum(x[i] for x in picked)
                                                                              for i in range(4))
    assert '3 of 6 documents, evenly spaced' in e.summary()
    # a train set of short documents is refused
    template.patch_size = k
    try:
        with pytest.raises(NoLossDataError, match='no document of the train data set'):
            plt_data_report(Args, template, [Dataset.from_list(_rows(['a', 'hi', 'ok'])), None], k)
    finally:
        template.patch_size = 1


def test_estimate_loss_tokens_by_hand():
    report = {'documents': 10, 'tokens': 200, 'pad_tokens': 40, 'loss_tokens': 120, 'loss_tokens_k1': 190}
    # without packing: rows are documents -> 12 rows x 120/10
    assert estimate_loss_tokens(report, 4, 12, 256, packing=False) == 144
    assert estimate_loss_tokens(report, 1, 12, 64, packing=False) == 12 * 190 // 10
    # packing: 12 rows x 256 slots x 120 loss / 240 encoded tokens (at K), 190 / 200 at K=1
    assert estimate_loss_tokens(report, 4, 12, 256, packing=True) == 12 * 256 // 2
    assert estimate_loss_tokens(report, 1, 12, 64, packing=True) == 12 * 64 * 190 // 200
    assert estimate_loss_tokens(dict(report, documents=0, tokens=0, pad_tokens=0), 4, 12, 256, False) == 0


def test_two_stage_reads_packing_and_publishes_report(tmp_path, capsys):
    from swift_plt.recipe.plan import make_plan
    from swift_plt.recipe.options import Options
    from swift_plt.recipe.process import flag_bool
    from swift_plt.recipe.stage_report import publish_data_report
    packing = lambda argv: flag_bool(argv, 'packing')  # noqa: E731
    assert packing(['--packing', 'true']) and packing(['--packing=True']) and not packing(['--packing', 'false'])
    assert not packing(['--packing', 'true', '--packing', 'false']) and not packing([])
    plan = make_plan('3840', 4, '0.8', seq_length=64, global_batch_size=4)  # 3 + 3 steps of 4 sequences
    opts = Options(model='m', output_dir=str(tmp_path), tokens='3840', max_length=64, global_batch_size=4)
    publish_data_report(str(tmp_path), plan, opts)
    assert capsys.readouterr().out == ''  # no report yet
    r = build_report('train', 4, [(d, plt_encode(d, 4)) for d in
                                  [{'input_ids': list(range(n)), 'labels': list(range(n))} for n in (3, 9, 30)]])
    write_reports(str(tmp_path / 'stage1_patch' / 'plt_data_report.json'), [r])
    publish_data_report(str(tmp_path), plan, opts)
    out = capsys.readouterr().out
    assert read_reports(str(tmp_path / 'plt_data_report.json')) == read_reports(
        str(tmp_path / 'stage1_patch' / 'plt_data_report.json'))
    assert f'~{12 * r.loss_tokens // 3:,} loss tokens' in out and f'~{12 * r.loss_tokens_k1 // 3:,} loss tokens' in out
    opts.args = ['--packing', 'true']
    publish_data_report(str(tmp_path), plan, opts)
    assert f'~{12 * 256 * r.loss_tokens // (r.tokens + r.pad_tokens):,} loss tokens' in capsys.readouterr().out
