"""Both ways of installing activate the plugin: `pip install .` and `pip install -e .` each put the startup hook
swift_plt_startup.pth into site-packages (listed in the wheel's RECORD, so `pip uninstall` removes it), and a fresh
interpreter of that environment registers the import hook that adds `--patch_size` to ms-swift.

Each case builds a throw-away venv (`--system-site-packages`, for setuptools; `--no-deps`), installs this checkout,
then turns the system site-packages off for the check, so that only what this install put into the venv can
activate the plugin (a swift-plt installed in the base environment, as in CI, cannot make the test pass). The
end-to-end form (a `megatron pt --patch_size 4` in such a venv) is test_cli_cpu's first test run by that venv's
python; `.ci/run` does it after `pip install -e`."""
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
PTH = 'swift_plt_startup.pth'
# one worker under `pytest -n` (.ci/run): both cases build from this checkout (build/, *.egg-info): not at once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group('install')]

CHECK = '''
import json, sys
import swift_plt
print(json.dumps({'hook': any(type(f).__name__ == '_PostImportPatcher' for f in sys.meta_path),
                  'swift_plt': swift_plt.__file__}))
'''


def _run(cmd, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert proc.returncode == 0, (cmd, proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


def _builds_wheels_offline(python):
    """Whether `python`'s setuptools can build this checkout's wheel without pip's isolated build env: setuptools
    >= 70.1 has `bdist_wheel` itself; 64 <= setuptools < 70.1 (PEP 660) needs the `wheel` package beside it (a
    Python 3.11 base with setuptools 65.5 and no `wheel` failed here with "invalid command 'bdist_wheel'")."""
    code = ('import importlib.util as u, setuptools; v = int(setuptools.__version__.split(".")[0]); '
            'print(bool(u.find_spec("setuptools.command.bdist_wheel")) or (v >= 64 and bool(u.find_spec("wheel"))))')
    return subprocess.run([python, '-c', code], capture_output=True, text=True).stdout.strip() == 'True'


@pytest.mark.parametrize('editable', [True, False], ids=['pip_install_e', 'pip_install'])
def test_install_activates_the_plugin(tmp_path, editable):
    venv = tmp_path / 'venv'
    _run([sys.executable, '-m', 'venv', '--system-site-packages', str(venv)])
    python = str(venv / 'bin' / 'python')
    # offline with the venv's setuptools when it can build (PEP 660) wheels, else pip's isolated build env
    isolation = ['--no-build-isolation'] if _builds_wheels_offline(python) else []
    _run([python, '-m', 'pip', 'install', '-q', '--no-deps', *isolation, *(['-e'] if editable else []), REPO],
         cwd=str(tmp_path))
    purelib = _run([python, '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])']).stdout.strip()
    assert os.path.isfile(os.path.join(purelib, PTH)), sorted(os.listdir(purelib))
    with open(os.path.join(purelib, 'swift_plt-0.1.0.dist-info', 'RECORD')) as f:
        assert any(line.split(',')[0] == PTH for line in f)  # `pip uninstall` removes it

    cfg = venv / 'pyvenv.cfg'  # from here on only the venv's own site-packages
    cfg.write_text(cfg.read_text().replace('include-system-site-packages = true',
                                           'include-system-site-packages = false'))
    env = {k: v for k, v in os.environ.items() if k not in ('SWIFT_PLT_DISABLE', 'PYTHONPATH')}
    got = json.loads(_run([python, '-c', CHECK], env=env, cwd=str(tmp_path)).stdout)
    assert got['hook'], got
    where = REPO if editable else purelib  # -e: the code is this checkout's
    assert os.path.realpath(got['swift_plt']).startswith(os.path.realpath(where) + os.sep), (got, where)
    off = json.loads(_run([python, '-c', CHECK], env=dict(env, SWIFT_PLT_DISABLE='1'), cwd=str(tmp_path)).stdout)
    assert not off['hook']  # the opt-out still works

    _run([python, '-m', 'pip', 'uninstall', '-y', '-q', 'swift-plt'])
    assert not os.path.exists(os.path.join(purelib, PTH))
    proc = _run([python, '-c', 'pass'], env=env)  # no stale hook left behind that fails at every start
    assert proc.stderr == ''
