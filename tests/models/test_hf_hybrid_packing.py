"""The HF backend (`swift pt/sft`) at K > 1 with a Gated-DeltaNet hybrid on padding-free rows (`--packing`,
`--padding_free`): refused before step 1 where its Gated DeltaNet would not restart per document
(swift_plt.plugin.arguments.packed_hybrid_problem), and, on CPU, why: transformers' torch fallback runs the
convolution and the recurrence of a packed row across its documents, and Qwen3-Next's convolution does so even where
the recurrence restarts (fla's kernel)."""
import sys
from types import SimpleNamespace

import pytest
import torch

from swift_plt.plugin import arguments
from swift_plt.plugin.arguments import resolve_patch_size_hf

HYBRIDS = ['qwen3_next', 'qwen3_5', 'qwen3_5_moe']
PACKED = [dict(packing=True), dict(padding_free=True), dict(packing=True, padding_free=True)]
REFUSED = r'--patch_size 4 cannot be used with: --packing / --padding_free \(rows of several documents\) with the ' \
          r'Gated-DeltaNet hybrid `{}`.*would start from the previous one\'s convolution and recurrent state.*' \
          r'padded batches.*`megatron pt`'


def hf_args(model_type, patch_size=4, **kw):
    """HF-side arguments (ms-swift BaseArguments) after ms-swift read config.json; padded batches by default."""
    base = dict(patch_size=patch_size, model_type=model_type, megatron_model_meta=None,
                model_meta=SimpleNamespace(model_type=model_type),
                model_info=SimpleNamespace(config=SimpleNamespace(model_type=model_type)), task_type='causal_lm',
                rlhf_type=None, mtp_num_layers=None, is_multimodal=model_type.startswith('qwen3_5'),
                context_parallel_size=1, max_length=256, packing_length=None, packing=False, padding_free=False)
    base.update(kw)
    return SimpleNamespace(**base)


def fla_kernels(monkeypatch, available: bool):
    monkeypatch.setattr(arguments, 'gdn_fla_kernels_available', lambda: available)


@pytest.mark.parametrize('packed', PACKED, ids=lambda p: '+'.join(p))
@pytest.mark.parametrize('model_type', HYBRIDS)
def test_packed_hybrid_on_the_torch_fallback_is_refused_before_step_1(model_type, packed, monkeypatch):
    """Without fla's kernels each hybrid on padding-free rows stops at the argument checks, naming what to use; K=1
    (upstream's), padded batches and `swift export` pass."""
    fla_kernels(monkeypatch, False)
    with pytest.raises(ValueError, match=REFUSED.format(model_type)):
        resolve_patch_size_hf(hf_args(model_type, **packed), 'train')
    assert resolve_patch_size_hf(hf_args(model_type, patch_size=1, **packed), 'train') == 1
    assert resolve_patch_size_hf(hf_args(model_type), 'train') == 4
    assert resolve_patch_size_hf(hf_args(model_type, **packed), 'export') == 4


@pytest.mark.parametrize('model_type', HYBRIDS)
def test_with_fla_kernels_qwen3_5_packs_and_qwen3_next_does_not(model_type, monkeypatch):
    """With fla's kernels Qwen3.5 (ms-swift's Gated DeltaNet: fla's convolution and recurrence over cu_seqlens)
    trains on packed rows; Qwen3-Next (transformers' own: the convolution ignores the boundaries) is still refused."""
    fla_kernels(monkeypatch, True)
    args = hf_args(model_type, packing=True)
    if model_type == 'qwen3_next':
        with pytest.raises(ValueError, match=REFUSED.format(model_type)) as refusal:
            resolve_patch_size_hf(args, 'train')
        assert 'runs the causal convolution across the documents of a row with any kernels' in str(refusal.value)
    else:
        assert resolve_patch_size_hf(args, 'train') == 4


