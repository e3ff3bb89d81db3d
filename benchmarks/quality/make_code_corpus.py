"""Corpus B of the continued-pretraining study: Python source code, offline (nothing is downloaded).

    python benchmarks/quality/make_code_corpus.py OUT_DIR [--max_bytes 60e6] [--max_file_bytes 300000]
        [--packages NAME ...] [--no_stdlib]

Writes one .txt file per selected source file (one document each, the source text verbatim but for CRLF -> LF),
named by its path (`stdlib__json__decoder.py.txt`, `pkg__numpy__core__numeric.py.txt`), and OUT_DIR/code_corpus.json
(the Python version, the roots, every file with its bytes and sha256, what was skipped and why, the fingerprint).
prepare_data.py KIT --add_corpus B tokenizes it with the kit's tokenizer (README.md, "Continued pretraining").

Sources: the standard library of the running interpreter (sysconfig's `stdlib` path), and with --packages the
.py files of those installed packages (import names, e.g. numpy). Skipped:
  directories  test, tests, testing, idle_test, __pycache__, site-packages, dist-packages, config-* (build files),
               and hidden ones (.*)
  files        not *.py; test_*.py, *_test.py, conftest.py; _sysconfigdata*.py (the build's paths); symbolic
               links; larger than --max_file_bytes (generated tables, e.g. pydoc_data/topics.py); not valid UTF-8;
               holding a NUL byte; empty or blank
Selection and order: the files that pass are ordered by the sha256 of their path (a stable spread over the tree,
so a --max_bytes cap keeps a sample of every part of it, not the first packages of the alphabet) and each is taken
while it still fits under --max_bytes (bytes of the UTF-8 text). The output does not depend on the file system's
listing order, the time or the machine's paths.

What varies: the Python version (3.11 and 3.12 ship different standard libraries, and patch releases edit files);
distributions that split or patch the standard library (Debian/Ubuntu's python3 puts tkinter, lib2to3, distutils and
venv's bundled pieces in separate packages, and their files may be patched); with --packages, the installed versions
of those packages (code_corpus.json records them). So build B once and carry the kit that prepare_data.py makes from
it to where it is used, and compare the fingerprint this prints: the file count, the bytes and the sha256 of the
files' texts concatenated in the order of their output names. The same Python build gives the same fingerprint on
every machine (stdlib only: the measured builds are listed in README.md).
"""
import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import sysconfig

SKIP_DIRS = {'test', 'tests', 'testing', 'idle_test', '__pycache__', 'site-packages', 'dist-packages'}
MANIFEST = 'code_corpus.json'


def skip_dir(name):
    return name in SKIP_DIRS or name.startswith('.') or name.startswith('config-')


def skip_file_name(name):
    """Why a file is skipped by its name alone, else None."""
    if not name.endswith('.py'):
        return 'not .py'
    if name.startswith('test_') or name.endswith('_test.py') or name == 'conftest.py':
        return 'test file'
    if name.startswith('_sysconfigdata'):
        return 'build paths'
    return None


def walk(root, prefix):
    """(relative path with ``prefix``, absolute path) of the candidate files under ``root``, in sorted order, and the
    counts of what was skipped by name or directory."""
    out, skipped = [], {}
    for d, dirs, files in os.walk(root):
        keep = []
        for x in sorted(dirs):
            if skip_dir(x) or os.path.islink(os.path.join(d, x)):
                skipped['directory'] = skipped.get('directory', 0) + 1
            else:
                keep.append(x)
        dirs[:] = keep
        for f in sorted(files):
            why = skip_file_name(f)
            p = os.path.join(d, f)
            if why is None and os.path.islink(p):
                why = 'symbolic link'
            if why == 'not .py':
                continue  # not counted: .so, .pyc, data files
            if why:
                skipped[why] = skipped.get(why, 0) + 1
                continue
            rel = os.path.relpath(p, root).replace(os.sep, '/')
            out.append((f'{prefix}/{rel}', p))
    return sorted(out), skipped


def read_source(path, max_file_bytes):
    """(text, None) or (None, why skipped)."""
    if os.path.getsize(path) > max_file_bytes:
        return None, 'too large'
    with open(path, 'rb') as f:
        raw = f.read()
    if b'\x00' in raw:
        return None, 'NUL byte'
    try:
        text = raw.decode('utf-8')
    except UnicodeDecodeError:
        return None, 'not UTF-8'
    text = text.replace('\r\n', '\n')
    if not text.strip():
        return None, 'empty'
    return text, None


def out_name(rel):
    return rel.replace('/', '__') + '.txt'


