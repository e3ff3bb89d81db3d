"""--patch_size resolution and the checks that must fail before step 1 (swift_plt.plugin.arguments)."""
from types import SimpleNamespace

import pytest

from swift_plt import PLT_MODEL_TYPE
from swift_plt import families
from swift_plt.plugin.arguments import resolve_patch_size, resolve_patch_size_hf


def make_args(patch_size=None, model_type=PLT_MODEL_TYPE, hf_patch_size=None, **kw):
    meta = SimpleNamespace(model_type=PLT_MODEL_TYPE if model_type == PLT_MODEL_TYPE else 'gpt')
    config = SimpleNamespace() if hf_patch_size is None else SimpleNamespace(patch_size=hf_patch_size)
    base = dict(patch_size=patch_size, model_type=model_type, megatron_model_meta=meta,
                model_info=SimpleNamespace(config=config), task_type='causal_lm', rlhf_type=None, mtp_num_layers=None,
                is_multimodal=False, context_parallel_size=1, sequence_parallel=False, max_length=256,
                packing_length=None, seq_length=256)
    base.update(kw)
    return SimpleNamespace(**base)


def test_default_is_one_and_cli_wins_over_config():
    assert resolve_patch_size(make_args()) == 1
    assert resolve_patch_size(make_args(hf_patch_size=4)) == 4
    assert resolve_patch_size(make_args(patch_size=2, hf_patch_size=4)) == 2
    assert resolve_patch_size(make_args(patch_size=1, hf_patch_size=4)) == 1


def test_other_model_types_ignore_config_and_accept_k1():
    args = make_args(model_type='llama', hf_patch_size=4)
    assert resolve_patch_size(args) == 1 and args.patch_size == 1
    assert resolve_patch_size(make_args(model_type='llama', patch_size=1)) == 1


@pytest.mark.parametrize('kw, message', [
    (dict(model_type='deepseek_v32'), r'`deepseek_v32` is not supported: DeepSeek sparse attention'),
    (dict(model_type='nemotron_h', megatron_model_meta=SimpleNamespace(model_type='nemotron_h')),
     r'`nemotron_h` \(mcore-bridge type `nemotron_h`\) is not supported: Nemotron-H: a Mamba-2 hybrid'),
    (dict(model_type='qwen2_vl', megatron_model_meta=SimpleNamespace(model_type='qwen2_vl')),
     r'`qwen2_vl` \(mcore-bridge type `qwen2_vl`\) is not supported: a multimodal model'),
    (dict(model_type='qwen3_emb', megatron_model_meta=SimpleNamespace(model_type='qwen3_emb')),
     r'`qwen3_emb` \(mcore-bridge type `qwen3_emb`\) is not supported: an embedding model'),
    (dict(model_type='new_llm', megatron_model_meta=SimpleNamespace(model_type='new_llm')),
     r'built by mcore-bridge as `new_llm`, not the GPT decoder'),  # a type mcore-bridge 1.6.5 does not have
    (dict(model_type='bert', megatron_model_meta=None), r'model type `bert` \(config.json\) has no patch-level'),
    (dict(model_type='qwen3', is_multimodal=True), r'`qwen3` is a multimodal model'),
    (dict(model_type='llama3_2_critic', megatron_model_meta=SimpleNamespace(model_type='llama3_2_critic')),
     r'`llama3_2_critic` is a critic'),
])
def test_unsupported_models_are_refused_at_k_gt_1(kw, message):
    with pytest.raises(ValueError, match=r'--patch_size 4: .*' + message + r'.*Use --patch_size 1'):
        resolve_patch_size(make_args(patch_size=4, **kw))
    assert resolve_patch_size(make_args(patch_size=1, **kw)) == 1


# each further language-model type of mcore-bridge 1.6.5 -> what its refusal names (Megatron and HF side alike)
MCORE_REFUSED_MESSAGES = {
    'bailing_hybrid': r'lightning linear attention .* Needed: the recurrence restarted per document over patches',
    'nemotron_h': r'Mamba-2 hybrid .*mamba-ssm and causal-conv1d CUDA packages .* Needed: ',
    'deepseek_v4': r'DeepSeek-V4: its compressed sparse attention .*indexer \(CSAIndexer\)',
    'glm_moe_dsa': r'GLM-MoE-DSA: DeepSeek sparse attention; its indexer chooses which tokens',
}


