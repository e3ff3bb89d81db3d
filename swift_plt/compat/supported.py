"""The upstream versions swift-plt supports, in one place: setup.py reads this file (no imports, so it runs before
anything is installed), ``swift_plt.compat.versions`` refuses anything else at start-up, and the README's table is
checked against it (tests/compat/test_supported_versions.py)."""

# pip requirement -> specifier. megatron-core 0.17+ ships cp312 wheels only: Python 3.11 gets 0.16.x, Python 3.12
# gets 0.19.x. 0.17.x and 0.18.x are refused (not verified); the hybrids' context parallel needs >= 0.18.
REQUIREMENTS = {
    'ms-swift[megatron]': '>=4.6.0,<4.7',
    'mcore-bridge': '>=1.6.0,<1.7',
    'megatron-core': '>=0.16.0,<0.20,!=0.17.*,!=0.18.*',
    'transformers': '>=4.57,<5.20',  # 4.57.x and 5.x up to ms-swift 4.6's own cap (transformers<5.20.0)
}

# distribution -> (what the README and the refusal show, the versions this release was verified with)
SHOWN = {
    'ms-swift': ('4.6.x', '4.6.0'),
    'mcore-bridge': ('1.6.x', '1.6.5'),
    'megatron-core': ('0.16.x or 0.19.x', '0.16.1 on Python 3.11, 0.19.2 on Python 3.12'),
    'transformers': ('4.57.x or 5.x below 5.20', '4.57.6, 5.17, 5.19'),
}

# Why a version inside the pip range's gaps is refused, by distribution and release prefix.
REFUSED = {
    'megatron-core': {
        '0.17.': 'not verified (swift-plt is verified on 0.16.x and 0.19.x); on Python >= 3.12 use 0.19.x',
        '0.18.': 'not verified (swift-plt is verified on 0.16.x and 0.19.x); on Python >= 3.12 use 0.19.x',
    },
}

# The stacks the CPU suite and the GPU checks ran on (a patch module's VERIFIED names its upstream with these).
VERIFIED_STACKS = 'megatron-core 0.16.1 (Python 3.11, torch 2.13) and 0.19.2 (Python 3.12, torch 2.14)'

# The lowest megatron-core whose Gated DeltaNet has context parallel (the hybrids' CP at patch level).
HYBRID_CP_MIN_MCORE = (0, 18)


def install_requires():
    """setup.py's requirements on the upstream stack."""
    return [name + spec for name, spec in REQUIREMENTS.items()]
