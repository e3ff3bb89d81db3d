"""CPU checks of summarize.py's run comparisons (the K=1 identity's verdicts): `same` = identical printed strings,
`close` = within a relative tolerance, each line naming the card that ran the run."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import summarize  # noqa: E402


def run_dir(tmp_path, name, losses, grad_norms, gpu=None):
    d = tmp_path / name
    (d / 'v0-x').mkdir(parents=True)
    with open(d / 'v0-x' / 'logging.jsonl', 'w') as f:
        for i, (loss, gn) in enumerate(zip(losses, grad_norms), 1):
            # ms-swift's line: floats as printed (8 decimals)
            f.write(json.dumps({'loss': loss, 'grad_norm': gn, 'iteration': f'{i}/{len(losses)}'}) + '\n')
    (d / 'rc').write_text('0')
    (d / 'secs').write_text('50')
    if gpu:
        (d / 'gpu').write_text(gpu)
    return f'{name}={d}'


LOSS, GN = [9.06331825, 8.5, 7.25], [1.96684551, 1.5, 1.25]


def test_same_is_identical_strings_only(tmp_path, capsys):
    a = run_dir(tmp_path, 'a', LOSS, GN, gpu='GPU0 NVIDIA H100 GPU-aaa')
    assert summarize.main(['same', a, run_dir(tmp_path, 'b', LOSS, GN, gpu='GPU0 NVIDIA H100 GPU-aaa')]) == 0
    out = capsys.readouterr().out
    assert 'IDENTICAL' in out and out.count('on GPU0 NVIDIA H100 GPU-aaa') == 2
    # one grad_norm differs in its last printed digit at step 3: different, and where
    assert summarize.main(['same', a, run_dir(tmp_path, 'c', LOSS, GN[:2] + [1.25000001])]) == 1
    assert 'first difference at step 3' in capsys.readouterr().out
    assert summarize.main(['same', a, run_dir(tmp_path, 'd', LOSS[:2], GN[:2])]) == 1  # a run cut short


def test_close_is_within_the_relative_tolerance(tmp_path, capsys):
    a = run_dir(tmp_path, 'a', LOSS, GN, gpu='GPU0')
    near = run_dir(tmp_path, 'b', LOSS, [GN[0] * (1 + 5e-4)] + GN[1:], gpu='GPU1')
    assert summarize.main(['close', '1e-3', a, near]) == 0
    out = capsys.readouterr().out
    assert 'CLOSE' in out and 'grad_norm 5.00e-04' in out and 'on GPU1' in out
    assert summarize.main(['close', '1e-4', a, near]) == 1
    assert summarize.main(['close', '1e-3', a, run_dir(tmp_path, 'c', LOSS[:2] + [LOSS[2] * 1.01], GN)]) == 1
    assert summarize.main(['close', '1e-3', a, run_dir(tmp_path, 'd', LOSS[:2], GN[:2])]) == 1


def test_agree_is_bit_for_bit_where_upstream_agrees_with_itself(tmp_path, capsys):
    """Upstream's repeat splits at step 3 (as its step-9 grad norm did on 2xH200): PLT must equal stock on steps 1-2
    bit for bit and be close after; a difference inside the agreeing steps fails, however small."""
    split = GN[:2] + [1.25 * (1 + 1e-6)]
    stock, rep = run_dir(tmp_path, 'stock', LOSS, GN), run_dir(tmp_path, 'rep', LOSS, split)
    assert summarize.main(['agree', '1e-3', '2', run_dir(tmp_path, 'a', LOSS, split), stock, rep]) == 0
    assert 'identical to rep at every step -> AGREES' in capsys.readouterr().out
    assert summarize.main(['agree', '1e-3', '2', run_dir(tmp_path, 'b', LOSS, GN[:2] + [1.2501]), stock, rep]) == 0
    assert summarize.main(['agree', '1e-5', '2', run_dir(tmp_path, 'c', LOSS, GN[:2] + [1.2501]), stock, rep]) == 1
    mutated = run_dir(tmp_path, 'd', LOSS, [GN[0], 1.50000001, GN[2]])  # one digit at step 2
    assert summarize.main(['agree', '1e-3', '2', mutated, stock, rep]) == 1
    assert 'differs at step 2 where upstream agrees with itself' in capsys.readouterr().out
    assert summarize.main(['agree', '1e-3', '3', run_dir(tmp_path, 'e', LOSS, GN), stock, rep]) == 1  # too few steps
