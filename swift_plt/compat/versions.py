"""The check that refuses an upstream stack outside the supported versions (swift_plt/compat/supported.py)."""
from importlib import metadata

from swift_plt.compat import supported

DISABLE_ENV = 'SWIFT_PLT_DISABLE'
_checked = set()


def installed_version(dist: str):
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def requirement(dist: str) -> str:
    """The pip specifier of ``dist`` (``ms-swift`` for ``ms-swift[megatron]``)."""
    return next(spec for name, spec in supported.REQUIREMENTS.items() if name.split('[')[0] == dist)


def refusal(dist: str, version: str):
    """Why ``dist==version`` is refused (None: supported)."""
    from packaging.specifiers import SpecifierSet  # a dependency of transformers and setuptools
    from packaging.version import Version
    shown = supported.SHOWN[dist][0]
    for prefix, reason in supported.REFUSED.get(dist, {}).items():
        if version.startswith(prefix):
            return f'{dist}=={version}: {reason}'
    if Version(version) not in SpecifierSet(requirement(dist), prereleases=True):
        return f'{dist}=={version} (supported: {shown})'
    return None


def megatron_core_at_least(release: tuple) -> bool:
    """True if the installed megatron-core is ``release`` (e.g. ``(0, 18)``) or newer."""
    from packaging.version import Version
    version = installed_version('megatron-core')
    return version is not None and Version(version).release[:len(release)] >= tuple(release)


def gdn_context_parallel_problem():
    """Why the installed megatron-core cannot run a Gated-DeltaNet hybrid under context parallel (None: it can).
    megatron-core 0.18 added CP to its Gated DeltaNet (an all-to-all from sequence to heads, per document in THD),
    which mcore-bridge's ``GatedDeltaNet`` (USE_MCORE_GDN=1, the default) runs; 0.16 / 0.17 have none, at any K."""
    if megatron_core_at_least(supported.HYBRID_CP_MIN_MCORE):
        return None
    need = '.'.join(map(str, supported.HYBRID_CP_MIN_MCORE))
    return (f'--context_parallel_size > 1 with Gated DeltaNet layers needs megatron-core >= {need} (installed: '
            f'{installed_version("megatron-core")}; its Gated DeltaNet has no context parallel, at any K; use '
            f'tensor, pipeline or expert parallel, or megatron-core >= {need})')


def check_versions(required=('ms-swift', )) -> None:
    """Raise RuntimeError naming every installed upstream package outside the supported range (packages in
    ``required`` must be installed; the others are checked only when present, e.g. no mcore-bridge for HF use)."""
    bad = []
    for dist in supported.SHOWN:
        version = installed_version(dist)
        if version is None:
            if dist in required:
                bad.append(f'{dist} is not installed (need {supported.SHOWN[dist][0]})')
        else:
            reason = refusal(dist, version)
            if reason:
                bad.append(reason)
    if bad:
        pins = ' '.join(f'"{name}{spec}"' for name, spec in supported.REQUIREMENTS.items())
        raise RuntimeError('swift-plt refuses to patch an unverified stack: ' + '; '.join(bad) +
                           f'. Install the supported versions (pip install {pins}), or set '
                           f'{DISABLE_ENV}=1 to run ms-swift without swift-plt.')


def check_once(required=('ms-swift', )) -> None:
    """``check_versions`` once per process for each set of required packages (every patch calls it)."""
    if required not in _checked:
        check_versions(required)
        _checked.add(required)
