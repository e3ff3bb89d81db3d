"""The continued-pretraining study of the quality benchmark: corpus B (make_code_corpus.py, prepare_data.py
--add_corpus), the continuation jobs (jobs.py, run.py) and their table (report.py fields, continued.py)."""
import importlib.util
import json
import os
import sys
from types import SimpleNamespace

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)  # the modules import variants.py / launch.py from their folder


def _load(name, filename):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, filename))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fake_tree(root, order):
    """A fake library: kept modules, test dirs and files, junk; files written in the given ``order``."""
    files = {
        'json/decoder.py': 'def decode(s):\n    return s\n\n\n    # indented after a blank line\n',
        'json/__init__.py': 'from .decoder import decode\n',
        'email/mime/text.py': 'class MIMEText:\n    pass\r\n',  # CRLF -> LF
        'big.py': 'x = 1\n' * 100,  # 600 bytes: over max_file_bytes below
        'abc.py': 'import os\n',
        'zz_mod.py': 'print("zz")\n',
        'test/test_json.py': 'assert True\n',
        'json/tests/helper.py': 'pass\n',
        'idlelib/idle_test/x.py': 'pass\n',
        'site-packages/pkg/mod.py': 'pass\n',
        '__pycache__/abc.cpython-311.py': 'pass\n',
        '.hidden/mod.py': 'pass\n',
        'config-3.11-x86_64-linux-gnu/python-config.py': 'pass\n',
        'test_top.py': 'pass\n',
        'mod_test.py': 'pass\n',
        'conftest.py': 'pass\n',
        '_sysconfigdata__linux.py': 'build = {}\n',
        'empty.py': '  \n\n',
        'data.txt': 'not python\n',
    }
    for rel in (sorted(files) if order == 'sorted' else sorted(files, reverse=True)):
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, 'w', newline='') as f:
            f.write(files[rel])
    with open(os.path.join(root, 'latin1.py'), 'wb') as f:
        f.write('s = "caf\u00e9"\n'.encode('latin-1'))  # not UTF-8
    with open(os.path.join(root, 'nul.py'), 'wb') as f:
        f.write(b'x = 1\x00\n')
    os.symlink(os.path.join(root, 'abc.py'), os.path.join(root, 'link.py'))


