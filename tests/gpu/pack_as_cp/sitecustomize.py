"""For tests/gpu/layouts.sh only, not part of the plugin: the CP2 `--packing` layout's 1-GPU reference.

Under context parallel cp, swift-plt pads every padding-free document to a multiple of 2*cp*K at encode time
(swift_plt/plugin/patches/swift_template.py); a 1-GPU run pads to K. `--packing` bins documents by their encoded length, so the two
runs would pack different rows and their losses could only be compared as "same range". With this directory first on
PYTHONPATH and ``SWIFT_PLT_CPU_PACK_AS_CP=<cp>`` set, every process (torchrun's children included) applies the CPU
harness's patch P15 (tests/harness/patches.py: pad tokens with label -100 after each document, as the CP run adds
them) and nothing else of the harness: the 1-GPU run then packs, and trains on, the CP run's global batch. The same
patch makes the CPU proof exact (tests/layouts/test_layouts_cp_cpu.py::test_megatron_pt_cli_cp2_equals_one_rank[packing]).
"""
import os
import sys

if os.environ.get('SWIFT_PLT_CPU_PACK_AS_CP'):
    sys.path.insert(0, os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')))  # tests/
    from harness import _imports  # noqa: E402
    from harness.patches import _patch_pack_as_cp  # noqa: E402

    _imports.ensure_finder()
    _imports.when_imported('swift.template.base', _patch_pack_as_cp)