def test_every_refused_mcore_type_has_a_message_here():
    from swift_plt import families
    assert set(MCORE_REFUSED_MESSAGES) == set(families.MCORE_REFUSED)


@pytest.mark.parametrize('mcore_type', sorted(MCORE_REFUSED_MESSAGES))
def test_further_mcore_bridge_llm_types_are_refused_with_their_reason(mcore_type):
    """Megatron (`megatron pt`: mcore-bridge's meta of the type) and HF (`swift pt`: config.json's model_type) sides
    name the family's reason, not the generic line; K=1 is untouched."""
    message = MCORE_REFUSED_MESSAGES[mcore_type]
    megatron = dict(model_type=mcore_type, megatron_model_meta=SimpleNamespace(model_type=mcore_type))
    with pytest.raises(ValueError, match=rf'--patch_size 4: `{mcore_type}` \(mcore-bridge type `{mcore_type}`\) is '
                       rf'not supported: .*{message}.*Use --patch_size 1\.$'):
        resolve_patch_size(make_args(patch_size=4, **megatron))
    with pytest.raises(ValueError, match=rf'--patch_size 4: `{mcore_type}` is not supported: .*{message}.*Use '
                       r'--patch_size 1\.$'):
        resolve_patch_size_hf(make_hf_args(patch_size=4, model_type=mcore_type), 'train')
    assert resolve_patch_size(make_args(patch_size=1, **megatron)) == 1


@pytest.mark.parametrize('model_type', ['llama', 'qwen2', 'qwen3', 'qwen3_moe', 'deepseek_v3', 'kimi_k2'])
def test_gpt_families_train_at_k_gt_1_through_the_plt_model_meta(model_type, monkeypatch):
    """K > 1: mcore-bridge's `gpt` meta is replaced by PLT's (PLTGPTModel); K=1 keeps upstream's meta object."""
    import swift_plt.plugin.register as register
    plt_meta = SimpleNamespace(model_type='gpt_plt')
    monkeypatch.setattr(register, 'plt_model_meta', {'gpt': plt_meta}.__getitem__)
    args = make_args(patch_size=4, model_type=model_type)
    assert resolve_patch_size(args) == 4 and args.megatron_model_meta is plt_meta
    args = make_args(patch_size=1, model_type=model_type)
    upstream = args.megatron_model_meta
    assert resolve_patch_size(args) == 1 and args.megatron_model_meta is upstream


@pytest.mark.parametrize('model_type', ['olmoe', 'glm4', 'minimax_m2', 'hy_v3', 'bailing_moe'])
def test_own_type_families_train_at_k_gt_1_through_their_plt_meta(model_type, monkeypatch):
    """The families mcore-bridge builds with their own type (OLMoE, GLM-4-0414, MiniMax-M2, Hunyuan-V3, Ling 2.0) get
    `<type>_plt` (their loader and bridge with PLT's model classes); no hybrid refusal applies (context parallel is
    accepted); K=1 keeps upstream's meta object."""
    import swift_plt.plugin.register as register
    monkeypatch.setattr(register, 'plt_model_meta', lambda t: SimpleNamespace(model_type=t + '_plt'))
    args = make_args(patch_size=4, model_type=model_type, megatron_model_meta=SimpleNamespace(model_type=model_type),
                     context_parallel_size=2, cp_partition_mode='zigzag')
    assert resolve_patch_size(args) == 4 and args.megatron_model_meta.model_type == model_type + '_plt'
    args = make_args(patch_size=1, model_type=model_type, megatron_model_meta=SimpleNamespace(model_type=model_type))
    upstream = args.megatron_model_meta
    assert resolve_patch_size(args) == 1 and args.megatron_model_meta is upstream
    if model_type in families.HF_SIDE_REFUSED:  # HF side: no transformers class to wrap
        with pytest.raises(ValueError, match=r'--patch_size 4: `bailing_moe` on the HF backend: transformers has no '
                                             r'class for Ling/Ring 2.0 .*megatron pt/sft'):
            resolve_patch_size_hf(make_hf_args(patch_size=4, model_type=model_type), 'train')
        assert resolve_patch_size_hf(make_hf_args(patch_size=1, model_type=model_type), 'train') == 1
    else:
        assert resolve_patch_size_hf(make_hf_args(patch_size=4, model_type=model_type), 'train') == 4  # HF side


