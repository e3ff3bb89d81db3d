"""The quality benchmark's data cutting (prepare_data.py) and run names (variants.py)."""
import importlib.util
import json
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name, filename):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, filename))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quality_documents_cut_long_paragraphs_and_keep_every_word(tmp_path):
    """prepare_data.py: a paragraph over 2 x doc_chars (a file with no blank line would be one huge document) is cut
    at line ends, an over-long line at spaces; brute force on random files: every
    document is at most doc_chars + 2 x doc_chars long (its blank-line separators aside), only a file's last one is
    shorter than doc_chars, and the documents of a file hold its words in order."""
    import random
    prep = _load('_prep_data', 'prepare_data.py')
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


def test_quality_run_names_give_k_and_lambda_and_refuse_the_rest():
    from fractions import Fraction
    v = _load('quality_variants', 'variants.py')
    assert v.parse_run('a') == ('a', 1, Fraction(0))
    assert v.parse_run('b') == ('b', 4, Fraction(2, 3))
    assert v.parse_run('c') == ('c', 4, Fraction(2, 3))
    assert v.parse_run('b_k2') == ('b', 2, Fraction(2, 3))
    assert v.parse_run('c_l34') == ('c', 4, Fraction(3, 4))
    assert v.parse_run('b_k8_l12') == ('b', 8, Fraction(1, 2))
    assert v.parse_run('b_k2_l13') == ('b', 2, Fraction(1, 3))  # (b′) of the continued-pretraining study
    assert v.run_label('b_k2') == '(b) PLT K=2 λ=2/3, N' and v.run_label('c') == '(c) PLT K=4 λ=2/3, 2N'
    for bad in ('d', 'a_k2', 'b_k1', 'b_l11', 'b_l32', 'b_l12_k2', 'b_k', 'bk2', 'B'):
        with pytest.raises(ValueError, match='run'):
            v.parse_run(bad)


def _jobs():
    import sys
    if HERE not in sys.path:
        sys.path.insert(0, HERE)  # jobs.py and regime.py import variants.py from their folder
    return _load('quality_jobs', 'jobs.py')


def test_quality_job_ids_round_trip_and_refuse_the_rest():
    J = _jobs()
    for job in (J.Job('XS', 'b_k2_l12', 10_000_000, 43), J.Job('tiny', 'a', 8192, 42), J.Job('M', 'c', 5, 7)):
        assert J.parse_job_id(J.job_id(job)) == job
    assert J.job_id(J.Job('XS', 'b', 10_000_000, 42)) == 'XS_b_n10000000_s42'
    for bad in ('XS_b_n10000000', 'XS_d_n1_s42', 'XS_b_n1e7_s42', 'X_S_b_n1_s1', 'XS_b_n10_s'):
        with pytest.raises(ValueError):
            J.parse_job_id(bad)
    from swift_plt.recipe.plan import parse_tokens
    assert J.parse_job_spec('tiny:b_k2:20M:42', parse_tokens) == J.Job('tiny', 'b_k2', 20_000_000, 42)
    assert J.parse_job_spec('XS:a:2.5M:43', parse_tokens) == J.Job('XS', 'a', 2_500_000, 43)
    for bad in ('tiny:b_k2:20M', 'tiny:ah:20M:42', 'tiny:x:1:1', 'ti_ny:a:1:1'):
        with pytest.raises(ValueError):
            J.parse_job_spec(bad, parse_tokens)