def test_code_corpus_is_deterministic_and_skips_tests_and_junk(tmp_path):
    cc = _load('quality_code_corpus', 'make_code_corpus.py')
    for order in ('sorted', 'reverse'):
        _fake_tree(str(tmp_path / f'lib_{order}'), order)
    builds = [cc.build(str(tmp_path / f'out_{o}'), 10_000, max_file_bytes=500, stdlib_root=str(tmp_path / f'lib_{o}'))
              for o in ('sorted', 'reverse')]
    a, b = builds
    assert a['fingerprint'] == b['fingerprint'] and a['files'] == b['files']  # another listing order, same corpus
    kept = sorted(f['path'] for f in a['files'])
    assert kept == ['stdlib/abc.py', 'stdlib/email/mime/text.py', 'stdlib/json/__init__.py', 'stdlib/json/decoder.py',
                    'stdlib/zz_mod.py']
    assert a['skipped'] == {'NUL byte': 1, 'build paths': 1, 'directory': 7, 'empty': 1, 'not UTF-8': 1,
                            'symbolic link': 1, 'test file': 3, 'too large': 1}
    out = tmp_path / 'out_sorted'
    names = sorted(p.name for p in out.iterdir())
    assert names == ['code_corpus.json', 'stdlib__abc.py.txt', 'stdlib__email__mime__text.py.txt',
                     'stdlib__json____init__.py.txt', 'stdlib__json__decoder.py.txt', 'stdlib__zz_mod.py.txt']
    assert (out / 'stdlib__email__mime__text.py.txt').read_bytes() == b'class MIMEText:\n    pass\n'
    assert (out / 'stdlib__json__decoder.py.txt').read_text().endswith('\n\n\n    # indented after a blank line\n')
    # the fingerprint: sha256 of the texts in output-name order; bytes and count
    import hashlib
    texts = [(out / n).read_bytes() for n in names if n.endswith('.txt')]
    assert a['fingerprint'] == {'files': 5, 'bytes': sum(map(len, texts)),
                                'sha256': hashlib.sha256(b''.join(texts)).hexdigest()}
    # a cap keeps the files in sha256-of-path order that still fit; the same cap, the same selection
    order = sorted(kept, key=lambda p: hashlib.sha256(p.encode()).hexdigest())
    sizes = {f['path']: f['bytes'] for f in a['files']}
    cap = sizes[order[0]] + sizes[order[1]]
    small = cc.build(str(tmp_path / 'capped'), cap, max_file_bytes=500, stdlib_root=str(tmp_path / 'lib_reverse'))
    assert [f['path'] for f in small['files']] == order[:2] and small['fingerprint']['bytes'] == cap
    assert small['skipped']['over the --max_bytes cap'] == 3
    # a rebuild into the same folder replaces the old files; a foreign folder is refused
    again = cc.build(str(tmp_path / 'capped'), 10_000, max_file_bytes=500, stdlib_root=str(tmp_path / 'lib_sorted'))
    assert again['fingerprint'] == a['fingerprint'] and len(os.listdir(tmp_path / 'capped')) == 6
    (tmp_path / 'foreign').mkdir()
    (tmp_path / 'foreign' / 'keep.txt').write_text('x')
    with pytest.raises(SystemExit, match='not empty'):
        cc.build(str(tmp_path / 'foreign'), 10_000, stdlib_root=str(tmp_path / 'lib_sorted'))


