"""Patches of ms-swift's Megatron modules through the real code on CPU (harness): --patch_size parses for the
`megatron pt` and `swift export` argument classes, registration resolves llama3_2_plt to the PLT loader,
get_padding_to and get_batch_on_this_pp_rank patched vs original (K=1 identical, K>1 as specified)."""
import os
from types import SimpleNamespace

import torch

from harness.dist import spawn

CUSTOM_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'custom_model', 'llama.py')


def _argument_classes():
    from transformers import HfArgumentParser

    from swift.megatron.arguments import MegatronExportArguments, MegatronPretrainArguments, MegatronSftArguments
    from swift.utils.utils import _patch_get_type_hints
    out = {}
    for cls in (MegatronPretrainArguments, MegatronSftArguments, MegatronExportArguments):
        with _patch_get_type_hints():
            parser = HfArgumentParser([cls])
        ns, rest = parser.parse_known_args(['--model', 'x', '--patch_size', '4'])
        default, _ = parser.parse_known_args(['--model', 'x'])
        out[cls.__name__] = (ns.patch_size, rest, default.patch_size)
    return out


def test_patch_size_parses_for_pt_sft_export():
    (out, ) = spawn(_argument_classes, 1)
    assert out == {name: (4, [], None) for name in
                   ('MegatronPretrainArguments', 'MegatronSftArguments', 'MegatronExportArguments')}


def _registration():
    import importlib.util
    for name in ('plt_register_a', 'plt_register_b'):  # importing the file twice is harmless
        spec = importlib.util.spec_from_file_location(name, CUSTOM_MODEL)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    from mcore_bridge.model import get_model_meta
    from swift.model import MODEL_MAPPING

    from swift_plt.models.megatron_gpt import PLTGPTModel, PLTModelConfig, PLTModelLoader
    swift_meta = MODEL_MAPPING['llama3_2_plt']
    mcore_meta = get_model_meta(swift_meta.mcore_model_type)
    return (swift_meta.mcore_model_type, swift_meta.architectures, mcore_meta.loader is PLTModelLoader,
            mcore_meta.config_cls is PLTModelConfig, PLTModelLoader.model_cls is PLTGPTModel,
            get_model_meta('gpt').loader.__name__)


def test_registration_resolves_plt_loader():
    (out, ) = spawn(_registration, 1)
    assert out == ('llama3_2_plt', ['LlamaForCausalLM'], True, True, True, 'ModelLoader')


def _padding_to_cases():
    from swift.megatron.utils import get_padding_to
    from swift.megatron.utils.utils import get_padding_to as module_level
    assert get_padding_to is module_level and get_padding_to._swift_plt
    upstream = get_padding_to.__wrapped__
    results = []
    for tp, sp, cp, attn, fp8 in [(1, False, 1, 'unfused', None), (2, True, 1, 'fused', None),
                                  (1, False, 2, 'flash', None), (2, True, 1, 'flash', 'e4m3')]:
        for k in (None, 1, 2, 4):
            args = SimpleNamespace(tensor_model_parallel_size=tp, sequence_parallel=sp, context_parallel_size=cp,
                                   fp8_recipe='delayed', fp8_format=fp8, fp4_format=None, attention_backend=attn,
                                   patch_size=k)
            results.append((k, upstream(args), get_padding_to(args)))
    return results


def test_get_padding_to_patched_vs_original():
    (results, ) = spawn(_padding_to_cases, 1)
    for k, upstream, patched in results:
        if k in (None, 1):
            assert patched == upstream
        else:
            assert patched == k * (upstream or 1)


def _get_batch_cases():
    from swift.megatron.trainers import utils
    patched = utils.get_batch_on_this_pp_rank
    upstream = patched.__wrapped__
    pos = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 0, 0, 0, 0]])
    labels = torch.arange(16)[None] + 100
    scale = torch.rand(1, 16)
    out = {}
    for k in (None, 1, 4):
        args = SimpleNamespace(task_type='causal_lm', pipeline_model_parallel_size=1, patch_size=k)
        make = lambda: dict(input_ids=labels.clone(), labels=labels.clone(), loss_scale=scale.clone(),
                            position_ids=pos.clone())  # noqa
        out[k] = (patched(args, make()), upstream(args, make()))
    bad = SimpleNamespace(task_type='causal_lm', pipeline_model_parallel_size=1, patch_size=4)
    try:
        patched(bad, dict(labels=labels.clone(), position_ids=torch.arange(16)[None] % 6))
        out['error'] = None
    except ValueError as e:
        out['error'] = str(e)
    return out, labels, scale


def test_get_batch_on_this_pp_rank_patched_vs_original():
    ((out, labels, scale), ) = spawn(_get_batch_cases, 1)
    for k in (None, 1):  # K=1: upstream, roll included
        got, ref = out[k]
        for key in ref:
            assert torch.equal(got[key], ref[key])
        assert torch.equal(got['labels'], torch.roll(labels, -1, dims=-1))
    got, _ = out[4]  # K=4: no roll, first patch of each document (positions < 4) ignored
    expect = labels.clone()
    expect[0, [0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15]] = -100
    assert torch.equal(got['labels'], expect)
    assert torch.equal(got['loss_scale'], scale)
    assert 'straddles two documents' in out['error']