def test_quality_run_list_gives_the_second_seed_only_where_a_comparison_needs_it():
    J = _jobs()
    M = 1_000_000
    # the brief's split form: token-level at every N, the second seed of (a) only at the (a½) N of a (b) run
    jobs = J.expand(['tiny'], ['a', 'b'], [2_500_000, 5 * M, 10 * M, 20 * M], [42, 43])
    a = sorted((j.N, j.seed) for j in jobs if j.run == 'a')
    assert a == [(2_500_000, 42), (2_500_000, 43), (5 * M, 42), (5 * M, 43), (10 * M, 42), (10 * M, 43), (20 * M, 42)]
    assert sorted((j.N, j.seed) for j in jobs if j.run == 'b') == [(n, s) for n in (2_500_000, 5 * M, 10 * M, 20 * M)
                                                                   for s in (42, 43)]
    # `ah` = (a) on N/2 at every seed: the regime list of one size, 7 token-level + 6 (b) runs, each once
    jobs = J.expand(['tiny', 'XS'], ['a', 'ah', 'b'], [5 * M, 10 * M, 20 * M], [42, 43])
    assert len(jobs) == len(set(jobs)) == 26
    assert sorted((j.N, j.seed) for j in jobs if j.size == 'XS' and j.run == 'a') == a
    # token-level runs alone: the first seed only (no (b) in the call), unless `ah` or --all_seeds
    assert [j.seed for j in J.expand(['M'], ['a'], [5 * M, 10 * M], [42, 43])] == [42, 42]
    assert len(J.expand(['M'], ['a'], [5 * M, 10 * M], [42, 43], all_seeds=True)) == 4
    assert J.expand(['M'], ['ah'], [5 * M], [43, 42]) == [J.Job('M', 'a', 2_500_000, 43), J.Job('M', 'a', 2_500_000, 42)]
    extra = [J.Job('tiny', 'b_k2', 20 * M, 42), J.Job('tiny', 'b', 20 * M, 42)]  # the second is already planned
    assert J.expand(['tiny'], ['b'], [20 * M], [42], extra=extra) == [J.Job('tiny', 'b', 20 * M, 42), extra[0]]
    assert J.expand([], [], [], [42], extra=extra[:1]) == extra[:1]
    for bad_seeds in ([], [42, 42]):
        with pytest.raises(ValueError):
            J.expand(['M'], ['a'], [M], bad_seeds)


def test_quality_data_cuts_are_shared_and_the_reserve_stays_clear():
    J = _jobs()
    from swift_plt.recipe.plan import make_plan
    T, G = 512, 32
    plan, cuts = J.job_plan(J.Job('XS', 'b', 10_000_000, 43), T, G, 'tokens', make_plan)
    n1 = plan.stage1.budget_tokens
    assert n1 == 6_666_666 and plan.stage1.train_iters == 406 and plan.stage2.train_iters == 203
    assert cuts == {'1': (0, n1, 4 * T, 0), '2': (n1, 10_000_000 - n1, T, int(n1 * 0.04))}
    # the same cuts as before several N: b1 [0, 6,666,666) at 2048 and b2 [6,666,666, 10M) from reserve +266,666
    assert cuts['2'][3] == 266_666
    _, k2 = J.job_plan(J.Job('M', 'b_k2', 10_000_000, 42), T, G, 'tokens', make_plan)
    assert J.file_name(k2['2']) == J.file_name(cuts['2']) != J.file_name(k2['1'])  # one stage-2 file for both
    _, c = J.job_plan(J.Job('M', 'c', 5_000_000, 42), T, G, 'tokens', make_plan)
    assert c == cuts  # (c) on N is (b) on 2N: the same files
    p, a = J.job_plan(J.Job('M', 'a', 5_000_000, 42), T, G, 'tokens', make_plan)
    assert p is None and a == {'a': (0, 5_000_000, T, 0)} and J.steps(J.Job('M', 'a', 5_000_000, 42), T, G, p) == [305]
    with pytest.raises(ValueError, match='one step'):
        J.job_plan(J.Job('M', 'a', 1000, 42), T, G, 'tokens', make_plan)
    # reserve: 2 x the largest N when the stream has room, else right after the farthest cut; never overlapping
    assert J.reserve_start([10_000_000], 400_000, 23_000_000) == 20_000_000
    assert J.reserve_start([20_000_000, 5_000_000], 800_000, 23_000_000) == 20_000_000
    assert J.reserve_start([16384], 655, None) == 32768
    assert J.reserve_start([5_000_000], 200_000, 23_000_000, requested=20_000_000) == 20_000_000
    with pytest.raises(ValueError, match='past the reserve'):
        J.reserve_start([20_000_000], 800_000, 23_000_000, requested=10_000_000)
    with pytest.raises(ValueError, match='runs past'):
        J.reserve_start([22_500_000], 900_000, 23_000_000)
    # estimate: start-up + steps + export; two stages: two start-ups (H100 figures of jobs.py)
    assert J.estimate_seconds(J.Job('M', 'a', 0, 42), [610]) == pytest.approx(95 + 610 * 0.15 + 40)
    assert J.estimate_seconds(J.Job('XS', 'b', 0, 42), [406, 203]) == pytest.approx(190 + 406 * 0.08 + 203 * 0.12 + 40)
    jobs = [J.Job('M', 'a', 1, 43), J.Job('M', 'a', 1, 42), J.Job('M', 'b', 1, 42), J.Job('M', 'b', 1, 43)]
    secs = dict(zip(jobs, (5, 1, 3, 2)))
    assert J.start_order(jobs, secs) == [jobs[0], jobs[3], jobs[2], jobs[1]]  # the call's first seed (43) first
    # longest first on 2 slots: 5 | 4, then 3 -> the slot free at 4 (7), 2 -> 5 (7), 2 -> 7 (9)
    assert J.makespan([5, 4, 3, 2, 2], 2) == 9 and J.makespan([5, 3, 2], 8) == 5 and J.makespan([2, 5], 1) == 7
    # with 8 s to go: 5 | 4, 3 at 4 (7), 2 at 5 (7), 2 at 7 -> 9 > 8: not started; a 1 fits at 7
    assert J.makespan([5, 4, 3, 2, 2, 1], 2, window=8) == (8, [4])