def select(candidates, max_bytes, max_file_bytes):
    """The files taken (rel, text) in hash order under the cap, and the skip counts."""
    skipped = {}
    taken, total = [], 0
    for rel, path in sorted(candidates, key=lambda c: hashlib.sha256(c[0].encode()).hexdigest()):
        text, why = read_source(path, max_file_bytes)
        if why is None and total + len(text.encode('utf-8')) > max_bytes:
            why = 'over the --max_bytes cap'
        if why:
            skipped[why] = skipped.get(why, 0) + 1
            continue
        taken.append((rel, text))
        total += len(text.encode('utf-8'))
    return taken, skipped


def fingerprint(named_texts):
    """{files, bytes, sha256}: sha256 of the texts concatenated in the order of their output names."""
    h, n = hashlib.sha256(), 0
    for _, text in sorted(named_texts):
        b = text.encode('utf-8')
        h.update(b)
        n += len(b)
    return {'files': len(named_texts), 'bytes': n, 'sha256': h.hexdigest()}


def package_root(name):
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise SystemExit(f'--packages {name}: not importable here')
    if spec.submodule_search_locations:
        return list(spec.submodule_search_locations)[0]
    raise SystemExit(f'--packages {name}: a single module, not a package ({spec.origin})')


def package_version(name):
    dists = importlib.metadata.packages_distributions().get(name, [])
    for d in dists:
        try:
            return f'{d} {importlib.metadata.version(d)}'
        except importlib.metadata.PackageNotFoundError:
            pass
    return None


def build(out_dir, max_bytes, max_file_bytes=300_000, packages=(), stdlib=True, stdlib_root=None):
    """Write the corpus; return the manifest dict."""
    roots, candidates, skipped = [], [], {}
    if stdlib:
        roots.append({'prefix': 'stdlib', 'path': stdlib_root or sysconfig.get_paths()['stdlib']})
    for name in packages:
        roots.append({'prefix': f'pkg/{name}', 'path': package_root(name), 'version': package_version(name)})
    for r in roots:
        c, s = walk(r['path'], r['prefix'])
        candidates += c
        for k, v in s.items():
            skipped[k] = skipped.get(k, 0) + v
    taken, s = select(candidates, max_bytes, max_file_bytes)
    for k, v in s.items():
        skipped[k] = skipped.get(k, 0) + v
    names = [out_name(rel) for rel, _ in taken]
    if len(set(names)) != len(names):
        raise SystemExit('two source paths map to one output name')
    if os.path.isdir(out_dir) and os.listdir(out_dir):
        if not os.path.exists(os.path.join(out_dir, MANIFEST)):
            raise SystemExit(f'{out_dir}: not empty and not a corpus of this script ({MANIFEST} missing)')
        for f in os.listdir(out_dir):  # an earlier build: replaced
            if f.endswith('.txt') or f == MANIFEST:
                os.remove(os.path.join(out_dir, f))
    os.makedirs(out_dir, exist_ok=True)
    files = []
    for (rel, text), name in zip(taken, names):
        with open(os.path.join(out_dir, name), 'w', encoding='utf-8', newline='\n') as f:
            f.write(text)
        b = text.encode('utf-8')
        files.append({'path': rel, 'name': name, 'bytes': len(b), 'sha256': hashlib.sha256(b).hexdigest()})
    fp = fingerprint([(name, text) for (_, text), name in zip(taken, names)])
    manifest = {'python': sys.version.split()[0], 'implementation': sys.implementation.name,
                'roots': [{k: v for k, v in r.items() if k != 'path'} for r in roots],
                'max_bytes': max_bytes, 'max_file_bytes': max_file_bytes, 'candidates': len(candidates),
                'skipped': dict(sorted(skipped.items())), 'fingerprint': fp, 'files': files}
    with open(os.path.join(out_dir, MANIFEST), 'w') as f:
        json.dump(manifest, f, indent=1)
    return manifest


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('out')
    ap.add_argument('--max_bytes', type=float, default=60e6, help='cap on the corpus (UTF-8 bytes)')
    ap.add_argument('--max_file_bytes', type=int, default=300_000, help='larger files are skipped (generated data)')
    ap.add_argument('--packages', nargs='*', default=[], help='import names of installed packages to add')
    ap.add_argument('--no_stdlib', action='store_true', help='only the --packages')
    a = ap.parse_args(argv)
    m = build(a.out, int(a.max_bytes), a.max_file_bytes, a.packages, not a.no_stdlib)
    fp = m['fingerprint']
    print(f"Python {m['python']}: {fp['files']} files, {fp['bytes']:,} bytes, sha256 {fp['sha256']} "
          f"(of {m['candidates']} candidates; skipped: {m['skipped']})")
    return 0


if __name__ == '__main__':
    sys.exit(main())
