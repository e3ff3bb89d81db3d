"""The quality benchmark's data cutting (prepare_data.py) and run names (variants.py)."""
import importlib.util
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
    assert v.run_label('b_k2') == '(b) PLT K=2 λ=2/3, N' and v.run_label('c') == '(c) PLT K=4 λ=2/3, 2N'
    for bad in ('d', 'a_k2', 'b_k1', 'b_l11', 'b_l32', 'b_l12_k2', 'b_k', 'bk2', 'B'):
        with pytest.raises(ValueError, match='run'):
            v.parse_run(bad)