def hybrid_args(model_type, **kw):
    mcore = {'qwen3_next': 'qwen3_next', 'qwen3_5': 'qwen3_5', 'qwen3_5_moe': 'qwen3_5'}[model_type]
    return make_args(model_type=model_type, megatron_model_meta=SimpleNamespace(model_type=mcore),
                     is_multimodal=model_type != 'qwen3_next', **kw)


@pytest.mark.parametrize('model_type', ['qwen3_next', 'qwen3_5', 'qwen3_5_moe'])
def test_hybrid_families_train_at_k_gt_1_through_their_plt_meta(model_type, monkeypatch):
    """The Gated-DeltaNet hybrids (Qwen3.5 a multimodal checkpoint, text-only at K > 1) get `<mcore type>_plt`."""
    import swift_plt.plugin.register as register
    monkeypatch.setattr(register, 'plt_model_meta', lambda t: SimpleNamespace(model_type=t + '_plt'))
    args = hybrid_args(model_type, patch_size=4)
    assert resolve_patch_size(args) == 4
    assert args.megatron_model_meta.model_type == hybrid_args(model_type).megatron_model_meta.model_type + '_plt'
    args = hybrid_args(model_type, patch_size=1)
    upstream = args.megatron_model_meta
    assert resolve_patch_size(args) == 1 and args.megatron_model_meta is upstream


@pytest.mark.parametrize('model_type', ['qwen3_next', 'qwen3_5'])
@pytest.mark.parametrize('mcore, refused', [('0.16.1', True), ('0.17.0', True), ('0.19.2', False)])
def test_hybrid_context_parallel_needs_megatron_core_0_18(model_type, mcore, refused, monkeypatch):
    """Context parallel of the Gated DeltaNet (megatron-core >= 0.18) at K > 1: refused before step 1 on an older
    megatron-core with the reason, accepted on a newer one; never refused at K=1."""
    import swift_plt.compat.versions as versions
    monkeypatch.setattr(versions, 'installed_version', {'megatron-core': mcore}.get)
    args = hybrid_args(model_type, patch_size=4, context_parallel_size=2)
    if refused:
        with pytest.raises(ValueError, match=r'--patch_size 4 cannot be used with: --context_parallel_size > 1 with '
                           rf'Gated DeltaNet layers needs megatron-core >= 0.18 \(installed: {mcore}'):
            resolve_patch_size(args)
    else:  # (the K=4 model meta this run then builds is tests/layouts/test_layouts_hybrid_cp_cpu.py's)
        from swift_plt.plugin.arguments import hybrid_problems
        assert hybrid_problems(args) == []
    assert resolve_patch_size(hybrid_args(model_type, patch_size=1, context_parallel_size=2)) == 1


@pytest.mark.parametrize('cap, version, refused', [((9, 0), '3.6.0', True), ((9, 0), '3.4.0', True),
                                                     ((9, 0), '3.7.0+git1a2b', True), ((9, 0), '3.7.1', False),
                                                     ((9, 0), '3.3.1', False), ((9, 0), '3.9.0', False),
                                                     ((8, 0), '3.6.0', False), ((10, 0), '3.6.0', False)])
def test_fla_hopper_triton_rule(cap, version, refused):
    """fla 0.6's refusal of the Gated DeltaNet backward (Hopper, Triton 3.4.0 <= v < 3.7.1) as one rule."""
    from swift_plt.plugin.arguments import fla_hopper_problem
    problem = fla_hopper_problem(cap, version)
    assert (problem is not None) == refused
    assert problem is None or problem.startswith(f'Triton {version} on this Hopper GPU') and 'triton>=3.7.1' in problem


