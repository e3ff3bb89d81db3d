"""tests/gpu/pack_as_cp/sitecustomize.py, the CP2 --packing reference of the GPU layout checks."""
import os

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')


def test_gpu_pack_as_cp_site_applies_harness_p15_only_when_asked():
    """tests/gpu/pack_as_cp/sitecustomize.py (layouts.sh's CP2 --packing reference): with SWIFT_PLT_CPU_PACK_AS_CP
    set, a fresh process's Template._encode_truncated is the harness's P15 wrapper around swift-plt's patched one
    (the wrapper the CPU proof test_megatron_pt_cli_cp2_equals_one_rank[packing] uses); without it, untouched."""
    import subprocess
    import sys
    code = ('import swift.template.base as b; f = b.Template._encode_truncated; '
            'print(f.__code__.co_filename); print(f.__wrapped__.__code__.co_filename)')
    out = {}
    for cp in ('', '2'):
        env = dict(os.environ, PYTHONPATH=os.path.join(REPO, 'tests', 'gpu', 'pack_as_cp'), SWIFT_PLT_CPU_PACK_AS_CP=cp)
        proc = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[cp] = proc.stdout.split()
    assert out['2'][0].endswith(os.path.join('tests', 'harness', 'patches.py'))
    assert 'swift_template' in out['2'][1] and 'swift_template' in out[''][0]  # P15 wraps swift-plt's patch