def test_quality_run_plan_only_prints_the_run_list(tmp_path):
    """run.py --plan_only: the CLI's --tokens (suffixes), --seeds, --runs and --jobs give the run list with steps."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, os.path.join(HERE, 'run.py'), '--kit', str(tmp_path / 'none'), '--work',
                        str(tmp_path / 'w'), '--out', str(tmp_path / 'o'), '--sizes', 'tiny', '--tokens', '5M', '10M',
                        '--runs', 'a', 'ah', 'b', '--seeds', '42', '43', '--jobs', 'tiny:b_l12:10M:42',
                        '--plan_only'], capture_output=True, text=True, check=True)
    rows = {line.split('|')[1].strip(): line.split('|')[2].strip() for line in r.stdout.splitlines()
            if line.startswith('| tiny_')}
    assert rows == {'tiny_a_n5000000_s42': '305', 'tiny_a_n10000000_s42': '610', 'tiny_a_n2500000_s42': '152',
                    'tiny_a_n2500000_s43': '152', 'tiny_a_n5000000_s43': '305', 'tiny_b_n5000000_s42': '203 + 101',
                    'tiny_b_n5000000_s43': '203 + 101', 'tiny_b_n10000000_s42': '406 + 203',
                    'tiny_b_n10000000_s43': '406 + 203', 'tiny_b_l12_n10000000_s42': '305 + 305'}
    assert 'planned runs: 10' in r.stdout and 'reserve from token 20,000,000' in r.stdout
    assert not (tmp_path / 'w').exists()  # nothing ran


def _results(path, rows, **meta):
    import json
    m = {'T': 512, 'G': 32, 'lr': {'XS': 2e-3, 'M': 1e-3}, 'stage1_batch': 'tokens', 'cpu': False}
    m.update(meta)
    path.write_text(json.dumps({'meta': m, 'rows': rows}))
    return str(path)


def _row(size, run, n, seed, loss, status='done', non_emb=1_000_000):
    return {'size': size, 'run': run, 'N': n, 'seed': seed, 'heldout_loss': loss, 'status': status,
            'non_embedding_params': non_emb}


def test_quality_regime_table_against_a_hand_computation(tmp_path):
    _jobs()
    rg = _load('quality_regime', 'regime.py')
    M = 1_000_000
    f1 = _results(tmp_path / 'r1.json', [
        _row('XS', 'a', 10 * M, 42, 5.0), _row('XS', 'a', 5 * M, 42, 6.0), _row('XS', 'a', 5 * M, 43, 6.2),
        _row('XS', 'b', 10 * M, 42, 5.7), _row('XS', 'b', 10 * M, 43, 6.3),
        _row('XS', 'b', 20 * M, 42, None, status='killed at the deadline'),  # no result: left out
        _row('XS', 'a', 10 * M, 43, 9.9, status='not started (deadline)'),  # a loss without 'done': left out
        _row('XS', 'b_k2', 10 * M, 42, 5.4)])
    (tmp_path / 'call2').mkdir()
    _results(tmp_path / 'call2' / 'results.json', [  # a second call: M, and (c) on 5M = (b) on 10M
        _row('M', 'a', 5 * M, 42, 5.0, non_emb=20 * M), _row('M', 'c', 5 * M, 42, 4.9, non_emb=20 * M),
        _row('XS', 'a', 5 * M, 42, 7.0)])  # a repeat: the first file's value counts
    rows = rg.load([f1, str(tmp_path / 'call2')])  # a file, or the folder that holds results.json
    table = rg.regime_table(rows)
    assert [(e['size'], e['N']) for e in table] == [('XS', 10 * M), ('M', 10 * M)]
    xs, m = table
    # by hand: seed 42: 5.7 / 6.0 - 1 = -5 %; seed 43: 6.3 / 6.2 - 1 = +1.6129 %; mean -1.6935 %, spread 6.6129 pp
    assert xs['b_vs_ah']['per_seed'] == pytest.approx({42: -0.05, 43: 0.016129032}, abs=1e-9)
    assert xs['b_vs_ah']['mean'] == pytest.approx(-0.016935484, abs=1e-9)
    assert xs['b_vs_ah']['spread'] == pytest.approx(0.066129032, abs=1e-9)
    assert (xs['b_vs_ah']['lo'], xs['b_vs_ah']['hi']) == pytest.approx((-0.05, 0.016129032), abs=1e-9)
    assert xs['b_vs_a']['per_seed'] == pytest.approx({42: 0.14}) and xs['tpp'] == 10.0  # 5.7 / 5.0; 10 M / 1 M
    assert xs['a'] == {42: 5.0} and xs['ah'] == {42: 6.0, 43: 6.2}  # not-started and repeated rows left out
    assert m['b'] == {42: 4.9} and m['b_vs_ah']['mean'] == pytest.approx(-0.02) and m['tpp'] == 0.5
    assert m['b_vs_a']['mean'] is None  # no (a) on 10 M for M
    _, repeats = rg.index(rows)
    assert len(repeats) == 1 and 'XS_a_n5000000_s42' in repeats[0]
    k2 = rg.regime_table(rows, 'b_k2')
    assert k2[0]['b_vs_ah']['mean'] == pytest.approx(5.4 / 6.0 - 1)
    md = rg.markdown(table, [])
    assert '| XS | 10,000,000 | 10.00 |' in md and '-1.69 %' in md and '6.61 pp' in md and '+14.00 %' in md
    assert rg.check_setups(rows) == []
    rows.append(dict(rows[0], setup=(256,) + rows[0]['setup'][1:]))
    assert len(rg.check_setups(rows)) == 1
    # the paper's 370 M model from PatchTrain's run_token.sh config: 369.1 M parameters, 303.6 M non-embedding
    assert rg.PAPER_PARAMS == 369_148_928 and rg.PAPER_NON_EMB == 303_612_928


def test_quality_regime_cli_writes_one_png(tmp_path):
    pytest.importorskip('matplotlib')
    _jobs()
    rg = _load('quality_regime_cli', 'regime.py')
    f = _results(tmp_path / 'r.json', [_row('tiny', 'a', 4 * 10**6, 42, 6.0), _row('tiny', 'a', 4 * 10**6, 43, 6.1),
                                       _row('tiny', 'b', 8 * 10**6, 42, 5.9), _row('tiny', 'b', 8 * 10**6, 43, 6.2)])
    assert rg.main([f, '--png', str(tmp_path / 'regime.png'), '--md', str(tmp_path / 'regime.md')]) == 0
    assert (tmp_path / 'regime.png').stat().st_size > 10_000
    assert '| tiny | 8,000,000 | 8.00 |' in (tmp_path / 'regime.md').read_text()


def test_quality_regime_by_compute(tmp_path):
    """--by_compute: a run's FLOPs are N x (λ/K + 1 - λ) x FLOPs per position ((a): N x F); rows without the figure
    are left out; structures.json (the MoE / hybrid study) loads whole and plots a panel per size."""
    pytest.importorskip('matplotlib')
    _jobs()
    rg = _load('quality_regime_compute', 'regime.py')
    F = 7_000_000
    rows = [dict(_row('tiny', r, n, s, loss), flops_per_position=F) for r, n, s, loss in
            (('a', 2 * 10**6, 42, 7.0), ('a', 4 * 10**6, 42, 6.5), ('b', 4 * 10**6, 42, 6.7), ('c', 2 * 10**6, 43, 6.6),
             ('b_k2', 4 * 10**6, 42, 6.6))] + [_row('XS', 'a', 10**6, 42, 6.0)]
    loaded = rg.load([_results(tmp_path / 'r.json', rows)])
    by = {(r['run'], r['N'], r['seed']): rg.compute(r) for r in loaded}
    assert by[('a', 4 * 10**6, 42)] == 4e6 * F
    assert by[('b', 4 * 10**6, 42)] == pytest.approx(4e6 * (1 / 6 + 1 / 3) * F, rel=1e-12)  # (c) on 2 M: (b) on 4 M
    assert by[('b', 4 * 10**6, 43)] == by[('b', 4 * 10**6, 42)]
    assert by[('b_k2', 4 * 10**6, 42)] == pytest.approx(4e6 * (1 / 3 + 1 / 3) * F, rel=1e-12)
    assert by[('a', 10**6, 42)] is None  # no FLOPs per position: not in the plot
    png = tmp_path / 'c.png'
    assert rg.main([str(tmp_path / 'r.json'), '--png', str(tmp_path / 'r.png'), '--by_compute', str(png)]) == 0
    assert png.stat().st_size > 10_000
    study = rg.load([os.path.join(HERE, 'structures.json')])
    assert {r['size'] for r in study} == {'tiny', 'tinyMoE', 'tinyHybrid'} and all(rg.compute(r) for r in study)
    assert len(study) == len(json.load(open(os.path.join(HERE, 'structures.json')))['rows'])  # every row finished
    assert rg.plot_by_compute(study, str(tmp_path / 's.png'))


def test_quality_deadline_steps_are_not_started_or_killed_and_never_results(tmp_path):
    """run.py's Runner: a step with too little time left does not start, one still running at the deadline is
    killed; report.py gives a job that did not finish no loss, even if a stale model of it was scored."""
    import json
    import subprocess
    import sys
    import time
    from types import SimpleNamespace
    run = _load('quality_run', 'run.py')
    a = SimpleNamespace(deadline=5, cpu=False, work=str(tmp_path), no_gpu_lock=True)
    r = run.Runner(a, time.time())
    assert r.run('late', ['true'], str(tmp_path / 'l' / 'late.log')) == run.NOT_STARTED  # 5 s < MIN_LEFT
    r.MIN_LEFT = 0
    t = time.time()
    assert r.run('long', ['sleep', '30'], str(tmp_path / 'l' / 'long.log')) == run.KILLED
    assert time.time() - t < 15
    r.deadline = time.time() + 60
    assert r.run('ok', ['true'], str(tmp_path / 'l' / 'ok.log')) == 0
    assert run.step_status('train', 0) is None and run.step_status('train', 3) == 'train failed (rc=3)'
    assert run.step_status('stage 1', run.NOT_STARTED) == 'stage 1 not started (deadline)'
    assert len(r.failed) == 2
    # report.py: the killed job has an eval record (a stale model) but no result; the finished one has its loss
    out = tmp_path / 'out'
    out.mkdir()
    model = {'params': 1000, 'non_embedding_params': 100, 'vocab': 10, 'hidden': 4, 'layers': 1}
    jobs = [{'id': f'XS_a_n1000_s{s}', 'size': 'XS', 'run': 'a', 'N': 1000, 'seed': s, 'a_iters': 1, 'K': 1,
             'G1': None, 'status': st} for s, st in ((42, 'done'), (43, run.KILLED))]
    (out / 'meta.json').write_text(json.dumps({'T': 8, 'G': 2, 'jobs': jobs, 'models': {'XS': model}, 'sizes': ['XS'],
                                               'runs': ['a'], 'seeds': [42, 43], 'gpu_lock': False}))
    (out / 'eval.jsonl').write_text(''.join(json.dumps({'name': j['id'], 'loss': 5.0 + i, 'ppl': 1.0}) + '\n'
                                            for i, j in enumerate(jobs)))
    subprocess.run([sys.executable, os.path.join(HERE, 'report.py'), str(tmp_path / 'work'), str(out)], check=True,
                   capture_output=True, cwd=HERE)
    rows = {x['job']: x for x in json.loads((out / 'results.json').read_text())['rows']}
    assert rows['XS_a_n1000_s42']['heldout_loss'] == 5.0 and rows['XS_a_n1000_s43']['heldout_loss'] is None
    assert rows['XS_a_n1000_s43']['status'] == run.KILLED
    assert 'Not finished (no result): XS_a_n1000_s43 (killed at the deadline)' in (out / 'results.md').read_text()


def test_quality_run_list_of_a_structure_call_runs_c_on_n_once_as_b_on_2n():
    """--runs a ah b c --tokens 5M 10M --seeds 42 43 (a call of the MoE / hybrid regime map): 11 jobs a size; (c) on
    5 M trains what (b) on 10 M trains (the same cuts and steps) and runs once, as that (b)."""
    J = _jobs()
    from swift_plt.recipe.plan import make_plan
    M = 1_000_000
    jobs = J.expand(['tinyMoE'], ['a', 'ah', 'b', 'c'], [5 * M, 10 * M], [42, 43])
    assert sorted((j.run, j.N, j.seed) for j in jobs) == [
        ('a', 2_500_000, 42), ('a', 2_500_000, 43), ('a', 5 * M, 42), ('a', 5 * M, 43), ('a', 10 * M, 42),
        ('b', 5 * M, 42), ('b', 5 * M, 43), ('b', 10 * M, 42), ('b', 10 * M, 43), ('c', 10 * M, 42), ('c', 10 * M, 43)]
    c, b = J.Job('XS', 'c_k2', 5 * M, 42), J.Job('XS', 'b_k2', 10 * M, 42)
    assert J.job_plan(c, 512, 32, 'tokens', make_plan)[1] == J.job_plan(b, 512, 32, 'tokens', make_plan)[1]
    assert J.expand(['XS'], ['c_k2'], [5 * M], [42], extra=[b]) == [b]
    assert J.expand(['XS'], ['c_k2'], [5 * M], [42, 43], extra=[b]) == [J.Job('XS', 'c_k2', 5 * M, 43), b]


@pytest.fixture(scope='module')
def structure_models(tmp_path_factory):
    """make_models.py's tiny (Llama), tinyMoE (Qwen3-MoE) and tinyHybrid (Qwen3.5) on a 300-id tokenizer."""
    import transformers
    if not hasattr(transformers, 'Qwen3_5Config'):
        pytest.skip(f'transformers {transformers.__version__} has no Qwen3.5')
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {t: i for i, t in enumerate(['<unk>', '<s>', '</s>', '<pad>'] + [f'w{i}' for i in range(296)])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token='<unk>'))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    root = tmp_path_factory.mktemp('structures')
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, bos_token='<s>', eos_token='</s>', pad_token='<pad>',
                                         unk_token='<unk>').save_pretrained(str(root / 'tok'))
    _jobs()
    mm = _load('quality_make_models', 'make_models.py')
    return mm, {s: mm.make(str(root / 'tok'), str(root / s), s) for s in ('tiny', 'tinyMoE', 'tinyHybrid')}


