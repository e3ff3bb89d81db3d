#!/usr/bin/env python3
"""What the GPU checks need, checked before anything runs (tests/gpu/lib.sh calls it from outside the repo, so
``swift_plt`` is found only where it is installed).

    python3 tests/gpu/prereq.py --repo REPO [--commands megatron,swift,...] [--dry-run]

Prints one line per item (``ok``, ``WARN`` or ``MISSING`` with what to install) and, last, ``NGPU=<n>``: the CUDA
devices torch sees (``CUDA_VISIBLE_DEVICES`` applies). Exit code 2 when something required is missing or no GPU is
visible. ``--dry-run`` (CPU rehearsal under tests/harness) requires neither CUDA nor Transformer Engine.
"""
import argparse
import filecmp
import importlib
import importlib.util
from importlib import metadata
import os
import shutil
import sys

SWIFT = 'pip install "ms-swift[megatron]==4.6.*"'
TE = 'Transformer Engine 2.11 for your CUDA: pip install --no-build-isolation "transformer_engine[pytorch]==2.11.*"'
HINT = {'transformer_engine': TE}


def differing_files(installed, checkout):
    """Relative paths of .py files that differ between the installed package and the checkout's."""
    out = []
    for root, dirs, files in os.walk(checkout):
        dirs[:] = [d for d in dirs if d != '__pycache__']
        for name in files:
            if not name.endswith('.py'):
                continue
            rel = os.path.relpath(os.path.join(root, name), checkout)
            other = os.path.join(installed, rel)
            if not os.path.exists(other) or not filecmp.cmp(os.path.join(root, name), other, shallow=False):
                out.append(rel)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--repo', required=True)
    ap.add_argument('--commands', default='megatron,swift,torchrun')
    ap.add_argument('--dry-run', action='store_true')
    a = ap.parse_args()
    missing, ngpu = [], 0

    def ok(msg):
        print(f'ok      {msg}')

    def need(msg):
        print(f'MISSING {msg}')
        missing.append(msg)

    try:
        import torch
        cuda = torch.cuda.is_available()
        ngpu = torch.cuda.device_count() if cuda else 0
        names = sorted({torch.cuda.get_device_name(i) for i in range(ngpu)})
        if ngpu:
            ok(f'torch {torch.__version__}, CUDA {torch.version.cuda}: {ngpu} GPU(s) visible ({", ".join(names)})')
        elif a.dry_run:
            ok(f'torch {torch.__version__}: no GPU (dry run on CPU)')
        else:
            why = ('torch is a CPU-only build: install a CUDA build of torch' if torch.version.cuda is None else
                   'no CUDA GPU visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)')
            need(f'GPU: {why}; these checks run on GPUs only')
    except Exception as e:  # noqa: BLE001 (any import failure is the message)
        need(f'torch: import failed ({e!r}): install a CUDA build of torch')

    # installed? (package metadata or the module's location: quick, imports nothing)
    dists = [('ms-swift', 'swift'), ('megatron-core', 'megatron.core'), ('mcore-bridge', 'mcore_bridge')]
    if not a.dry_run:
        dists.insert(0, ('transformer_engine', 'transformer_engine'))
    found = []
    for dist, module in dists:
        try:
            found.append((dist, module, metadata.version(dist)))
        except metadata.PackageNotFoundError:
            if importlib.util.find_spec(module.split('.')[0]) is not None:  # e.g. on PYTHONPATH, no metadata
                found.append((dist, module, '(version unknown)'))
            else:
                need(f'{dist} is not installed: {HINT.get(dist, SWIFT)}')
    # loadable? (only where it can matter: a GPU is visible and nothing is missing; Transformer Engine and
    # mcore-bridge load CUDA libraries at import)
    for dist, module, version in found:
        if missing or a.dry_run and module == 'mcore_bridge':
            ok(f'{dist} {version} (installed)')
            continue
        try:
            importlib.import_module(module)
            ok(f'{dist} {version}')
        except Exception as e:  # noqa: BLE001 (any import failure is the message)
            need(f'{dist} {version} does not import ({e!r}): {HINT.get(dist, SWIFT)}')

    try:
        import swift_plt
        pkg = os.path.dirname(os.path.abspath(swift_plt.__file__))
        checkout = os.path.join(os.path.abspath(a.repo), 'swift_plt')
        ok(f'swift_plt {swift_plt.__version__} from {pkg}')
        if os.environ.get('SWIFT_PLT_DISABLE'):
            print('WARN    SWIFT_PLT_DISABLE is set: the plugin is off in every run')
        else:
            import swift_plt.plugin.import_hook as hook
            if hook._finder is None:
                need('swift_plt startup hook inactive (swift_plt_startup.pth not run): reinstall with pip install . '
                     'from the repository root')
        if os.path.realpath(pkg) != os.path.realpath(checkout) and os.path.isdir(checkout):
            diff = differing_files(pkg, checkout)
            if diff:
                print(f'WARN    the installed swift_plt differs from this checkout in {len(diff)} file(s) '
                      f'(e.g. {diff[0]}): these checks test the installed copy; pip install . to test this tree')
    except Exception as e:  # noqa: BLE001
        need(f'swift_plt: import failed ({e!r}): pip install . from the repository root')

    for cmd in filter(None, a.commands.split(',')):
        path = shutil.which(cmd)
        if path:
            ok(f'{cmd}: {path}')
        else:
            hint = 'pip install . from the repository root' if cmd.startswith('swift-plt') else SWIFT
            need(f'command {cmd} not on PATH: {hint}')

    print(f'NGPU={ngpu}')
    return 2 if missing else 0


if __name__ == '__main__':
    sys.exit(main())
