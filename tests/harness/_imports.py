"""Import machinery of the CPU harness: stand-in modules and post-import hooks.

One ``sys.meta_path`` finder (``HarnessFinder``) does two jobs:

* **Stand-ins.** ``transformer_engine`` and ``triton`` are not installed on the CPU machine, but some upstream
  modules import them unconditionally at module level. A stand-in is served only to the top-level code of modules
  the caller allowed (``add_standin``); everyone else (megatron-core's ``HAVE_TE`` probes, transformers, torch, and
  imports inside functions, e.g. mcore-bridge's ``_is_fp8_param``) still gets ``ModuleNotFoundError`` and so keeps
  seeing "TE / triton absent". A stand-in is in ``sys.modules`` only while an allowed importer executes: it is
  removed when that module finishes (``watch_prefixes``), and hidden from any module imported in the meantime
  (``_HookedLoader(hide_standins=True)``), so no one else can pick it up from ``sys.modules``.
  Stand-in modules are empty: any attribute not explicitly provided raises ``AttributeError`` (hence ``ImportError``
  for ``from ... import``) naming the harness, so real use of TE/triton fails loudly.

* **Post-import hooks.** ``when_imported(name, fn)`` runs ``fn(module)`` right after ``name`` has executed (or at once
  if it is already imported). The harness patches upstream modules this way, so ``install()`` itself imports
  nothing heavy and a process that never touches megatron pays nothing.

Composes with other post-import finders (swift-plt's ``activation``): to find the real spec this finder asks the
other finders in ``sys.meta_path`` and wraps whatever loader they return.
"""
import importlib.abc
import importlib.machinery
import sys
import threading
import types
from typing import Callable, Dict, List, Optional, Tuple

_HOOKS: Dict[str, List[Callable[[types.ModuleType], None]]] = {}
# root package name -> (importer predicate, {submodule fullname: {attr: value}})
_STANDINS: Dict[str, Tuple[Callable[[str], bool], Dict[str, dict]]] = {}
_STANDIN_CACHE: Dict[str, types.ModuleType] = {}  # every stand-in module ever served, by full name
# Modules (prefixes) whose loaders are wrapped so that stand-ins are dropped after they execute.
_WATCHED_PREFIXES: Tuple[str, ...] = ()
_guard = threading.local()  # set while this finder asks the other finders (no recursion into itself)


class StandInModule(types.ModuleType):
    """An empty module that fails loudly on any attribute it was not given."""

    def __getattr__(self, name):
        if name.startswith('__') and name.endswith('__'):
            raise AttributeError(name)
        raise AttributeError(f'{self.__name__}.{name} is not available: {self.__name__.split(".")[0]} is a '
                             f'stand-in module of the CPU test harness (tests/harness), which only lets upstream '
                             f'code import it; nothing in it can be used on CPU.')


class _StandInLoader(importlib.abc.Loader):

    def create_module(self, spec):
        return _STANDIN_CACHE.get(spec.name) or StandInModule(spec.name)

    def exec_module(self, module):
        if _STANDIN_CACHE.get(module.__name__) is module:
            return  # served before (and dropped from sys.modules since): already populated
        module.__path__ = []  # a package, so that `import transformer_engine.pytorch` works
        root = module.__name__.split('.')[0]
        for attr, value in _STANDINS[root][1].get(module.__name__, {}).items():
            setattr(module, attr, value)
        _STANDIN_CACHE[module.__name__] = module


class _HookedLoader(importlib.abc.Loader):
    """Delegates to the real loader; around ``exec_module`` it hides or drops stand-ins and runs post-import hooks.

    ``hide_standins``: the module is being imported while some stand-in sits in ``sys.modules`` (an allowed
    importer is half-way through executing); it must not see it, so stand-ins are taken out for its execution and
    put back afterwards. Otherwise stand-ins are dropped after the module executes.
    """

    def __init__(self, loader, hide_standins: bool):
        self._loader = loader
        self._hide_standins = hide_standins

    def __getattr__(self, name):  # get_source, get_filename, is_package, ... of the real loader
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        hidden = _drop_standins() if self._hide_standins else {}
        try:
            self._loader.exec_module(module)
        finally:
            _drop_standins()
            sys.modules.update(hidden)
        for fn in _HOOKS.get(module.__name__, ()):
            fn(sys.modules.get(module.__name__, module))


def _importer() -> Tuple[str, bool]:
    """(``__name__`` of the module whose code runs the current import statement, whether that code is the
    module's top level rather than a function)."""
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        name = frame.f_globals.get('__name__', '')
        if not (filename.startswith('<frozen importlib') or name.startswith('importlib') or name == __name__):
            return name, frame.f_code.co_name == '<module>'
        frame = frame.f_back
    return '', False


def _drop_standins() -> Dict[str, types.ModuleType]:
    """Remove stand-ins from ``sys.modules``; return what was removed."""
    dropped = {n: sys.modules[n] for n in _STANDIN_CACHE if isinstance(sys.modules.get(n), StandInModule)}
    for name in dropped:
        del sys.modules[name]
    return dropped


class HarnessFinder(importlib.abc.MetaPathFinder):

    def find_spec(self, fullname, path=None, target=None):
        if getattr(_guard, 'busy', False):
            return None
        root = fullname.split('.')[0]
        if root in _STANDINS:
            importer, top_level = _importer()
            if not (top_level and _STANDINS[root][0](importer)):
                return None  # not an allowed importer: behave as if absent
            return importlib.machinery.ModuleSpec(fullname, _StandInLoader(), is_package=True)
        standins_present = any(isinstance(sys.modules.get(name), StandInModule) for name in _STANDIN_CACHE)
        if standins_present or fullname in _HOOKS or fullname.startswith(_WATCHED_PREFIXES):
            spec = self._real_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and not isinstance(spec.loader, _HookedLoader):
                spec.loader = _HookedLoader(spec.loader, hide_standins=standins_present)
            return spec
        return None

    def _real_spec(self, fullname, path, target):
        _guard.busy = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, 'find_spec'):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    return spec
            return None
        finally:
            _guard.busy = False


_FINDER = HarnessFinder()


def ensure_finder():
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def add_standin(root: str, allowed_importer: Callable[[str], bool], attrs: Optional[Dict[str, dict]] = None):
    """Serve an empty package ``root`` (and any ``root.*``) to the top-level code of modules for which
    ``allowed_importer(module_name)`` holds. Imports from inside functions (run later, outside any module's
    execution) never get a stand-in: they see the package as absent, so the stand-in cannot linger in sys.modules.

    ``attrs`` maps a module's full name to attributes it should carry (e.g. decorators evaluated at import time).
    """
    _STANDINS[root] = (allowed_importer, attrs or {})


def watch_prefixes(*prefixes: str):
    """Wrap the loaders of these packages' modules so that stand-ins are dropped after each one executes."""
    global _WATCHED_PREFIXES
    _WATCHED_PREFIXES = tuple(sorted(set(_WATCHED_PREFIXES) | set(prefixes)))


def when_imported(name: str, fn: Callable[[types.ModuleType], None]):
    """Run ``fn(module)`` after module ``name`` executes; at once if it already has."""
    _HOOKS.setdefault(name, []).append(fn)
    if name in sys.modules:
        fn(sys.modules[name])
