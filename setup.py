"""swift-plt: patch-level training (PLT) for Megatron-SWIFT. `pip install .` or `pip install -e .`: both put the
startup hook swift_plt_startup.pth into site-packages (see swift_plt/plugin/import_hook.py)."""
import os
import runpy

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

PTH = 'swift_plt_startup.pth'
HERE = os.path.dirname(os.path.abspath(__file__))
# the supported upstream versions, read without importing swift_plt (nothing is installed yet)
SUPPORTED = runpy.run_path(os.path.join(HERE, 'swift_plt', 'compat', 'supported.py'))


class BuildPyWithStartupHook(build_py):
    """Ship swift_plt_startup.pth at the wheel root, i.e. in site-packages, where Python runs it at start-up."""

    def run(self):
        super().run()
        if not getattr(self, 'editable_mode', False):  # an editable wheel: EditableWheelWithStartupHook
            self.copy_file(PTH, os.path.join(self.build_lib, PTH))


cmdclass = {'build_py': BuildPyWithStartupHook}

try:  # setuptools >= 64: `pip install -e .` builds a PEP 660 editable wheel with this command
    from setuptools.command.editable_wheel import editable_wheel
except ImportError:  # older setuptools: pip runs `setup.py develop`, which has no startup hook (README: set-up)
    editable_wheel = None

if editable_wheel is not None:

    class _StrategyWithStartupHook:
        """Wraps setuptools' editable strategy (the object that writes the editable wheel's own .pth / finder):
        also writes swift_plt_startup.pth at the wheel root, so that it lands in site-packages and is listed in
        the wheel's RECORD (pip uninstall removes it). No setuptools strategy can do that itself: files in
        build_lib are only linked or redirected to, never put into site-packages."""

        def __init__(self, strategy):
            self.strategy = strategy
            self.written = False

        def __call__(self, wheel, files, mapping):
            self.strategy(wheel, files, mapping)
            wheel.write(os.path.join(HERE, PTH), PTH)
            self.written = True

        def __enter__(self):
            self.strategy.__enter__()
            return self

        def __exit__(self, *exc):
            return self.strategy.__exit__(*exc)

    class EditableWheelWithStartupHook(editable_wheel):
        """`pip install -e .`: the editable wheel ships swift_plt_startup.pth too. It imports swift_plt through the
        editable finder, whose own ``__editable__.swift_plt-*.pth`` sorts (and so runs) before it.

        ``_select_strategy`` is setuptools-internal (the same from setuptools 64 on; used with 65.5 and 84.2);
        ``run`` checks that it was called, so that a setuptools which stops calling it fails here with what to do,
        instead of installing a plugin that silently never activates."""

        def _select_strategy(self, *args, **kwargs):
            self._startup_hook = _StrategyWithStartupHook(super()._select_strategy(*args, **kwargs))
            return self._startup_hook

        def run(self):
            self._startup_hook = None
            super().run()
            if self._startup_hook is None or not self._startup_hook.written:
                raise RuntimeError(
                    f'swift-plt: this setuptools built an editable wheel without the startup hook {PTH} (its '
                    'editable_wheel internals changed), so ms-swift would reject --patch_size. Install without -e '
                    '(`pip install .`), or build the editable install with setuptools 64-84 '
                    '(`pip install "setuptools>=64,<85" && pip install --no-build-isolation -e .`).')

    cmdclass['editable_wheel'] = EditableWheelWithStartupHook


setup(
    name='swift-plt',
    version='0.1.0',
    description='Patch-level training (PLT) for Megatron-SWIFT (ms-swift 4.x)',
    python_requires='>=3.10',  # megatron-core 0.16 on Python 3.10 / 3.11, 0.19 on 3.12
    packages=find_packages(include=['swift_plt', 'swift_plt.*']),
    cmdclass=cmdclass,
    install_requires=[
        # ms-swift, mcore-bridge, megatron-core, transformers: swift_plt/compat/supported.py (the one place)
        *SUPPORTED['install_requires'](),
        'datasets',
        'pyyaml',  # --config of the two-stage recipe (already a dependency of transformers / ms-swift)
        'torch',
        'numpy',  # host-side batch checks (swift_plt.patch_level); already a dependency of megatron-core / transformers
    ],
    entry_points={
        'console_scripts': [
            'swift-plt-two-stage = swift_plt.recipe.cli:main',
            'swift-plt-export-vanilla = swift_plt.recipe.export:main',
            'swift-plt-make-tiny = swift_plt.tools.tiny:main',
        ],
    },
    # triton: tests/*/test_plt_triton*.py run the fused loss kernel in Triton's CPU interpreter (CUDA torch ships it).
    # Bounded to the range tested: 3.9.0 (CPU suite, torch 2.13) and 3.6.0 (GPU kit, torch 2.11).
    # pytest-xdist: .ci/run runs the CPU suite on 2 workers (`pytest -n 2 --dist loadgroup`); pytest 9.2 drops
    # xdist 3.8's xdist_group marks (tests/conftest.py stops there)
    extras_require={
        'test': ['pytest<9.2', 'pytest-xdist',
                 'triton>=3.6,<4; platform_system == "Linux" and platform_machine == "x86_64"']
    },
)