def _tiny_kit(kit):
    """A kit with only what --add_corpus reads: a byte-level BPE tokenizer.json (tokenizers alone: fast)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token='<unk>'))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(['def f(x):\n    return x + 1\n'] * 20, trainer=trainers.BpeTrainer(
        vocab_size=300, special_tokens=['<unk>', '<s>', '</s>', '<pad>'], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    os.makedirs(os.path.join(kit, 'tokenizer'))
    tok.save(os.path.join(kit, 'tokenizer', 'tokenizer.json'))
    return tok


def test_second_corpus_uses_the_kits_tokenizer_and_holds_out_whole_files(tmp_path):
    import lzma

    import numpy as np
    prep = _load('quality_prep_b', 'prepare_data.py')
    # the split alone: whole documents in a seeded order until the rows suffice, <= 2 rows from each
    docs = [(f'd{i}', 'x' * n) for i, n in enumerate([3, 40, 12, 25, 7, 30, 9, 50])]
    held, train, rows = prep.heldout_split(docs, lambda t: list(range(len(t))), 6, 5, 2, 0)
    assert held and {d for d, _ in held}.isdisjoint(d for d, _ in train) and len(held) + len(train) == len(docs)
    assert len(rows) == 5 and all(len(r) == 5 for r in rows) and len(held) == 3  # 2 + 2 + 2 rows >= 5
    assert all(len(t) >= 5 for _, t in held)  # a document shorter than one row is never held out
    assert prep.heldout_split(docs, lambda t: list(range(len(t))), 6, 5, 2, 0) == (held, train, rows)
    # the whole --add_corpus step on a fake kit
    kit, code = tmp_path / 'kit', tmp_path / 'code'
    tok = _tiny_kit(str(kit))
    code.mkdir()
    texts = {f'stdlib__m{i}.py': 'def f(x):\n\n    return x + %d\n' % i * (3 + i) for i in range(12)}
    for name, text in texts.items():
        (code / (name + '.txt')).write_text(text)
    (code / 'blank.txt').write_text('\n\n')
    a = SimpleNamespace(corpus=str(code), kit=str(kit), add_corpus='B', seq=16, heldout_rows=6, max_rows_per_doc=2,
                        seed=0)
    assert prep.add_corpus(a) == 0
    out = kit / 'corpora' / 'B'
    assert (out / 'tokenizer' / 'tokenizer.json').read_bytes() == (kit / 'tokenizer' / 'tokenizer.json').read_bytes()
    m = json.loads((out / 'manifest.json').read_text())
    with lzma.open(out / 'train_docs.jsonl.xz', 'rt') as f:
        train_docs = [json.loads(x) for x in f]
    held = {h['doc'] for h in m['heldout']}
    assert m['documents'] == 12 and len(train_docs) + len(held) == 12 and held.isdisjoint(d['doc'] for d in train_docs)
    assert all(d['text'] == texts[d['doc']] for d in train_docs)  # verbatim: blank lines and indentation kept
    assert sum(d['tokens'] for d in train_docs) == m['train_tokens']
    assert all(d['tokens'] == len(tok.encode(d['text'], add_special_tokens=False).ids) for d in train_docs)
    ids = np.load(out / 'heldout_ids.npy')
    assert ids.shape == (6, 16) and (ids[:, 0] == tok.token_to_id('<s>')).all() and m['heldout_rows'] == 6
    import hashlib
    assert m['tokenizer']['sha256'] == hashlib.sha256((kit / 'tokenizer' / 'tokenizer.json').read_bytes()).hexdigest()
    with pytest.raises(SystemExit, match='capital'):
        prep.add_corpus(SimpleNamespace(**dict(a.__dict__, add_corpus='A')))


def _jobs():
    return _load('quality_jobs_cont', 'jobs.py')


def test_continuation_jobs_ids_starts_and_data_cuts():
    J = _jobs()
    from swift_plt.recipe.plan import make_plan, parse_tokens
    M = 1_000_000
    runs = ['a', 'ah', 'b', 'b_k2_l13', 'c']
    jobs = J.expand(['XS'], runs, [2 * M], [42, 43], from_n=20 * M)
    starts = [J.Job('XS', 'a', 20 * M, s) for s in (42, 43)]
    conts = [j for j in jobs if j.from_n]
    assert jobs[0] == starts[0] and set(jobs) - set(conts) == set(starts) and len(jobs) == len(set(jobs)) == 12
    assert sorted((j.run, j.N, j.seed) for j in conts) == sorted(
        (r, n, s) for s in (42, 43) for r, n in (('a', 2 * M), ('a', M), ('b', 2 * M), ('b_k2_l13', 2 * M),
                                                  ('c', 2 * M)))  # every run at every seed, (a½) = a on N/2
    assert all(j.corpus == 'B' and J.start_job(j) == starts[[42, 43].index(j.seed)] for j in conts)
    for j in jobs:
        assert jobs.index(J.start_job(j) or j) <= jobs.index(j)  # a start before the jobs that need it
    b = J.Job('XS', 'b', 2 * M, 42, 'B', 20 * M)
    assert J.job_id(b) == 'XS_b_n2000000_s42_B_from20000000' and J.parse_job_id(J.job_id(b)) == b
    assert J.job_id(starts[0]) == 'XS_a_n20000000_s42' and J.parse_job_id('XS_a_n5_s1_B') == J.Job('XS', 'a', 5, 1, 'B')
    assert J.parse_job_spec('XS:b:2M:42:B:20M', parse_tokens) == b
    for bad in ('XS_b_n2_s42_from20', 'XS_b_n2_s42_A_from20', 'XS_b_n2_s42_b_from20'):
        with pytest.raises(ValueError):
            J.parse_job_id(bad)
    with pytest.raises(ValueError):
        J.parse_job_spec('XS:b:2M:42:B', parse_tokens)
    assert J.with_starts([b]) == [J.start_job(b), b]
    assert J.with_starts([J.Job('M', 'a', 5, 1)]) == [J.Job('M', 'a', 5, 1)]
    # data: cuts of B's stream (5-field cuts, files B_...), the same spans as on A; the start's cut is A's
    T, G = 512, 32
    plan, cuts = J.job_plan(b, T, G, 'tokens', make_plan)
    _, on_a = J.job_plan(J.Job('XS', 'b', 2 * M, 42), T, G, 'tokens', make_plan)
    assert cuts == {k: c + ('B',) for k, c in on_a.items()} and J.cut_corpus(cuts['1']) == 'B'
    assert J.file_name(cuts['1']) == 'B_s0_n1333333_L2048_r0' and J.file_name(on_a['1']) == 's0_n1333333_L2048_r0'
    _, k2 = J.job_plan(J.Job('XS', 'b_k2_l13', 2 * M, 42, 'B', 20 * M), T, G, 'tokens', make_plan)
    assert k2['1'][:3] == (0, 666_666, 1024) and k2['2'][:3] == (666_666, 1_333_334, 512)  # K=2, λ=1/3
    _, c = J.job_plan(J.Job('XS', 'c', 2 * M, 42, 'B', 20 * M), T, G, 'tokens', make_plan)
    assert c['2'][0] + c['2'][1] == 4 * M  # (c): 2 N_B of B
    _, ah = J.job_plan(J.Job('XS', 'a', M, 43, 'B', 20 * M), T, G, 'tokens', make_plan)
    assert ah == {'a': (0, M, T, 0, 'B')}
    assert J.job_plan(starts[1], T, G, 'tokens', make_plan)[1] == {'a': (0, 20 * M, T, 0)}
    # start order: the start models first, then seed, longest first
    secs = {j: J.estimate_seconds(j, J.steps(j, T, G, J.job_plan(j, T, G, 'tokens', make_plan)[0])) for j in jobs}
    order = J.start_order(jobs, secs)
    assert order[:2] == starts and [j.seed for j in order[2:]] == [42] * 5 + [43] * 5
    assert order[2].run == 'c'


def test_schedule_waits_for_start_models_and_skips_what_cannot_start():
    J = _jobs()
    # two starts (10, 6) then continuations after them; 2 slots: start 0 [0,10], start 1 [0,6]; job 2 (after 1) at 6
    # [6,11]; job 3 (after 0) at 10 [10,14]; job 4 (after 1) at 11 [11,13]
    span, skipped, start = J.schedule([10, 6, 5, 4, 2], [None, None, 1, 0, 1], 2)
    assert (span, skipped, start) == (14, [], [0, 0, 6, 10, 11])
    # a waiting job holds no slot: job 1 waits for job 0 while job 2 takes the second slot; with one slot, the
    # first ready job in the order goes first when it frees
    assert J.schedule([3, 1, 2], [None, 0, None], 2)[2] == [0, 3, 0]
    assert J.schedule([3, 1, 2], [None, 0, None], 1)[2] == [0, 3, 4]
    # a window of 12: job 2 at 6 [6, 11]; at 10 job 3 (4 s) does not fit, nor does job 5 that waits for it; job 4
    # (after 1, 2 s) takes the slot at 10 [10, 12]
    span, skipped, start = J.schedule([10, 6, 5, 4, 2, 1], [None, None, 1, 0, 1, 3], 2, window=12)
    assert skipped == [3, 5] and span == 12 and start == [0, 0, 6, None, 10, None]
    # without dependencies it is makespan()
    for secs, slots in (([5, 4, 3, 2, 2], 2), ([5, 3, 2], 8), ([2, 5], 1)):
        assert J.schedule(secs, [None] * len(secs), slots)[0] == J.makespan(secs, slots)
    assert J.schedule([5, 4, 3, 2, 2, 1], [None] * 6, 2, window=8)[:2] == J.makespan([5, 4, 3, 2, 2, 1], 2, window=8)


def test_start_models_round_trip_through_a_tar(tmp_path):
    run = _load('quality_run_cont', 'run.py')
    for i in ('XS_a_n20000000_s42', 'XS_a_n20000000_s43'):
        d = tmp_path / 'runs' / i / 'hf'
        d.mkdir(parents=True)
        (d / 'config.json').write_text('{"model_type": "llama"}')
        (d / 'model.safetensors').write_bytes(b'w' * 10)
    tar = tmp_path / 'out' / 'starts.tar'
    run.export_starts(str(tar), {i: str(tmp_path / 'runs' / i / 'hf') for i in ('XS_a_n20000000_s42',
                                                                                  'XS_a_n20000000_s43')})
    assert run.start_model_names(str(tar)) == {'XS_a_n20000000_s42', 'XS_a_n20000000_s43'}
    found = run.find_start_models(str(tar), str(tmp_path / 'w2'), {'XS_a_n20000000_s42', 'M_a_n5_s42'})
    assert found == {'XS_a_n20000000_s42': str(tmp_path / 'w2' / 'start_models' / 'XS_a_n20000000_s42')}
    assert (tmp_path / 'w2' / 'start_models' / 'XS_a_n20000000_s42' / 'model.safetensors').read_bytes() == b'w' * 10
    assert run.find_start_models(str(tmp_path / 'runs'), None, {'XS_a_n20000000_s43'}) == {}  # no ID/config.json
    assert run.corpus_kit('/k', 'A') == '/k' and run.corpus_kit('/k', 'B') == '/k/corpora/B'


def _row(job, run, n, seed, b, a, corpus='B', from_n=20_000_000, flops=None, a_iters=None, stage2=None, end1=None,
         first=None):
    r = {'job': job, 'run': run, 'size': 'XS', 'N': n, 'seed': seed, 'corpus': corpus, 'from_n': from_n,
         'start': f'XS_a_n20000000_s{seed}' if from_n else None, 'status': 'done', 'heldout': {'A': a, 'B': b},
         'heldout_loss': b if corpus == 'B' else a, 'flops': flops, 'a_iters': a_iters or n // 16384,
         'non_embedding_params': 730_000,
         'stage2_first_losses': stage2, 'first_losses': first or [],
         'stages': [{'kind': 'patch' if stage2 else 'token', 'final_train_loss': end1}]}
    return r


def _fake_results(path):
    M = 1_000_000
    rows = []
    for s, d in ((42, 0.0), (43, 0.1)):
        rows += [
            _row(f'XS_a_n20000000_s{s}', 'a', 20 * M, s, 7.0 + d, 4.8 + d, corpus='A', from_n=None, flops=10.0),
            _row(f'XS_a_n2000000_s{s}_B_from20000000', 'a', 2 * M, s, 3.0 + d, 5.5 + d, flops=1.0,
                 first=[[1, 6.9], [2, 6.5]]),
            _row(f'XS_a_n1000000_s{s}_B_from20000000', 'a', M, s, 3.3 + d, 5.3 + d, flops=0.5),
            _row(f'XS_a_n500000_s{s}_B_from20000000', 'a', M // 2, s, 3.8 + d, 5.0 + d, flops=0.25),
            _row(f'XS_b_n2000000_s{s}_B_from20000000', 'b', 2 * M, s, 3.15 + d, 5.2 + d, flops=0.5,
                 stage2=[[1, 4.1], [2, 3.9]], end1=3.5),
            _row(f'XS_b_k2_l13_n2000000_s{s}_B_from20000000', 'b_k2_l13', 2 * M, s, 3.06 + d, 5.4 + d, flops=0.8333),
            _row(f'XS_c_n2000000_s{s}_B_from20000000', 'c', 2 * M, s, 2.97 + d, 5.6 + d, flops=1.0)]
    rows.append(dict(_row('XS_c_n2000000_s44_B_from20000000', 'c', 2 * M, 44, None, None), status='killed'))
    rows.append(_row('XS_a_n10000000_s42', 'a', 10 * M, 42, None, 5.0, corpus='A', from_n=None))  # not a start
    path.write_text(json.dumps({'meta': {'T': 512, 'G': 32}, 'rows': rows}))
    return str(path)


def test_continued_table_against_a_hand_computation(tmp_path):
    cont = _load('quality_continued', 'continued.py')
    f = _fake_results(tmp_path / 'results.json')
    d = json.loads(open(f).read())
    d['rows'][0]['heldout']['A'] = 4.9  # scored again in a later call with another value: noted
    (tmp_path / 'again').mkdir()
    (tmp_path / 'again' / 'results.json').write_text(json.dumps(d))
    rows, repeats = cont.load([f, str(tmp_path / 'again')])  # every job twice, the first counts; equal: silent
    assert len(rows) == 14 and repeats == [f"XS_a_n20000000_s42 (in {f} and {tmp_path / 'again' / 'results.json'})"]
    gs = cont.groups(rows)
    assert list(gs) == [('XS', 'B', 20_000_000, 2_000_000)]
    t = {r['key']: r for r in cont.table(gs[('XS', 'B', 20_000_000, 2_000_000)])}
    assert list(t) == ['start', 'a', 'ah', 'a@500000', 'b', 'b_k2_l13', 'c']
    # against token-level at the same compute, by hand (seed 42; the curve: start 0 -> 7.0, 0.25 -> 3.8, 0.5 -> 3.3,
    # 1.0 -> 3.0 on B; 4.8, 5.0, 5.3, 5.5 on A): b at 0.5 = (a½); b_k2_l13 at 0.8333 between 0.5 and 1.0:
    # B 3.3 - 0.3 * 0.6666 -> 3.06 / 3.1 - 1 (about); A 5.3 + 0.2 * 0.6666 -> 5.4 / 5.4333 - 1
    assert t['b']['dB_eq']['per_seed'][42] == pytest.approx(3.15 / 3.3 - 1)
    w = (0.8333 - 0.5) / 0.5  # its compute is 0.8333 (FLOPs), not 5/6
    assert t['b_k2_l13']['dB_eq']['per_seed'][42] == pytest.approx(3.06 / (3.3 - 0.3 * w) - 1)
    assert t['b_k2_l13']['dA_eq']['per_seed'][42] == pytest.approx(5.4 / (5.3 + 0.2 * w) - 1)
    assert t['c']['dB_eq']['per_seed'] == pytest.approx({42: 2.97 / 3.0 - 1, 43: 3.07 / 3.1 - 1})
    assert t['a@500000']['dB_eq'] is None and t['a@500000']['compute'] == 0.25
    assert cont.interpolate([(0, 1.0), (1, 3.0)], 0.25) == 1.5 and cont.interpolate([(0, 1.0), (1, 3.0)], 1.5) is None
    assert t['start']['compute'] == 10.0 and t['ah']['compute'] == 0.5 and t['b_k2_l13']['compute'] == 0.8333
    assert t['c']['B_mean'] == pytest.approx(3.02) and t['c']['B'] == pytest.approx({42: 2.97, 43: 3.07})
    # by hand, seed 42: b 3.15 / a 3.0 - 1 = +5 %, / ah 3.3 - 1 = -4.545 %; A: 5.2 / 4.8 - 1 = +8.333 %
    # seed 43: 3.25 / 3.1 - 1 = +4.839 %, 3.25 / 3.4 - 1 = -4.412 %, 5.3 / 4.9 - 1 = +8.163 %
    assert t['b']['dB_a']['per_seed'] == pytest.approx({42: 0.05, 43: 0.048387097})
    assert t['b']['dB_a']['mean'] == pytest.approx(0.049193548)
    assert t['b']['dB_ah']['per_seed'] == pytest.approx({42: -0.045454545, 43: -0.044117647})
    assert t['b']['dA_start']['per_seed'] == pytest.approx({42: 0.083333333, 43: 0.081632653})
    assert (t['b']['dB_ah']['lo'], t['b']['dB_ah']['hi']) == pytest.approx((-0.045454545, -0.044117647))
    assert t['a']['dB_a'] is None and t['ah']['dB_ah'] is None and t['start']['dA_start'] is None
    assert t['start']['dB_a']['mean'] == pytest.approx((7.0 / 3.0 + 7.1 / 3.1) / 2 - 1)
    md = cont.markdown(gs, repeats)
    assert '| (b) PLT K=4 λ=2/3, 2 M of B | 0.50 | 3.2000 (3.1500, 3.2500) | 5.2500 (5.2000, 5.3000) | ' \
           '+4.92% (+4.84% .. +5.00%) | -4.48% (-4.55% .. -4.41%) | +8.25% (+8.16% .. +8.33%) | ' \
           '-4.48% (-4.55% .. -4.41%) | -1.87% (-1.89% .. -1.85%) |' in md  # A: 5.2 / 5.3 - 1, 5.3 / 5.4 - 1
    assert '| token-level, 500,000 of B | 0.25 |' in md
    assert '| start: (a) on 20 M of A | 10.00 |' in md and '| (b′) PLT K=2 λ=1/3, 2 M of B | 0.83 |' in md
    assert '| (c) PLT K=4 λ=2/3, 2N = 4 M of B | 1.00 |' in md and '| (a½) token-level, 1 M of B | 0.50 |' in md
    assert '| (b) PLT K=4 λ=2/3, 2 M of B | 42 | 3.5000 | 1: 4.1000, 2: 3.9000 |' in md
    assert '| (a) token-level, 2 M of B: its first logged losses | 42 | — | 1: 6.9000, 2: 6.5000 |' in md
    assert 'Repeated jobs' in md
    rg = _load('quality_regime_cont', 'regime.py')  # the regime map leaves continuations out, keeps the starts
    assert sorted((r['run'], r['N']) for r in rg.load([f])) == [('a', 10_000_000)] + [('a', 20_000_000)] * 2


def test_continued_cli_writes_the_table_and_one_png(tmp_path):
    pytest.importorskip('matplotlib')
    cont = _load('quality_continued_cli', 'continued.py')
    f = _fake_results(tmp_path / 'results.json')
    assert cont.main([f, '--md', str(tmp_path / 'c.md'), '--png', str(tmp_path / 'c.png')]) == 0
    assert (tmp_path / 'c.png').stat().st_size > 10_000 and '### XS: start (a)' in (tmp_path / 'c.md').read_text()
    (tmp_path / 'none.json').write_text(json.dumps({'meta': {}, 'rows': []}))
    assert cont.main([str(tmp_path / 'none.json')]) == 1


def test_report_rows_of_a_continuation_call(tmp_path):
    """report.py: a continuation's held-out loss is its B loss, it also has A's; the start keeps A as its own;
    (vs a) compares within one corpus and start; the first logged losses of each stage are kept."""
    import subprocess
    work, out = tmp_path / 'work', tmp_path / 'out'
    out.mkdir()
    model = {'params': 1000, 'non_embedding_params': 100, 'vocab': 10, 'hidden': 4, 'layers': 1}
    start = {'id': 'XS_a_n1000_s42', 'size': 'XS', 'run': 'a', 'N': 1000, 'seed': 42, 'a_iters': 2, 'K': 1,
             'G1': None, 'status': 'done', 'corpus': 'A', 'from_n': None, 'start': None}
    cont_a = dict(start, id='XS_a_n500_s42_B_from1000', N=500, a_iters=1, corpus='B', from_n=1000,
                  start='XS_a_n1000_s42')
    cont_b = dict(cont_a, id='XS_b_n500_s42_B_from1000', run='b', K=4, G1=1)
    a_on_a = dict(start, id='XS_a_n500_s42', N=500, a_iters=1)  # (a) on A at the same N: not cont_a's baseline
    jobs = [start, cont_a, cont_b, a_on_a]
    (out / 'meta.json').write_text(json.dumps({'T': 8, 'G': 2, 'jobs': jobs, 'models': {'XS': model},
                                               'sizes': ['XS'], 'runs': ['a', 'b'], 'seeds': [42],
                                               'gpu_lock': False}))
    ev = {'XS_a_n1000_s42': 5.0, 'XS_a_n1000_s42@B': 8.0, 'XS_a_n500_s42_B_from1000': 6.0,
          'XS_a_n500_s42_B_from1000@B': 3.0, 'XS_b_n500_s42_B_from1000': 5.5, 'XS_b_n500_s42_B_from1000@B': 3.3,
          'XS_a_n500_s42': 5.2, 'XS_a_n500_s42@B': 9.0}
    (out / 'eval.jsonl').write_text(''.join(json.dumps({'name': k, 'loss': v, 'ppl': 1.0}) + '\n'
                                            for k, v in ev.items()))
    for sub, losses in (('stage1_patch', [9.0, 8.0, 7.5]), ('stage2_token', [4.0, 3.8, 3.6, 3.5, 3.4, 3.3, 3.2])):
        d = work / 'runs' / 'XS_b_n500_s42_B_from1000' / sub
        d.mkdir(parents=True)
        (d / 'logging.jsonl').write_text(''.join(
            json.dumps({'iteration': f'{i + 1}/{len(losses)}', 'loss': x}) + '\n' for i, x in enumerate(losses)))
    env = dict(os.environ, MPLBACKEND='Agg')
    subprocess.run([sys.executable, '-c', 'import sys; sys.modules["matplotlib"] = None; sys.argv = ["report.py", '
                    f'{str(work)!r}, {str(out)!r}]; import runpy; runpy.run_path("report.py", run_name="__main__")'],
                   check=True, capture_output=True, cwd=HERE, env=env)
    rows = {r['job']: r for r in json.loads((out / 'results.json').read_text())['rows']}
    s, a, b = rows['XS_a_n1000_s42'], rows['XS_a_n500_s42_B_from1000'], rows['XS_b_n500_s42_B_from1000']
    assert s['heldout'] == {'A': 5.0, 'B': 8.0} and s['heldout_loss'] == 5.0 and s['corpus'] == 'A'
    assert a['heldout'] == {'A': 6.0, 'B': 3.0} and a['heldout_loss'] == 3.0 and a['start'] == 'XS_a_n1000_s42'
    assert b['loss_vs_a'] == pytest.approx(3.3 / 3.0 - 1)  # against (a) on B from the same start, not (a) on A
    assert rows['XS_a_n500_s42']['loss_vs_a'] == 0.0
    assert b['first_losses'] == [[1, 9.0], [2, 8.0], [3, 7.5]]
    assert b['stage2_first_losses'] == [[1, 4.0], [2, 3.8], [3, 3.6], [4, 3.5], [5, 3.4]]
    md = (out / 'results.md').read_text()
    assert '(b) PLT K=4 λ=2/3, N on B from XS_a_n1000_s42 |' in md


def test_slots_go_to_the_first_waiting_job_in_the_start_order():
    """run.py's OrderedSlots: continuations woken together by their start model take the slots in the start order
    (as jobs.schedule assumes), not in the order their threads happen to run."""
    import threading
    import time
    run = _load('quality_run_slots', 'run.py')
    slots = run.OrderedSlots(1, ['s', 'c1', 'c2', 'c3'])
    slots.acquire('s')
    got, threads = [], []
    for j in ('c3', 'c2', 'c1'):  # arrive in the reverse order
        def take(j=j):
            slots.acquire(j)
            got.append(j)
            slots.release()
        threads.append(threading.Thread(target=take))
        threads[-1].start()
    deadline = time.time() + 5
    while len(slots.waiting) < 3 and time.time() < deadline:
        time.sleep(0.002)
    slots.release()
    for th in threads:
        th.join(5)
    assert got == ['c1', 'c2', 'c3']