def test_quality_models_tokenize_as_the_kit(structure_models, tmp_path, monkeypatch):
    """Every size's model dir, its tokenizer loaded as ms-swift loads it, encodes as the kit tokenizer (make() checks
    it; the hybrid's dir carries the auto_map that keeps transformers 5.19 from swapping in Qwen3_5Tokenizer); a dir
    whose tokenizer maps the words to other ids is refused with what differs."""
    import json
    import shutil
    mm, m = structure_models
    tok = os.path.join(os.path.dirname(m['tiny']['dir']), 'tok')
    for rec in m.values():
        assert mm.tokenizer_problem(rec['dir'], tok) is None
    with open(os.path.join(m['tinyHybrid']['dir'], 'tokenizer_config.json')) as f:
        assert json.load(f)['auto_map'] == {'AutoTokenizer': [None, 'tokenization_kit.KitTokenizer']}
    other = tmp_path / 'other'
    shutil.copytree(m['tiny']['dir'], other)
    with open(other / 'tokenizer.json') as f:
        t = json.load(f)
    words = [w for w in t['model']['vocab'] if w.startswith('w')]
    t['model']['vocab'].update({a: t['model']['vocab'][b] for a, b in zip(words, reversed(words))})
    with open(other / 'tokenizer.json', 'w') as f:
        json.dump(t, f)
    problem = mm.tokenizer_problem(str(other), tok)
    assert problem and 'other ids than the held-out set scores' in problem
    monkeypatch.setattr(mm, 'tokenizer_problem', lambda model_dir, tok_dir: problem)
    with pytest.raises(SystemExit, match='loads its tokenizer as'):
        mm.make(tok, str(tmp_path / 'bad'), 'tiny')