@pytest.mark.parametrize('model_type', ['llama', 'qwen3', 'qwen3_moe', 'deepseek_v3'])
def test_packed_rows_of_other_families_are_accepted(model_type, monkeypatch):
    fla_kernels(monkeypatch, False)
    for packed in PACKED:
        assert resolve_patch_size_hf(hf_args(model_type, **packed), 'train') == 4


@pytest.mark.skipif(torch.cuda.is_available(), reason='the CPU machine: no fla kernels whatever is installed')
def test_this_cpu_machine_has_no_fla_kernels_so_a_packed_hybrid_is_refused():
    """The real detection (transformers' test, ms-swift's too): fla's Triton kernels need a GPU."""
    assert arguments.gdn_fla_kernels_available() is False
    with pytest.raises(ValueError, match=REFUSED.format('qwen3_5')):
        resolve_patch_size_hf(hf_args('qwen3_5', packing=True), 'train')


def _spans(cu, length):
    """The documents of a row as (start, end): ``cu`` its cumulative lengths (None: one document)."""
    cu = [0, length] if cu is None else [int(x) for x in cu.tolist()]
    return list(zip(cu[:-1], cu[1:]))


def test_packed_documents_share_state_without_per_document_kernels(tmp_path, monkeypatch):
    """Why the refusal: the tiny Qwen3-Next PLT model at K=4 (the torch fallback: no fla here) gives the second
    document of a packed row other logits than the document alone, though the PLT model hands the decoder the
    documents' patch boundaries; with the recurrence alone restarting per document (what fla's kernel gives
    transformers' Qwen3-Next) they still differ (the convolution); with the convolution and the recurrence restarting
    per document (what fla gives ms-swift's Qwen3.5 forward) they are equal."""
    from packaging.version import Version
    from transformers import AutoConfig, __version__

    from swift_plt.models.hf_causal_lm import plt_auto_model_class
    from swift_plt.tools.tiny_families import make_tiny_family
    hf_dir = make_tiny_family('qwen3_next', str(tmp_path), vocab_size=512)
    model = plt_auto_model_class(4).from_pretrained(hf_dir, config=AutoConfig.from_pretrained(hf_dir),
                                                    dtype=torch.float32, attn_implementation='eager').eval()
    g = torch.Generator().manual_seed(0)
    first, second = torch.randint(4, 500, (1, 16), generator=g), torch.randint(4, 500, (1, 24), generator=g)

    def gap():
        with torch.no_grad():
            packed = model(input_ids=torch.cat([first, second], 1),
                           position_ids=torch.cat([torch.arange(16), torch.arange(24)])[None]).logits
            alone = model(input_ids=second, position_ids=torch.arange(24)[None]).logits
        return (packed[0, 16 // 4:] - alone[0]).abs().max().item()

    assert gap() > 1e-2
    if Version(__version__).major < 5:
        return  # (4.57's kernel functions are bound per module instance; the layout below is 5.x's)
    modeling = sys.modules[model.plain_class().__module__]
    rule, conv = modeling.torch_chunk_gated_delta_rule, modeling.causal_conv1d_fn

    def per_document_rule(q, k, v, g, beta, cu_seqlens=None, **kw):
        outs = [rule(q[:, s:e], k[:, s:e], v[:, s:e], g=g[:, s:e], beta=beta[:, s:e], **kw)[0]
                for s, e in _spans(cu_seqlens, q.shape[1])]
        return torch.cat(outs, 1), None

    def per_document_conv(x, weight, bias=None, activation=None, cu_seq_lens_q=None, **kw):  # x: [B, D, T]
        outs = [conv(x[..., s:e], weight, bias, activation=activation) for s, e in _spans(cu_seq_lens_q, x.shape[-1])]
        return torch.cat(outs, -1)

    monkeypatch.setattr(modeling, 'torch_chunk_gated_delta_rule', per_document_rule)
    assert gap() > 1e-2  # the convolution still runs across the documents
    monkeypatch.setattr(modeling, 'causal_conv1d_fn', per_document_conv)
    assert gap() < 1e-4
