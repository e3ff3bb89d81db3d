"""swift-plt: patch-level training (PLT) for Megatron-SWIFT. `pip install .` (not -e: the startup hook below is a
.pth file that only a regular install puts into site-packages)."""
import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = 'swift_plt_startup.pth'


class BuildPyWithStartupHook(build_py):
    """Ship swift_plt_startup.pth at the wheel root, i.e. in site-packages, where Python runs it at start-up."""

    def run(self):
        super().run()
        self.copy_file(PTH, os.path.join(self.build_lib, PTH))


setup(
    name='swift-plt',
    version='0.1.0',
    description='Patch-level training (PLT) for Megatron-SWIFT (ms-swift 4.x)',
    python_requires='>=3.10',
    packages=['swift_plt', 'swift_plt.critic', 'swift_plt.patches'],
    package_dir={'swift_plt.patches': 'patches'},  # the upstream touch points: one module per upstream module
    cmdclass={'build_py': BuildPyWithStartupHook},
    install_requires=[
        'ms-swift[megatron]>=4.6.0,<4.7',
        'mcore-bridge>=1.6.0,<1.7',
        'megatron-core>=0.16.0,<0.17',
        # 4.57.x and 5.x up to ms-swift 4.6's own cap (transformers<5.20.0); verified 4.57.6 and 5.17 / 5.19.
        # swift_plt/hf_compat.py holds the same range (checked at activation) and the 4.x / 5.x RoPE work-around.
        'transformers>=4.57,<5.20',
        'datasets',
        'pyyaml',  # --config of the two-stage recipe (already a dependency of transformers / ms-swift)
        'torch',
    ],
    entry_points={
        'console_scripts': [
            'swift-plt-two-stage = swift_plt.two_stage:main',
            'swift-plt-export-vanilla = swift_plt.vanilla:main',
            'swift-plt-make-tiny = swift_plt.tiny:main',
        ],
    },
    extras_require={'test': ['pytest']},
)