def test_quality_exported_hybrid_keeps_its_tokenizer_class(structure_models, tmp_path):
    """An exported hybrid dir as the export leaves it (the tokenizer files, the auto_map's slots swapped, no
    tokenization_kit.py) fails a trust_remote_code load; keep_tokenizer_class (run.py, after every export) makes it
    encode as the kit; a dense export dir is left as it is."""
    import shutil
    mm, m = structure_models
    tok = os.path.join(os.path.dirname(m['tiny']['dir']), 'tok')
    for size in ('tinyHybrid', 'tiny'):
        hf = tmp_path / size
        hf.mkdir()
        for f in ('tokenizer.json', 'tokenizer_config.json'):
            shutil.copy(os.path.join(m[size]['dir'], f), hf)
        with open(hf / 'tokenizer_config.json') as f:
            cfg = json.load(f)
        if 'auto_map' in cfg:
            cfg['auto_map'] = {'AutoTokenizer': ['tokenization_kit.KitTokenizer', None]}
            with open(hf / 'tokenizer_config.json', 'w') as f:
                json.dump(cfg, f)
    with pytest.raises(OSError, match='tokenization_kit.py'):
        mm.tokenizer_problem(str(tmp_path / 'tinyHybrid'), tok)
    before = (tmp_path / 'tiny' / 'tokenizer_config.json').read_text()
    for size in ('tinyHybrid', 'tiny'):
        mm.keep_tokenizer_class(m[size]['dir'], str(tmp_path / size))
        assert mm.tokenizer_problem(str(tmp_path / size), tok) is None
    assert (tmp_path / 'tiny' / 'tokenizer_config.json').read_text() == before
    assert not (tmp_path / 'tiny' / mm.KIT_TOKENIZER).exists()
    mm.keep_tokenizer_class(m['tinyHybrid']['dir'], str(tmp_path / 'missing'))  # no export: nothing to do
    assert not (tmp_path / 'missing').exists()


