"""The supported upstream versions live in swift_plt/compat/supported.py: setup.py, the installed metadata, the
start-up guard and the README's table must say the same."""
import os
import re

import pytest

from swift_plt.compat import supported, versions

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')
STACK = {'ms-swift': '4.6.0', 'mcore-bridge': '1.6.5', 'transformers': '5.19.0'}


def _requirements(lines):
    """name -> specifier of the upstream requirements among ``lines`` (pip requirement strings)."""
    from packaging.requirements import Requirement
    names = {n.split('[')[0] for n in supported.REQUIREMENTS}
    reqs = [Requirement(line) for line in lines]
    return {r.name: str(r.specifier) for r in reqs if r.name in names and not r.marker}


def _normalised(spec):
    from packaging.specifiers import SpecifierSet
    return str(SpecifierSet(spec))


def test_setup_py_requires_the_supported_versions():
    from setuptools import distutils  # noqa: F401 (setuptools' distutils, also on Python >= 3.12)
    from distutils.core import run_setup
    dist = run_setup(os.path.join(REPO, 'setup.py'), stop_after='init')
    want = {n.split('[')[0]: _normalised(s) for n, s in supported.REQUIREMENTS.items()}
    assert _requirements(dist.install_requires) == want


def test_installed_metadata_requires_the_supported_versions():
    from importlib import metadata
    want = {n.split('[')[0]: _normalised(s) for n, s in supported.REQUIREMENTS.items()}
    assert _requirements(metadata.requires('swift-plt')) == want


def test_readme_table_shows_the_supported_versions():
    with open(os.path.join(REPO, 'README.md')) as f:
        readme = f.read()
    for dist, (shown, verified) in supported.SHOWN.items():
        assert re.search(rf'^\| {re.escape(dist)} \| {re.escape(shown)} \(verified {re.escape(verified)}\)', readme,
                         re.M), dist


@pytest.mark.parametrize('mcore, reason', [
    ('0.16.1', None), ('0.16.0', None), ('0.19.2', None), ('0.19.0', None),
    ('0.17.0', 'not verified'), ('0.18.1', 'not verified'), ('0.20.0', r'supported: 0.16.x or 0.19.x'),
    ('0.15.3', r'supported: 0.16.x or 0.19.x')])
def test_guard_accepts_the_supported_megatron_core_and_refuses_the_rest(monkeypatch, mcore, reason):
    monkeypatch.setattr(versions, 'installed_version', {**STACK, 'megatron-core': mcore}.get)
    if reason is None:
        versions.check_versions(('ms-swift', 'mcore-bridge', 'megatron-core'))
    else:
        with pytest.raises(RuntimeError, match=rf'megatron-core=={re.escape(mcore)}.*{reason}.*'
                                               r'"megatron-core>=0.16.0,<0.20,!=0.17.\*,!=0.18.\*".*SWIFT_PLT_DISABLE=1'):
            versions.check_versions()


def test_installed_stack_is_supported():
    versions.check_versions(('ms-swift', 'mcore-bridge', 'megatron-core'))
