"""The startup hook and the patches of ms-swift modules that import without Megatron (template, SFT pipeline),
through the real ms-swift code: patched vs original, K=1 unchanged, version and upstream-moved guards."""
import os
import subprocess
import sys

import pytest
import torch

from harness.dist import cpu_threads
from harness.tiny import make_tiny_llama
from swift_plt.patch_level.patch_size import patch_size_of

ENV = dict(os.environ, HF_HUB_OFFLINE='1', TRANSFORMERS_OFFLINE='1', OMP_NUM_THREADS=cpu_threads())


def _python(code, **env):
    return subprocess.run([sys.executable, '-c', code], env=dict(ENV, **env), capture_output=True, text=True,
                          timeout=300)


def test_startup_hook_patches_on_import_and_opt_out():
    """Patched on import, and the plugin's model types registered (no --custom_register_path); opted out: neither."""
    code = ('import swift.template.base as b, swift.pipelines.train.sft as s; from swift.model import MODEL_MAPPING;'
            'print(getattr(b.Template._encode_truncated, "_swift_plt", False),'
            ' getattr(s.SwiftSft._prepare_template, "_swift_plt", False),'
            ' "qwen3_moe_critic" in MODEL_MAPPING, "llama3_2_plt" in MODEL_MAPPING)')
    assert _python(code).stdout.split()[-4:] == ['True', 'True', 'True', 'True']
    assert _python(code, SWIFT_PLT_DISABLE='1').stdout.split()[-4:] == ['False', 'False', 'False', 'False']


def test_startup_hook_does_not_import_heavy_modules():
    out = _python('import sys; print(sorted(m for m in ("torch", "swift", "megatron") if m in sys.modules))')
    assert out.stdout.strip().splitlines()[-1] == '[]', out.stdout + out.stderr


def test_version_guard_names_versions(monkeypatch):
    from swift_plt.compat import versions
    monkeypatch.setattr(versions, 'installed_version', lambda d: {'ms-swift': '4.7.0', 'mcore-bridge': '1.6.5'}.get(d))
    with pytest.raises(RuntimeError, match=r'ms-swift==4.7.0 \(supported: 4.6.x\).*SWIFT_PLT_DISABLE=1'):
        versions.check_versions()
    with pytest.raises(RuntimeError, match=r'megatron-core is not installed'):
        versions.check_versions(('ms-swift', 'megatron-core'))


def test_upstream_moved_guard():
    from swift_plt.compat.guard import guard

    class Upstream:

        def f(self, data):
            pass

    assert guard(Upstream, 'f', ['self', 'data'], 'x 1.0') is Upstream.f
    with pytest.raises(RuntimeError, match='upstream moved: `g` not found'):
        guard(Upstream, 'g', ['self'], 'x 1.0')
    with pytest.raises(RuntimeError, match='upstream changed'):
        guard(Upstream, 'f', ['self', 'batch'], 'x 1.0')


@pytest.fixture(scope='module')
def template(tmp_path_factory):
    model_dir = make_tiny_llama(str(tmp_path_factory.mktemp('tiny')))
    from swift_plt.plugin.register import register_swift
    register_swift()
    from swift.model import get_model_processor
    from swift.template import get_template
    _, processor = get_model_processor(model_dir, model_type='llama3_2_plt', load_model=False, download_model=False)
    tpl = get_template(processor, template_type='llama', use_chat_template=False, max_length=64, loss_scale='all')
    tpl.set_mode('train')
    return tpl


ROWS = [{'messages': [{'role': 'assistant', 'content': text}]}
        for text in ['the quick brown fox jumps', 'a', 'over the lazy dog, twice over the lazy dog', 'hello world']]


def test_template_k1_is_upstream(template):
    from swift.template.base import Template
    assert patch_size_of(template) == 1
    for row in ROWS:
        got = template.encode(row, return_length=True)
        template._encode_truncated = Template._encode_truncated.__wrapped__.__get__(template)  # the original
        try:
            ref = template.encode(row, return_length=True)
        finally:
            del template._encode_truncated
        assert got == ref


@pytest.mark.parametrize('k', [2, 3, 4])
def test_template_pads_each_document_to_k(template, k):
    template.patch_size = k
    try:
        for row in ROWS:
            got = template.encode(row, return_length=True)
            n = len(got['input_ids'])
            assert n % k == 0 and got['length'] == n and len(got['labels']) == n
            template.patch_size = 1
            ref = template.encode(row, return_length=True)
            template.patch_size = k
            m = len(ref['input_ids'])
            assert n - m < k and got['input_ids'][:m] == ref['input_ids']
            assert got['labels'][:k] == [-100] * k and got['labels'][k:m] == ref['labels'][k:]  # first patch masked
            assert got['input_ids'][m:] == [template.tokenizer.pad_token_id] * (n - m)
            assert got['labels'][m:] == [-100] * (n - m)
    finally:
        template.patch_size = 1


def test_template_refuses_a_sample_with_media_at_k_gt_1(template, monkeypatch):
    """A sample whose encoding carries images (a multimodal template's pixel_values) is refused when it is encoded
    at K > 1, before step 1; K=1 encodes it as upstream does."""
    encode = template._encode
    monkeypatch.setattr(template, '_encode', lambda inputs: dict(encode(inputs), pixel_values=[[0.0]]))
    template.patch_size = 4
    try:
        with pytest.raises(ValueError, match=r'--patch_size 4: a sample carries pixel_values .*text only'):
            template.encode(ROWS[0], return_length=True)
    finally:
        template.patch_size = 1
    assert template.encode(ROWS[0], return_length=True)['pixel_values'] == [[0.0]]


