"""Activation: apply the upstream patches when (and only when) ms-swift imports the patched modules.
``swift_plt_startup.pth`` calls ``install()`` at interpreter start (why a startup hook: docs/plugin.md#activation);
``SWIFT_PLT_DISABLE=1`` registers nothing.
"""
import importlib.abc
import os
import sys

from swift_plt.compat.versions import DISABLE_ENV


def disabled() -> bool:
    return os.environ.get(DISABLE_ENV, '').strip().lower() in {'1', 'true', 'yes', 'on'}


class _PatchingLoader(importlib.abc.Loader):

    def __init__(self, loader, patch):
        self.loader = loader
        self.patch = patch

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.patch(module)

    def __getattr__(self, name):  # get_source, get_filename, ... for tracebacks and inspect
        return getattr(self.loader, name)


class _PostImportPatcher(importlib.abc.MetaPathFinder):

    def __init__(self, patches):
        self.patches = patches  # module name -> callable(module)

    def find_spec(self, fullname, path, target=None):
        patch = self.patches.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, 'find_spec'):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, 'exec_module'):
            return spec
        spec.loader = _PatchingLoader(spec.loader, patch)
        return spec


_finder = None


def install() -> bool:
    """Register the post-import patches (idempotent). Modules already imported are patched at once."""
    global _finder
    if disabled():
        return False
    if _finder is not None:
        return True
    from swift_plt.plugin.patches import PATCHES
    hooks = {p.TARGET: p.apply for p in PATCHES}
    _finder = _PostImportPatcher(hooks)
    sys.meta_path.insert(0, _finder)
    for name, apply in hooks.items():
        if name in sys.modules:
            apply(sys.modules[name])
    return True


def _startup():
    """Called by swift_plt_startup.pth at interpreter start; must never break an unrelated interpreter."""
    try:
        install()
    except Exception as e:  # pragma: no cover - defensive: a broken hook must not kill `python`
        print(f'[swift-plt] startup hook failed, plugin inactive: {e!r}', file=sys.stderr)
