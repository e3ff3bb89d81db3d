"""The PLT data report through the stock CLIs on CPU: a data set of short documents is refused before
step 1 with the message (`megatron pt`); a mixed data set prints a report whose numbers equal a brute-force count
over the rows encoded by ms-swift's template, kept as JSON in the output dir, with the low-fraction warning (megatron
pt and swift pt); streaming, the step with no loss token fails (each backend has its own step check). The report and
its refusal are one method of ms-swift's SwiftSft that both backends run (the report's patch:
plugin/patches/swift_pipelines_train_sft.py), so the refusal is shown once. K=1 prints nothing new and writes no
report: tests/plugin/test_cli_cpu.py's K=1 tests (bit-identity with upstream there too)."""
import json
import os
import random

import pytest

from harness.cli import CPU_MEGATRON_ARGS, CPU_SWIFT_ARGS, parse_logs, run_cli
from harness.tiny import make_jsonl, make_tiny_llama

pytestmark = pytest.mark.slow
REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')
CUSTOM_MODEL = os.path.join(REPO, 'custom_model', 'llama.py')
SHORT = ['hi', 'ok', 'a', 'yes', 'no', 'go', 'x', 'hm']
K = 4


def _write(path, texts):
    with open(path, 'w', encoding='utf-8') as f:
        for t in texts:
            f.write(json.dumps({'messages': [{'role': 'assistant', 'content': t}]}) + '\n')
    return str(path)


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp('report')
    model = make_tiny_llama(str(root / 'model'))
    normal = make_jsonl(str(root / 'normal.jsonl'), rows=24, max_sentences=2)
    with open(normal, encoding='utf-8') as f:
        texts = [json.loads(line)['messages'][0]['content'] for line in f]
    texts += [random.Random(i).choice(SHORT) for i in range(40)]
    random.Random(0).shuffle(texts)
    return {'model': model, 'mixed': _write(root / 'mixed.jsonl', texts), 'mixed_texts': texts,
            'short': _write(root / 'short.jsonl', SHORT * 4)}


def megatron_pt(data, dataset, out_dir, *extra, k=K, iters=1):
    return run_cli(['megatron', 'pt', '--model', data['model'], '--model_type', 'llama3_2_plt', '--template', 'llama',
                    '--custom_register_path', CUSTOM_MODEL, '--dataset', dataset, '--max_length', '64',
                    '--patch_size', str(k), '--train_iters', str(iters), '--micro_batch_size', '2',
                    '--global_batch_size', '4', '--lr', '1e-3', '--lr_warmup_iters', '0', '--logging_steps', '1',
                    '--seed', '7', '--torch_dtype', 'bfloat16', '--save_steps', '1000', '--no_save_optim', 'true',
                    '--no_save_rng', 'true', '--save_safetensors', 'false', '--dataset_num_proc', '1',
                    '--dataloader_num_workers', '0', '--output_dir', str(out_dir), '--add_version', 'false',
                    *CPU_MEGATRON_ARGS, *extra], timeout=900)


def swift_pt(data, dataset, out_dir, *extra, k=K):
    return run_cli(['swift', 'pt', '--model', data['model'], '--model_type', 'llama3_2_plt', '--template', 'llama',
                    '--custom_register_path', CUSTOM_MODEL, '--dataset', dataset, '--max_length', '64',
                    '--patch_size', str(k), '--tuner_type', 'full', '--torch_dtype', 'float32', '--fp16', 'false',
                    '--bf16', 'false', '--per_device_train_batch_size', '2', '--learning_rate', '1e-3',
                    '--max_steps', '1', '--logging_steps', '1', '--save_strategy', 'no', '--seed', '7',
                    '--split_dataset_ratio', '0', '--dataset_num_proc', '1', '--dataloader_num_workers', '0',
                    '--report_to', 'none', '--output_dir', str(out_dir), '--add_version', 'false', *CPU_SWIFT_ARGS,
                    *extra], timeout=900)


