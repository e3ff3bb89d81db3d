"""Benchmark helpers of the K=1 gap study: the step probe's batch digests (STEP_PROBE_BATCHES, used by
benchmarks/k1_gap_cpu.py to compare the data two runs feed their models) and benchmarks/tput_overlap.py."""
import importlib.util
import json
import os
from types import SimpleNamespace

import pytest
import torch

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')


def _load(name, *path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, *path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_batch_digest_tells_apart_values_dtypes_shapes_and_packing(tmp_path):
    probe = _load('_probe_digest', 'benchmarks', 'step_probe', 'sitecustomize.py')
    ids = torch.arange(12).view(2, 6)
    psp = SimpleNamespace(cu_seqlens_q=torch.tensor([0, 4, 12], dtype=torch.int32), max_seqlen_q=8, qkv_format='thd')
    base = probe.batch_digest({'input_ids': ids, 'labels': None, 'packed_seq_params': psp})
    assert base == probe.batch_digest({'input_ids': ids.clone(), 'labels': None, 'packed_seq_params': psp})
    assert base['packed_seq_params']['max_seqlen_q'] == 8 and base['input_ids'][:2] == ['torch.int64', [2, 6]]
    changed = ids.clone()
    changed[1, 5] = 0
    other_psp = SimpleNamespace(**{**vars(psp), 'cu_seqlens_q': torch.tensor([0, 8, 12], dtype=torch.int32)})
    for variant in ({'input_ids': changed}, {'input_ids': ids.int()}, {'input_ids': ids.view(3, 4)},
                    {'input_ids': ids.to(torch.bfloat16)}, {'packed_seq_params': other_psp}):
        assert probe.batch_digest({'input_ids': ids, 'labels': None, 'packed_seq_params': psp, **variant}) != base
    # the hook writes one record per forward, tagged with the step
    model = torch.nn.Linear(2, 2)
    state = {'step': 3}
    probe._hook_batches([model], str(tmp_path / 'b.jsonl'), state)
    model(input=torch.ones(1, 2))
    rec = json.loads((tmp_path / 'b.jsonl').read_text())
    assert rec['step'] == 3 and rec['input'][:2] == ['torch.float32', [1, 2]]


def test_overlap_finds_the_start_ups_inside_the_timed_steps():
    tool = _load('_tput_overlap', 'benchmarks', 'tput_overlap.py')
    launch = {'runs': [{'key': 'a', 'start': 0.0, 'turn': 100.0, 'exit': 150.0},
                       {'key': 'b', 'start': 0.0, 'turn': 150.0, 'exit': 190.0},
                       {'key': 'c', 'start': 150.0, 'turn': 190.0, 'exit': 230.0},
                       {'key': 'd', 'start': None, 'turn': None, 'exit': None}]}
    runs = {'a': dict(step_s_median=0.5, turn_to_step1_s=20, turn_to_last_step_s=30, startup_s=60),
            'b': dict(step_s_median=0.6, turn_to_step1_s=20, turn_to_last_step_s=30, startup_s=60),
            'c': dict(step_s_median=0.7, turn_to_step1_s=20, turn_to_last_step_s=30, startup_s=30)}
    got = {key: (ms, w0, w1, [(o, t) for o, _, _, t in ov]) for key, ms, w0, w1, ov in tool.overlaps(launch, runs)}
    assert got['a'] == (500.0, 120.0, 130.0, [])  # b and c: start-ups over by 60 s / not begun
    assert got['b'] == (600.0, 170.0, 180.0, [('c', 10.0)])  # c starts at 150 and is up at 180
    assert got['c'] == (700.0, 210.0, 220.0, [])


def test_quality_documents_cut_long_paragraphs_and_keep_every_word(tmp_path):
    """benchmarks/quality/prepare_data.py: a paragraph over 2 x doc_chars (the KJV file has no blank line: it was one
    document of 1.07 M tokens) is cut at line ends, an over-long line at spaces; brute force on random files: every
    document is at most doc_chars + 2 x doc_chars long (its blank-line separators aside), only a file's last one is
    shorter than doc_chars, and the documents of a file hold its words in order."""
    import random
    prep = _load('_prep_data', 'benchmarks', 'quality', 'prepare_data.py')
    rng = random.Random(0)
    doc_chars = 50
    for case in range(60):
        paras = []
        for _ in range(rng.randint(1, 8)):
            lines = [' '.join('w%d' % rng.randint(0, 99) for _ in range(rng.choice([1, 3, 10, 40])))
                     for _ in range(rng.choice([1, 2, 30]))]
            paras.append('\n'.join(lines))
        d = tmp_path / str(case)
        d.mkdir()
        (d / 'f.txt').write_text('\n\n'.join(paras))
        docs = prep.documents(str(d), doc_chars)
        assert [i for i, _ in docs] == [f'f:{n}' for n in range(len(docs))]
        assert all(len(t) - 2 * t.count('\n\n') <= 3 * doc_chars for _, t in docs)  # paragraphs < dc + 2 dc
        assert all(len(t) >= doc_chars for _, t in docs[:-1])
        assert ' '.join(t for _, t in docs).split() == ' '.join(paras).split()
    long_para = '\n'.join('verse %d ' % i + 'x' * 30 for i in range(100))  # one 4 KB paragraph, no blank line
    assert len(prep.pieces(long_para, doc_chars)) > 20 and prep.pieces('short', doc_chars) == ['short']


def test_gpu_pack_as_cp_site_applies_harness_p15_only_when_asked():
    """tests/gpu/pack_as_cp/sitecustomize.py (layouts.sh's CP2 --packing reference): with SWIFT_PLT_CPU_PACK_AS_CP
    set, a fresh process's Template._encode_truncated is the harness's P15 wrapper around swift-plt's patched one
    (the wrapper the CPU proof test_megatron_pt_cli_cp2_equals_one_rank[packing] uses); without it, untouched."""
    import subprocess
    import sys
    code = ('import swift.template.base as b; f = b.Template._encode_truncated; '
            'print(f.__code__.co_filename); print(f.__wrapped__.__code__.co_filename)')
    out = {}
    for cp in ('', '2'):
        env = dict(os.environ, PYTHONPATH=os.path.join(REPO, 'tests', 'gpu', 'pack_as_cp'), SWIFT_PLT_CPU_PACK_AS_CP=cp)
        proc = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[cp] = proc.stdout.split()
    assert out['2'][0].endswith(os.path.join('tests', 'harness', 'patches.py'))
    assert 'swift_template' in out['2'][1] and 'swift_template' in out[''][0]  # P15 wraps swift-plt's patch


def test_quality_run_names_give_k_and_lambda_and_refuse_the_rest():
    from fractions import Fraction
    v = _load('quality_variants', 'benchmarks', 'quality', 'variants.py')
    assert v.parse_run('a') == ('a', 1, Fraction(0))
    assert v.parse_run('b') == ('b', 4, Fraction(2, 3))
    assert v.parse_run('c') == ('c', 4, Fraction(2, 3))
    assert v.parse_run('b_k2') == ('b', 2, Fraction(2, 3))
    assert v.parse_run('c_l34') == ('c', 4, Fraction(3, 4))
    assert v.parse_run('b_k8_l12') == ('b', 8, Fraction(1, 2))
    assert v.run_label('b_k2') == '(b) PLT K=2 λ=2/3, N' and v.run_label('c') == '(c) PLT K=4 λ=2/3, 2N'
    for bad in ('d', 'a_k2', 'b_k1', 'b_l11', 'b_l32', 'b_l12_k2', 'b_k', 'bk2', 'B'):
        with pytest.raises(ValueError, match='run'):
            v.parse_run(bad)