def test_hybrid_on_hopper_with_old_triton_is_refused_before_step_1(monkeypatch):
    """At K > 1 a hybrid on a Hopper GPU with Triton 3.6 stops at the argument checks (fla would stop the first
    backward, after minutes of kernel compilation); megatron-core's torch path (deterministic_mode) and K = 1 pass."""
    import sys
    import types

    import torch
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda *a: (9, 0))
    monkeypatch.setitem(sys.modules, 'triton', types.SimpleNamespace(__version__='3.6.0'))
    import swift_plt.plugin.register as register
    monkeypatch.setattr(register, 'plt_model_meta', lambda t: SimpleNamespace(model_type=t + '_plt'))
    with pytest.raises(ValueError, match=r'--patch_size 4 cannot be used with: Triton 3.6.0 on this Hopper GPU'):
        resolve_patch_size(hybrid_args('qwen3_next', patch_size=4))
    for extra in ({'deterministic_mode': True}, '{"deterministic_mode": true}'):
        assert resolve_patch_size(hybrid_args('qwen3_next', patch_size=4, megatron_extra_kwargs=extra)) == 4
    assert resolve_patch_size(hybrid_args('qwen3_next', patch_size=1)) == 1
    monkeypatch.setitem(sys.modules, 'triton', types.SimpleNamespace(__version__='3.7.1'))
    assert resolve_patch_size(hybrid_args('qwen3_next', patch_size=4)) == 4


def _resolve_with_mcore_meta(model_type, mcore_type, k):
    """resolve_patch_size with mcore-bridge's own meta of ``mcore_type`` (this process's USE_MCORE_GDN)."""
    from mcore_bridge.model import get_model_meta
    args = hybrid_args(model_type, patch_size=k)
    args.megatron_model_meta = get_model_meta(mcore_type)
    try:
        return resolve_patch_size(args), None
    except ValueError as e:
        return None, str(e)


@pytest.mark.slow
def test_use_mcore_gdn_0_is_refused_at_k_gt_1(monkeypatch):
    """USE_MCORE_GDN=0 (mcore-bridge's transformers-module Gated DeltaNet, not verified at patch level) registers
    another loader and bridge for the hybrids: K > 1 is refused before step 1, naming them; K=1 is upstream's."""
    from harness.dist import spawn
    monkeypatch.setenv('USE_MCORE_GDN', '0')
    ((k4, message), ) = spawn(_resolve_with_mcore_meta, 1, 'qwen3_next', 'qwen3_next', 4, fresh=True)
    assert k4 is None and message.startswith('--patch_size 4: mcore-bridge builds `qwen3_next` differently')
    assert 'its loader is mcore_bridge.model.gpts.qwen3_next.Qwen3NextLoader, not the ' \
        'mcore_bridge.model.gpts.qwen3_next_gdn.Qwen3NextLoader' in message and 'Unset USE_MCORE_GDN' in message
    ((k1, none), ) = spawn(_resolve_with_mcore_meta, 1, 'qwen3_next', 'qwen3_next', 1, fresh=True)
    assert (k1, none) == (1, None)


@pytest.mark.parametrize('k', [0, -1, True])
def test_patch_size_below_one(k):
    with pytest.raises(ValueError, match='--patch_size must be an integer >= 1'):
        resolve_patch_size(make_args(patch_size=k))


@pytest.mark.parametrize('kw, message', [
    (dict(max_length=250, seq_length=250), r'--max_length 250 is not a multiple of --patch_size 4 \(use 248 or 252\)'),
    (dict(packing_length=1022), r'--packing_length 1022 is not a multiple'),
    (dict(mtp_num_layers=1), r'--mtp_num_layers'),
    (dict(task_type='seq_cls'), r'--task_type seq_cls'),
    (dict(rlhf_type='dpo'), r'rlhf_type=dpo'),
    (dict(context_parallel_size=2, cp_partition_mode='contiguous'), r'--cp_partition_mode contiguous'),
])
def test_unsupported_combinations_fail_with_what_to_change(kw, message):
    with pytest.raises(ValueError, match=r'--patch_size 4 cannot be used with: .*' + message):
        resolve_patch_size(make_args(patch_size=4, **kw))
    # ... and none of them matter at K=1
    assert resolve_patch_size(make_args(patch_size=1, **kw)) == 1


def test_context_parallel_zigzag_is_accepted():
    assert resolve_patch_size(make_args(patch_size=4, context_parallel_size=2, cp_partition_mode='zigzag')) == 4
    assert resolve_patch_size(make_args(patch_size=4, context_parallel_size=1, cp_partition_mode='contiguous')) == 4


def test_megatron_parallel_layouts_are_accepted_at_k_gt_1():
    """Sequence parallel, virtual pipeline and data parallel with K > 1 (tests/layouts/test_layouts_cpu.py proves them)."""
    for kw in (dict(sequence_parallel=True, tensor_model_parallel_size=2),
               dict(virtual_pipeline_model_parallel_size=2, pipeline_model_parallel_size=2),
               dict(streaming=True, packing=True)):
        assert resolve_patch_size(make_args(patch_size=4, **kw)) == 4


