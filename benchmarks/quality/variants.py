"""Run names of the quality benchmark (run.py --runs, report.py): what each name trains.

    a              token-level baseline on N tokens
    b, c           the two-stage recipe on N (b) or 2N (c) tokens at the default K=4, λ=2/3
    b_k2, c_l12    the same with another patch size (k2 = K=2) or λ (two digits: l12 = 1/2, l34 = 3/4)
    b_k8_l34       both (sweeps: K = 2, 8; λ = 1/2, 3/4)
"""
import re
from fractions import Fraction

DEFAULT_K, DEFAULT_LAM = 4, Fraction(2, 3)
_NAME = re.compile(r'^(?P<base>[abc])(?:_k(?P<k>[1-9][0-9]*))?(?:_l(?P<num>[1-9])(?P<den>[1-9]))?$')


def parse_run(name):
    """'b_k2_l12' -> ('b', 2, Fraction(1, 2)); 'a' -> ('a', 1, Fraction(0)). ValueError for anything else."""
    m = _NAME.match(name)
    if not m or (m['base'] == 'a' and name != 'a'):
        raise ValueError(f'run {name!r}: expected a, b, c or b/c with _kK and/or _lNM (e.g. b_k2, c_l34, b_k8_l12)')
    if m['base'] == 'a':
        return 'a', 1, Fraction(0)
    K = int(m['k']) if m['k'] else DEFAULT_K
    lam = Fraction(int(m['num']), int(m['den'])) if m['num'] else DEFAULT_LAM
    if K < 2 or not 0 < lam < 1:
        raise ValueError(f'run {name!r}: needs K >= 2 and 0 < λ < 1 (got K={K}, λ={lam})')
    return m['base'], K, lam


def run_label(name):
    """Table and legend label, e.g. '(b) PLT K=2 λ=2/3, N'."""
    base, K, lam = parse_run(name)
    if base == 'a':
        return '(a) token-level, N'
    return f"({base}) PLT K={K} λ={lam}, {'N' if base == 'b' else '2N'}"