def brute_force_report(data, k):
    """Encode every row with ms-swift's template as `megatron pt`/`swift pt` build it (K=1: upstream) and count
    the obvious way: tokens, pad to a multiple of k, loss tokens at K=1 (positions >= 1) and at K (>= k)."""
    from swift_plt.plugin.register import register_swift
    register_swift()
    from swift.model import get_model_processor
    from swift.template import get_template
    _, processor = get_model_processor(data['model'], model_type='llama3_2_plt', load_model=False,
                                       download_model=False)
    tpl = get_template(processor, template_type='llama', use_chat_template=False, max_length=64, loss_scale='all')
    tpl.set_mode('train')
    out = dict(documents=0, tokens=0, pad_tokens=0, loss_tokens_k1=0, loss_tokens=0, documents_without_loss=0)
    for text in data['mixed_texts']:
        try:
            labels = tpl.encode({'messages': [{'role': 'assistant', 'content': text}]})['labels']
        except Exception:  # too long: --truncation_strategy delete drops it
            continue
        n = len(labels)
        lossk = sum(1 for i in range(k, n) if labels[i] != -100)
        out['documents'] += 1
        out['tokens'] += n
        out['pad_tokens'] += (k - n % k) % k
        out['loss_tokens_k1'] += sum(1 for i in range(1, n) if labels[i] != -100)
        out['loss_tokens'] += lossk
        out['documents_without_loss'] += lossk == 0
    return out


def check_mixed_report(proc, out_dir, want):
    print('\n'.join(line for line in proc.stdout.splitlines() if 'PLT' in line or line.startswith('  ')))
    assert 'PLT data report (train, patch_size=4, all documents)' in proc.stdout, proc.stdout[-5000:]
    with open(os.path.join(out_dir, 'plt_data_report.json')) as f:
        got = json.load(f)['train']
    assert {key: got[key] for key in want} == want
    assert f"tokens carrying a loss: {want['loss_tokens']:,} at K=4 vs {want['loss_tokens_k1']:,} at K=1" in proc.stdout
    frac = want['loss_tokens'] / want['loss_tokens_k1']
    assert frac < 0.8 and f'the patch stage trains on {frac:.1%} of the loss tokens that K=1 would' in proc.stdout


REFUSED = 'no document of the train data set (32 documents) carries a loss'
SAMPLED = 'PLT data report (train, patch_size=4, first 32 documents (streaming))'
STEP_FAILS = 'PLT (patch_size=4): no token of this step at step 1 carries a loss'


def check_streaming_short(proc):
    """Streaming: the report covers the first documents and says so; the no-loss verdict is a warning there
    (the rest of the stream is unseen), and the step with no loss token fails instead of training nothing."""
    assert proc.returncode != 0 and SAMPLED in proc.stdout, proc.stdout[-5000:]
    assert 'none of the first 32 documents of the train data set carries a loss' in proc.stdout
    assert STEP_FAILS in proc.stdout and not parse_logs(proc.stdout), proc.stdout[-5000:]


def test_megatron_pt_short_docs_refused_mixed_reported_step_fails(data, tmp_path):
    short = megatron_pt(data, data['short'], tmp_path / 'short')
    assert short.returncode != 0 and REFUSED in short.stdout and not parse_logs(short.stdout), short.stdout[-5000:]
    assert 'join short documents' in short.stdout and 'lower --patch_size' in short.stdout

    mixed = megatron_pt(data, data['mixed'], tmp_path / 'mixed')
    assert mixed.returncode == 0 and len(parse_logs(mixed.stdout)) == 1, mixed.stdout[-5000:]
    check_mixed_report(mixed, tmp_path / 'mixed', brute_force_report(data, K))

    check_streaming_short(megatron_pt(data, data['short'], tmp_path / 'stream', '--streaming', 'true'))


def test_swift_pt_mixed_reported_step_fails(data, tmp_path):
    mixed = swift_pt(data, data['mixed'], tmp_path / 'mixed')
    assert mixed.returncode == 0, mixed.stdout[-5000:]
    check_mixed_report(mixed, tmp_path / 'mixed', brute_force_report(data, K))
    check_streaming_short(swift_pt(data, data['short'], tmp_path / 'stream', '--streaming', 'true'))