def test_packed_row_of_padded_documents_is_patch_aligned(template):
    from swift_plt.patch_level.layout import check_patch_aligned
    template.patch_size = 4
    try:
        packed = template.packing_row([template.encode(r, return_length=True) for r in ROWS])
    finally:
        template.patch_size = 1
    check_patch_aligned(torch.tensor([packed['position_ids']]), 4)
    unpadded = template.packing_row([template.encode(r, return_length=True) for r in ROWS])
    with pytest.raises(ValueError):
        check_patch_aligned(torch.tensor([unpadded['position_ids']]), 4)


def test_custom_model_imports_without_transformer_engine():
    """No TE here (and no harness): the HF side registers, the Megatron side is skipped, twice is harmless."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'custom_model', 'llama.py')
    code = ('import runpy, sys; runpy.run_path(%r); runpy.run_path(%r);'
            'from swift.model import MODEL_MAPPING; from swift_plt.plugin.register import register_mcore;'
            'print(MODEL_MAPPING["llama3_2_plt"].mcore_model_type, register_mcore())' % (path, path))
    out = _python(code)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-2:] == ['llama3_2_plt', 'False']


def test_hf_base_arguments_patch(tmp_path, monkeypatch):
    """swift_plt/plugin/patches/swift_arguments_base_args.py through the real ms-swift argument classes: one extra field on the
    common base, K resolved and handed to the llama3_2_plt loader for training only (export/other: K=1), other
    model types call upstream's loader unchanged, K>1 refused for commands that generate."""
    from dataclasses import fields

    import swift.arguments.base_args.base_args as base_module
    from swift.arguments import BaseArguments, ExportArguments, InferArguments, PretrainArguments, SftArguments

    from harness.tiny import make_jsonl
    from swift_plt.plugin.register import register_swift
    register_swift()
    upstream = BaseArguments.__mro__[1]
    assert BaseArguments._swift_plt and all(issubclass(c, BaseArguments) for c in (PretrainArguments, ExportArguments))
    assert {f.name for f in fields(BaseArguments)} - {f.name for f in fields(upstream)} == {'patch_size'}
    calls = []
    monkeypatch.setattr(base_module, 'get_model_processor', lambda **kw: calls.append(kw))
    model_dir = make_tiny_llama(str(tmp_path / 'm'))
    data = make_jsonl(str(tmp_path / 'd.jsonl'), rows=4)
    train = dict(model=model_dir, template='llama', dataset=[data], max_length=64, tuner_type='full', report_to=['none'],
                 output_dir=str(tmp_path / 'o'), torch_dtype='float32')
    cases = [(PretrainArguments, dict(train, model_type='llama3_2_plt', patch_size=4), 4, 4),
             (SftArguments, dict(train, model_type='llama3_2_plt'), 1, 1),
             (PretrainArguments, dict(train, model_type='llama'), 1, None),
             (ExportArguments, dict(model=model_dir, template='llama', model_type='llama3_2_plt', patch_size=4), 4, 1)]
    for cls, kw, k, loader_k in cases:
        args = cls(**kw)
        args.get_model_processor()
        assert args.patch_size == k and calls[-1].get('patch_size') == loader_k, (cls, kw)
    upstream_kwargs = dict(calls[2])  # model type llama: the kwargs upstream's get_model_processor passes
    # another family at K > 1 (llama here): the loader gets the family's PLT auto class, K=1 nothing
    PretrainArguments(**dict(train, model_type='llama', patch_size=4)).get_model_processor()
    assert calls[-1]['auto_model_cls'].__name__ == 'PLTAutoModelForCausalLM' and 'patch_size' not in calls[-1]
    ExportArguments(model=model_dir, template='llama', model_type='llama', patch_size=4).get_model_processor()
    assert 'auto_model_cls' not in calls[-1] or calls[-1]['auto_model_cls'] is None
    monkeypatch.setattr(PretrainArguments, 'get_model_processor', upstream.get_model_processor)
    PretrainArguments(**dict(train, model_type='llama')).get_model_processor()
    assert calls[-1] == upstream_kwargs
    with pytest.raises(ValueError, match='does not generate token by token'):
        InferArguments(model=model_dir, template='llama', model_type='llama3_2_plt', patch_size=4)


def test_hf_loader_builds_plt_model_at_k_gt_1_only(tmp_path):
    from transformers import LlamaForCausalLM

    from swift_plt.models.hf_llama import PLTLlamaForCausalLM
    from swift_plt.plugin.register import register_swift
    register_swift()
    from swift.model import get_model_processor
    model_dir = make_tiny_llama(str(tmp_path))
    for k, cls in ((4, PLTLlamaForCausalLM), (1, LlamaForCausalLM), (None, LlamaForCausalLM)):
        model, _ = get_model_processor(model_dir, model_type='llama3_2_plt', patch_size=k, torch_dtype=torch.float32,
                                       download_model=False)
        assert type(model) is cls and getattr(model.config, 'patch_size', 1) == (k or 1)