def make_hf_args(**kw):
    """HF-side arguments (ms-swift BaseArguments): model_meta instead of megatron_model_meta."""
    args = make_args(**kw)
    args.model_meta, args.megatron_model_meta = args.megatron_model_meta, None
    return args


@pytest.mark.parametrize('kw, message', [
    (dict(sequence_parallel_size=2), r'--sequence_parallel_size > 1'),
    (dict(enable_dft_loss=True), r'--enable_dft_loss'),
    (dict(enable_channel_loss=True), r'--enable_channel_loss'),
    (dict(loss_type='chunked'), r'--loss_type'),
    (dict(label_smoothing_factor=0.1), r'--label_smoothing_factor'),
    (dict(use_liger_kernel=True), r'--use_liger_kernel'),
    (dict(use_logits_to_keep=True), r'--use_logits_to_keep true'),
    (dict(tuner_backend='unsloth'), r'--tuner_backend unsloth'),
    (dict(max_length=250), r'--max_length 250 is not a multiple'),
])
def test_hf_trainer_options_that_bypass_the_model_loss_are_refused(kw, message):
    with pytest.raises(ValueError, match=r'--patch_size 4 cannot be used with: .*' + message):
        resolve_patch_size_hf(make_hf_args(patch_size=4, **kw), 'train')
    assert resolve_patch_size_hf(make_hf_args(patch_size=1, **kw), 'train') == 1
    assert resolve_patch_size_hf(make_hf_args(model_type='llama', **kw), 'train') == 1


def test_hf_commands():
    assert resolve_patch_size_hf(make_hf_args(patch_size=4), 'train') == 4
    assert resolve_patch_size_hf(make_hf_args(hf_patch_size=4), 'train') == 4  # config.json default, as Megatron
    assert resolve_patch_size_hf(make_hf_args(patch_size=4, use_logits_to_keep=True), 'export') == 4
    with pytest.raises(ValueError, match=r'--patch_size 4: .* does not generate token by token.*drop --patch_size'):
        resolve_patch_size_hf(make_hf_args(patch_size=4), 'other')
    assert resolve_patch_size_hf(make_hf_args(), 'other') == 1


@pytest.mark.parametrize('te_version, refused', [('2.11.0', True), ('2.8.0+cu12', True), ('2.12.0', False),
                                                  ('3.0.0', False), (None, False)])
def test_sinks_on_padding_free_rows_rule(te_version, refused):
    """TE 2.11 has no attention kernel for GPT-OSS's sinks on THD rows (step 1 fails, stock alike): one rule."""
    from swift_plt.plugin.arguments import sinks_thd_problem
    problem = sinks_thd_problem(te_version)
    assert (problem is not None) == refused
    assert problem is None or f'Transformer Engine {te_version} has no attention kernel for sinks' in problem


def test_gpt_oss_padding_free_is_refused_before_step_1_at_k_gt_1(monkeypatch):
    """GPT-OSS at K > 1 with padding-free rows (the default) and TE 2.11 stops at the argument checks with the fix;
    --padding_free false passes, K = 1 is upstream's, a family without sinks is not concerned."""
    import swift_plt.compat.versions as versions
    import swift_plt.plugin.register as register
    monkeypatch.setattr(register, 'plt_model_meta', lambda t: SimpleNamespace(model_type=t + '_plt'))
    monkeypatch.setattr(versions, 'installed_version', {'transformer_engine': '2.11.0'}.get)
    with pytest.raises(ValueError, match=r'--patch_size 4 cannot be used with: --padding_free true .*attention sinks '
                                         r'\(GPT-OSS\).*use --padding_free false without --packing'):
        resolve_patch_size(make_args(patch_size=4, model_type='gpt_oss', padding_free=True))
    assert resolve_patch_size(make_args(patch_size=4, model_type='gpt_oss', padding_free=False)) == 4
    assert resolve_patch_size(make_args(patch_size=1, model_type='gpt_oss', padding_free=True)) == 1
    assert resolve_patch_size(make_args(patch_size=4, model_type='qwen3', padding_free=True)) == 4