def test_quality_structure_sizes_match_the_dense_tiny_per_token(structure_models):
    """tinyMoE: its active non-embedding parameters (attention, router, 2 of 8 experts) and tinyHybrid: all of its
    own (3 Gated DeltaNet + 1 attention layer, the vision tower not counted) within 10 % of tiny's 74,048; the
    FLOPs per position likewise (report.py: active parameters, attention layers, Gated DeltaNet state)."""
    import json
    mm, m = structure_models
    tiny, moe, hyb = m['tiny'], m['tinyMoE'], m['tinyHybrid']
    assert tiny['non_embedding_params'] == 74_048 and tiny['model_type'] == 'llama'
    # MoE by hand: attention 4*64*16 * 2 (q, o) + 2*64*16 * 2 (k, v) + QK-norm 32, router 8*64, norms 128, per layer
    # 8 experts of 3*64*64 (2 active); final norm 64
    per_layer = 12_288 + 32 + 512 + 128
    assert moe['non_embedding_params'] == 2 * (per_layer + 8 * 12_288) + 64 == 222_592
    assert moe['active_non_embedding_params'] == 2 * (per_layer + 2 * 12_288) + 64 == 75_136
    assert (moe['experts'], moe['top_k'], moe['model_type'], moe['structure']) == (8, 2, 'qwen3_moe', 'moe')
    assert hyb['non_embedding_params'] == hyb['active_non_embedding_params'] == 72_360
    assert (hyb['attention_layers'], hyb['gdn_layers'], hyb['gdn_state'], hyb['vision_params']) == (1, 3, 1024, 34_400)
    for x in (moe['active_non_embedding_params'], hyb['non_embedding_params']):
        assert abs(x / tiny['non_embedding_params'] - 1) < 0.1
    assert moe['non_embedding_params'] / moe['active_non_embedding_params'] > 2.9  # 6 of 8 experts idle a token
    for rec in m.values():  # tied embeddings, the kit's vocabulary, the init seed rule's seed
        assert rec['tied_embeddings'] and rec['embedding_params'] == 300 * rec['hidden'] and rec['init_seed'] == 0
        with open(os.path.join(rec['dir'], 'config.json')) as f:
            cfg = json.load(f)
        assert cfg['model_type'] == rec['model_type'] == mm.model_type(rec['size']) and cfg['tie_word_embeddings']
    with open(os.path.join(hyb['dir'], 'config.json')) as f:
        cfg = json.load(f)
    assert cfg['architectures'] == ['Qwen3_5ForConditionalGeneration']
    assert cfg['text_config']['full_attention_interval'] == 4  # mcore-bridge reads it
    assert cfg['text_config']['layer_types'] == ['linear_attention'] * 3 + ['full_attention']
    assert os.path.exists(os.path.join(hyb['dir'], 'preprocessor_config.json'))  # ms-swift loads the processor
    rep = _load('quality_report', 'report.py')
    T = 512
    f_tiny = rep.flops_per_position(tiny, T)
    assert f_tiny == 6 * (74_048 + 300 * 64) + 6 * 2 * 64 * T  # the dense formula as before
    assert rep.flops_per_position(moe, T) == f_tiny + 6 * (75_136 - 74_048)
    assert rep.flops_per_position(hyb, T) == 6 * (72_360 + 300 * 32) + 6 * 1 * 64 * T + 24 * 3 * 1024


