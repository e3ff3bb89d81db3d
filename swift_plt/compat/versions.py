"""The upstream versions swift-plt was verified against, and the check that refuses anything else."""
from importlib import metadata

from swift_plt.compat import transformers as hf_compat

# distribution -> (verified prefix, human-readable range)
VERIFIED = {
    'ms-swift': ('4.6.', '4.6.x'),
    'mcore-bridge': ('1.6.', '1.6.x'),
    'megatron-core': ('0.16.', '0.16.x'),
}
DISABLE_ENV = 'SWIFT_PLT_DISABLE'
_checked = set()


def installed_version(dist: str):
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def check_versions(required=('ms-swift', )) -> None:
    """Raise RuntimeError naming every installed upstream package outside the verified range (packages in
    ``required`` must be installed; the others are checked only when present, e.g. no mcore-bridge for HF use)."""
    bad = []
    for dist, (prefix, shown) in VERIFIED.items():
        version = installed_version(dist)
        if version is None:
            if dist in required:
                bad.append(f'{dist} is not installed (need {shown})')
        elif not version.startswith(prefix):
            bad.append(f'{dist}=={version} (verified: {shown})')
    version = installed_version('transformers')  # a range across two majors (swift_plt/compat/transformers.py)
    if version is not None and not hf_compat.is_supported(hf_compat.parse_version(version)):
        bad.append(f'transformers=={version} (supported: {hf_compat.SHOWN})')
    if bad:
        raise RuntimeError('swift-plt refuses to patch an unverified stack: ' + '; '.join(bad) +
                           '. Install the verified versions (pip install "ms-swift[megatron]==4.6.*" '
                           '"mcore-bridge==1.6.*" "megatron-core==0.16.*" '
                           f'"transformers{hf_compat.SUPPORTED}"), or set '
                           f'{DISABLE_ENV}=1 to run ms-swift without swift-plt.')


def check_once(required=('ms-swift', )) -> None:
    """``check_versions`` once per process for each set of required packages (every patch calls it)."""
    if required not in _checked:
        check_versions(required)
        _checked.add(required)