def test_quality_structure_flags_reach_the_commands(structure_models, tmp_path):
    """Each size's --model_type reaches the token-level `megatron pt`; the structure's flags (MoE: the load-balancing
    loss; the hybrid's torch Gated DeltaNet, --gdn torch: padded rows, deterministic_mode,
    NVTE_ALLOW_NONDETERMINISTIC_ALGO=0) reach it and both stages of the two-stage recipe (its --dry_run), which takes
    the family from config.json; MoE and Llama runs keep packing."""
    import shlex
    import subprocess
    from types import SimpleNamespace
    _, m = structure_models
    run = _load('quality_run_cmds', 'run.py')
    a = SimpleNamespace(lr=None, logging_steps=5, num_proc=2, cpu=False, seq=512, gbs=32, mbs=32,
                        stage1_batch='tokens', gdn='torch')

    def flag(cmd, name):
        return [cmd[i + 1] for i, x in enumerate(cmd) if x == name]

    det = '{"deterministic_mode": true}'
    for size, mtype, packing, extra in (('tiny', 'llama', 'true', []), ('tinyMoE', 'qwen3_moe', 'true', []),
                                        ('tinyHybrid', 'qwen3_5', 'false', [det])):
        cmd = run.token_level_cmd(a, size, 43, m[size]['dir'], 'd.jsonl', 10, str(tmp_path / size))
        assert flag(cmd, '--model_type') == [mtype] and flag(cmd, '--packing') == [packing]
        assert flag(cmd, '--megatron_extra_kwargs') == extra and flag(cmd, '--seed') == ['43']
        assert flag(cmd, '--padding_free') == (['false'] if extra else [])
        assert flag(cmd, '--moe_aux_loss_coeff') == (['1e-3'] if size == 'tinyMoE' else [])
        assert run.structure_env(a, size) == ({'NVTE_ALLOW_NONDETERMINISTIC_ALGO': '0'} if extra else {})
    cpu = SimpleNamespace(**dict(vars(a), cpu=True))  # the CPU flags already pad: --padding_free once
    assert flag(run.token_level_cmd(cpu, 'tinyHybrid', 42, 'M', 'd', 1, 'o'), '--padding_free') == ['false']
    fla = SimpleNamespace(**dict(vars(a), gdn='fla'))  # flash-linear-attention's kernels: packed rows as the others
    assert flag(run.megatron_common(fla, 'tinyHybrid', 42), '--packing') == ['true']
    assert run.structure_env(fla, 'tinyHybrid') == {}
    files = {'1': str(tmp_path / 's1.jsonl'), '2': str(tmp_path / 's2.jsonl')}
    procs = {size: subprocess.Popen(run.recipe_cmd(a, size, 42, m[size]['dir'], str(tmp_path / f'r_{size}'),
                                                   10_000_000, 4, '2/3', 8, files) + ['--dry_run'],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=str(tmp_path))
             for size in ('tinyHybrid', 'tinyMoE')}  # both at once (each ~20 s of imports)
    for size, p in procs.items():
        out = p.communicate()[0]
        assert p.returncode == 0, out
        stages = [shlex.split(line.split('$ ', 1)[1]) for line in out.splitlines()
                  if '$ ' in line and 'megatron pt ' in line]
        assert len(stages) == 2
        hybrid = size == 'tinyHybrid'
        for cmd in stages:
            assert flag(cmd, '--model_type') == [m[size]['model_type']] and flag(cmd, '--template') == ['llama']
            assert flag(cmd, '--packing') == ['false' if hybrid else 'true']
            assert flag(cmd, '--padding_free') == (['false'] if hybrid else [])
            assert flag(cmd, '--megatron_extra_kwargs') == ([det] if hybrid else [])
            assert flag(cmd, '--moe_aux_loss_coeff') == ([] if hybrid else ['1e-3'])
