"""CPU checks of the families GPU step: make_family_configs.py (published sizes on the meta device, toy-width dirs
that transformers loads with the structure intact), parity.py's pure helpers (random ids, route comparison) and its
placement of the Megatron model (every parameter on the target device, the shared-expert gate included)."""
import json
import os
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_family_configs as mfc  # noqa: E402
import parity  # noqa: E402

from swift_plt import families  # noqa: E402
from swift_plt.compat.transformers import is_transformers_5  # noqa: E402


# parameters of each cut (transformers' count on the meta device)
CUT_PARAMS = {'qwen2.5-1.5b': 1.544e9, 'qwen3-1.7b': 1.721e9, 'qwen3-30b-a3b-cut': 3.115e9, 'deepseek-v3-cut': 4.309e9,
              'qwen1.5-moe-a2.7b-cut': 2.905e9, 'glm-4.5-air-cut': 3.953e9, 'glm-4.7-flash-cut': 2.625e9,
              'deepseek-v2-lite-cut': 2.255e9, 'ernie-4.5-0.3b': 0.3607e9, 'ernie-4.5-21b-a3b-cut': 2.758e9,
              'dots.llm1-cut': 3.866e9, 'kimi-k2-cut': 4.546e9, 'llama-3.2-1b': 1.236e9,
              'qwen3-next-80b-a3b-cut': 2.375e9, 'qwen3.5-27b-cut': 4.068e9, 'qwen3.5-35b-a3b-cut': 2.772e9,
              'gpt-oss-20b-cut': 4.451e9, 'olmoe-1b-7b-cut': 1.884e9, 'glm-4-9b-0414-cut': 2.057e9,
              'minimax-m2-cut': 4.080e9, 'hy3-preview-cut': 3.834e9, 'ling-mini-2.0-cut': 3.144e9,
              'qwen3-vl-8b-cut': 2.027e9}
# the uncut published configs: the totals their model cards give (a mistyped width or count changes these)
CARD_PARAMS = {'qwen1.5-moe-a2.7b-cut': 14.3e9, 'glm-4.5-air-cut': 106e9, 'glm-4.7-flash-cut': 30e9,
               'deepseek-v2-lite-cut': 15.7e9, 'ernie-4.5-0.3b': 0.36e9, 'ernie-4.5-21b-a3b-cut': 21.8e9,
               'dots.llm1-cut': 142e9, 'kimi-k2-cut': 1.03e12, 'llama-3.2-1b': 1.24e9,
               'qwen3-next-80b-a3b-cut': 80e9, 'qwen3.5-27b-cut': 27e9, 'qwen3.5-35b-a3b-cut': 35e9,
               'gpt-oss-20b-cut': 21e9, 'olmoe-1b-7b-cut': 6.9e9, 'glm-4-9b-0414-cut': 9.4e9, 'minimax-m2-cut': 230e9,
               'hy3-preview-cut': 295e9, 'ling-mini-2.0-cut': 16e9, 'qwen3-vl-8b-cut': 8.77e9}


def test_groups_cover_every_family_once():
    groups = mfc.DEFAULT + mfc.MORE + mfc.HYBRID + mfc.NEW
    assert sorted(mfc.GROUPS['all']) == sorted(groups) and len(set(groups)) == len(groups)
    assert mfc.GROUPS['all'] == mfc.NAMES
    assert set(CUT_PARAMS) == set(mfc.NAMES) and set(CARD_PARAMS) == set(mfc.MORE + mfc.HYBRID + mfc.NEW)
    from swift_plt.families import FAMILIES
    types = {mfc.family_config(n)['model_type'] for n in mfc.NAMES}
    # every family transformers builds without remote code has a published config here (kimi_k2 as deepseek_v3),
    # and Ling 2.0 (bailing_moe, hand-written)
    assert set(FAMILIES) - types == {'internlm3', 'mimo', 'deepseek', 'kimi_k2'}


# parity.py --hf-only's models: name -> model type
PARITY_HF_ONLY = {'qwen3-30b-a3b-cut': 'qwen3_moe', 'gpt-oss-20b-cut': 'gpt_oss', 'ling-mini-2.0-cut': 'bailing_moe'}
ROUTER_BIAS = ('e_score_correction_bias', 'expert_bias')  # the routers' expert bias in the checkpoints
# a MoE layer's first expert weight as the hub checkpoint names it (default: mlp.experts.0.gate_proj.weight)
EXPERT_KEY = {'minimax-m2-cut': 'layers.1.block_sparse_moe.experts.0.w1.weight',
              'gpt-oss-20b-cut': 'layers.1.mlp.experts.gate_up_proj'}
# the families of mfc.NAMES built here (transformers 4.57.x: all but glm4_moe_lite, qwen3_5*, hy_v3)
BUILT = [n for n in mfc.NAMES if mfc.buildable(n)]


def skip_unbuilt(name):
    if name not in BUILT:
        pytest.skip(f'{name}: model type {mfc.FAMILIES[name][0]["model_type"]} is not in this transformers')


@pytest.mark.parametrize('name', list(CARD_PARAMS))
def test_published_configs_have_the_model_card_size(name):
    skip_unbuilt(name)
    n, _ = mfc.count_params(mfc.FAMILIES[name][0])
    assert n == pytest.approx(CARD_PARAMS[name], rel=0.03)


def test_published_sizes_fit_one_80gb_gpu():
    for name, n in CUT_PARAMS.items():
        if name not in BUILT:
            continue
        s = mfc.sizes(mfc.family_config(name))
        assert s['params'] == pytest.approx(n, rel=2e-3), name
        # parity holds one model at a time: the fp64 reference (converted from fp32) is the peak
        assert s['fp32_gb'] + s['fp64_gb'] < 60, name
    cfg = mfc.family_config('qwen3-30b-a3b-cut')
    assert (cfg['hidden_size'], cfg['num_attention_heads'], cfg['num_key_value_heads'], cfg['head_dim'],
            cfg['moe_intermediate_size'], cfg['num_experts'], cfg['num_experts_per_tok']) == (2048, 32, 4, 128, 768,
                                                                                            128, 8)
    ds = mfc.family_config('deepseek-v3-cut')
    assert (ds['hidden_size'], ds['q_lora_rank'], ds['kv_lora_rank'], ds['qk_rope_head_dim'], ds['qk_nope_head_dim'],
            ds['v_head_dim'], ds['num_attention_heads'], ds['intermediate_size'], ds['vocab_size'],
            ds['rope_scaling']['type']) == (7168, 1536, 512, 64, 128, 128, 128, 18432, 129280, 'yarn')
    assert mfc.sizes(ds)['train_bf16_adam_gb'] < 80  # not trained by the benchmark, but the claim must hold


def test_cuts_keep_each_structure():
    """A cut changes only layer and expert counts (and drops MTP layers): the dense first layers stay, at least two
    MoE layers follow, routing keeps its top-k and groups."""
    allowed = {'num_hidden_layers', 'n_routed_experts', 'num_nextn_predict_layers', 'max_window_layers',
               'moe_layer_end_index', 'num_experts', 'num_local_experts', 'layer_types', 'attn_type_list',
               'mtp_num_hidden_layers', 'text_config', 'vision_config'}
    # DeepSeek-V3: 1 of its 3 dense layers, 4 groups of 4 of the 16 experts kept
    allowed_more = {'deepseek-v3-cut': {'first_k_dense_replace', 'n_group', 'topk_group'}}
    for name in mfc.NAMES:
        real, cut, _ = mfc.FAMILIES[name]
        cfg = mfc.family_config(name)
        assert set(cut) | set(cut.get('text_config', {})) <= allowed | allowed_more.get(name, set()), name
        if name not in mfc.HYBRID + mfc.NEW:  # qwen3_moe / qwen2_moe keep all their experts
            assert 'num_experts' not in cut, name
        real, cfg = mfc.text_config(real), mfc.text_config(cfg)
        for key in ('layer_types', 'attn_type_list'):  # per-layer lists cut with the layers
            assert key not in cfg or len(cfg[key]) == cfg['num_hidden_layers'], (name, key)
        assert cfg['num_hidden_layers'] <= real['num_hidden_layers'] and not cfg.get('num_nextn_predict_layers')
        assert not cfg.get('mtp_num_hidden_layers'), name
        if name in mfc.HYBRID:  # 3 Gated DeltaNet layers, then the full-attention one; the published interval
            assert cfg['num_hidden_layers'] == 4 and cfg.get('full_attention_interval') == 4, name
            assert cfg.get('layer_types', mfc.hybrid_layer_types(4)) == mfc.hybrid_layer_types(4), name
        if not parity.is_moe(cfg):
            continue
        dense = cfg.get('first_k_dense_replace', cfg.get('moe_layer_start_index', 0))
        real_dense = real.get('first_k_dense_replace', real.get('moe_layer_start_index', 0))
        assert dense == real_dense or 1 <= dense < real_dense, name
        assert cfg['num_hidden_layers'] - dense >= 2, name
        assert cfg.get('moe_layer_end_index', cfg['num_hidden_layers'] - 1) == cfg['num_hidden_layers'] - 1, name
        experts = (cfg.get('n_routed_experts') or cfg.get('num_experts') or cfg.get('num_local_experts')
                   or cfg['moe_num_experts'])
        assert experts >= 2 * (cfg.get('num_experts_per_tok') or cfg['moe_k']), name


def test_group_limited_routing_guard():
    real, cut, toy = mfc.FAMILIES['deepseek-v3-cut']
    try:
        mfc.FAMILIES['deepseek-v3-cut'] = (real, dict(cut, topk_group=2), toy)
        with pytest.raises(ValueError, match='topk_group'):
            mfc.family_config('deepseek-v3-cut')
    finally:
        mfc.FAMILIES['deepseek-v3-cut'] = (real, cut, toy)


@pytest.fixture(scope='module')
def tiny_dirs(tmp_path_factory):
    out = tmp_path_factory.mktemp('families')
    assert mfc.main(['--out', str(out), '--tiny', '--device', 'cpu', '--json', str(out / 'models.json'),
                     '--only', ','.join(BUILT)]) == 0
    return out


def test_tiny_dirs_load_with_their_structure(tiny_dirs):
    from safetensors import safe_open
    from transformers import AutoTokenizer

    from swift_plt.compat.transformers import hf_rope_guard
    report = json.load(open(tiny_dirs / 'models.json'))
    classes = {'qwen2.5-1.5b': 'Qwen2ForCausalLM', 'qwen3-1.7b': 'Qwen3ForCausalLM',
               'qwen3-30b-a3b-cut': 'Qwen3MoeForCausalLM', 'deepseek-v3-cut': 'DeepseekV3ForCausalLM',
               'qwen1.5-moe-a2.7b-cut': 'Qwen2MoeForCausalLM', 'glm-4.5-air-cut': 'Glm4MoeForCausalLM',
               'glm-4.7-flash-cut': 'Glm4MoeLiteForCausalLM', 'deepseek-v2-lite-cut': 'DeepseekV2ForCausalLM',
               'llama-3.2-1b': 'LlamaForCausalLM', 'ernie-4.5-21b-a3b-cut': 'Ernie4_5_MoeForCausalLM',
               'ernie-4.5-0.3b': 'Ernie4_5ForCausalLM', 'dots.llm1-cut': 'Dots1ForCausalLM',
               'kimi-k2-cut': 'DeepseekV3ForCausalLM', 'qwen3-next-80b-a3b-cut': 'Qwen3NextForCausalLM',
               'qwen3.5-27b-cut': 'Qwen3_5ForConditionalGeneration',
               'qwen3.5-35b-a3b-cut': 'Qwen3_5MoeForConditionalGeneration', 'gpt-oss-20b-cut': 'GptOssForCausalLM',
               'olmoe-1b-7b-cut': 'OlmoeForCausalLM', 'glm-4-9b-0414-cut': 'Glm4ForCausalLM',
               'minimax-m2-cut': 'MiniMaxM2ForCausalLM', 'hy3-preview-cut': 'HYV3ForCausalLM',
               'ling-mini-2.0-cut': 'BailingMoeV2ForCausalLM', 'qwen3-vl-8b-cut': 'Qwen3VLForConditionalGeneration'}
    assert set(classes) == set(mfc.NAMES)
    for name, cls in classes.items():
        if name not in BUILT:
            continue
        d = tiny_dirs / name
        cfg = json.load(open(d / 'config.json'))
        assert cfg == mfc.family_config(name, tiny=True) and report[name]['model_type'] == cfg['model_type']
        # a text-only multimodal family's checkpoint: text_config + vision_config, its processor files (ms-swift loads
        # them), its class from `architectures`
        text_only_multimodal = families.family(cfg['model_type']).text_only_multimodal
        assert text_only_multimodal == parity.is_multimodal(cfg) == ('vision_config' in cfg), name
        assert (d / 'preprocessor_config.json').exists() == text_only_multimodal, name
        with hf_rope_guard():
            model = mfc.model_class(cfg).from_pretrained(str(d), dtype=torch.float32)
        assert type(model).__name__ == cls
        tok = AutoTokenizer.from_pretrained(str(d))
        ids = torch.tensor([tok('The old sailor walked to the harbour.')['input_ids']])
        assert int(ids.max()) < parity.id_limit(cfg) <= mfc.text_config(cfg)['vocab_size']
        with torch.no_grad():
            assert torch.isfinite(model(input_ids=ids).logits).all()
        params = dict(model.named_parameters())
        norms = [p for n, p in params.items() if p.dim() == 1 and 'norm' in n]
        assert norms and all(not torch.equal(p, torch.ones_like(p)) for p in norms)  # a swapped norm would show
        with safe_open(str(d / 'model.safetensors'), 'pt') as f:
            keys = set(f.keys())
            if name == 'qwen2.5-1.5b':
                assert float(f.get_tensor('model.layers.0.self_attn.q_proj.bias').abs().sum()) > 0
            for key in keys:
                if key.endswith(ROUTER_BIAS):  # random where mcore-bridge loads it, else 0
                    b = f.get_tensor(key)
                    assert b.dtype == torch.float32
                    assert (float(b.abs().sum()) > 0) == (cfg['model_type'] not in mfc.NO_ROUTER_BIAS), key
            if name == 'gpt-oss-20b-cut':  # sinks and expert biases random too (HF: N(0, 0.02) and 0)
                assert float(f.get_tensor('model.layers.1.self_attn.sinks').float().std()) > 0.3
                assert float(f.get_tensor('model.layers.1.mlp.experts.down_proj_bias').abs().sum()) > 0
        assert any(k.endswith(ROUTER_BIAS) for k in keys) == (
            name in ('deepseek-v3-cut', 'glm-4.5-air-cut', 'glm-4.7-flash-cut', 'ernie-4.5-21b-a3b-cut',
                     'dots.llm1-cut', 'kimi-k2-cut', 'minimax-m2-cut', 'hy3-preview-cut', 'ling-mini-2.0-cut'))
        prefix = 'model.language_model.' if 'text_config' in cfg else 'model.'  # the hub format mcore-bridge reads
        if parity.is_moe(cfg):
            assert prefix + EXPERT_KEY.get(name, 'layers.1.mlp.experts.0.gate_proj.weight') in keys
        if name in mfc.HYBRID:  # layers 0-2 Gated DeltaNet, layer 3 gated attention (what mcore-bridge builds)
            assert prefix + 'layers.2.linear_attn.conv1d.weight' in keys
            assert prefix + 'layers.3.self_attn.q_proj.weight' in keys
            assert not any(k.startswith(prefix + 'layers.3.linear_attn') for k in keys)
            # kept in config.json (transformers 5 drops it from its own dump; mcore-bridge reads it)
            assert mfc.text_config(cfg)['full_attention_interval'] == 4
    ds = mfc.build_model(mfc.family_config('deepseek-v3-cut', tiny=True))
    assert ds.config.q_lora_rank == 32 and ds.config.first_k_dense_replace == 1


def test_patch_level_window_and_plt_types(tiny_dirs):
    """parity.py's reference of GPT-OSS: its window of 8 tokens is 2 patches at K=4 (the CPU tests' rule), no other
    family has one; the mcore type each family's K > 1 must be built as."""
    plt_cases = mfc.harness_module('plt_cases')
    for name in BUILT:
        window = plt_cases.patch_level_hf_config(str(tiny_dirs / name), 4)
        assert window == ({'sliding_window': 2} if name == 'gpt-oss-20b-cut' else {}), name
    assert parity.expected_plt_build('gpt_oss') == ('gpt_plt', 'PLTGPTModel')
    for model_type in ('olmoe', 'glm4', 'minimax_m2', 'hy_v3', 'bailing_moe', 'qwen3_next'):
        assert parity.expected_plt_build(model_type) == (model_type + '_plt', 'PLTGPTModel')
    for model_type, mcore_type in (('qwen3_5_moe', 'qwen3_5'), ('qwen3_vl', 'qwen3_vl')):
        assert parity.expected_plt_build(model_type) == (mcore_type + '_plt', 'PLTMultimodalGPTModel')


@pytest.fixture(scope='module')
def parity_hf_only(tiny_dirs, tmp_path_factory):
    """parity.py --hf-only, one process, on the MoE dir (the HF reference and the plugin's loss on its logits), GPT-OSS
    (loaded twice: its window in patches for PatchTrain, in tokens for the token-level pass) and Ling 2.0 (the
    hand-written model, its Gate's routes)."""
    out = tmp_path_factory.mktemp('parity') / 'p.json'
    models = [str(tiny_dirs / n) for n in PARITY_HF_ONLY]
    r = subprocess.run([sys.executable, os.path.join(HERE, 'parity.py'), '--random-ids', '--S', '32', '--hf-only',
                        '--hf-device', 'cpu', '--json', str(out)] + [a for m in models for a in ('--model', m)],
                       capture_output=True, text=True, timeout=600)
    return r, out


def reference_line(stdout, name):
    (line, ) = [x for x in stdout.splitlines() if x.startswith(f'PARITY [{name}] HF reference')]
    return line


def test_parity_reference_runs_on_a_tiny_family_dir(parity_hf_only):
    r, out = parity_hf_only
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert 'PARITY summary: 6 lines, 0 failed' in r.stdout  # per model: the reference and its timing line
    res = json.load(open(out))
    assert res['model_types'] == PARITY_HF_ONLY
    assert '(BailingMoeV2ForCausalLM)' in reference_line(r.stdout, 'ling-mini-2.0-cut')
    assert reference_line(r.stdout, 'ling-mini-2.0-cut').endswith('; 1 MoE layers')  # the Gate's, after 1 dense


@pytest.mark.skipif(not is_transformers_5(), reason='transformers 4.57 has no MoE router module (its gate is a Linear '
                    'inside the sparse block): parity.py records HF routes on 5.x only')
def test_parity_records_the_hf_moe_routes(parity_hf_only):
    r, _ = parity_hf_only
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    for name in ('qwen3-30b-a3b-cut', 'gpt-oss-20b-cut'):
        assert reference_line(r.stdout, name).endswith('; 2 MoE layers'), name


# parity.py --hf-only on a text-only multimodal family's toy dir (the records' text_only_multimodal): name -> (its
# class, how many MoE layers the reference reports: 0 for a dense one)
MULTIMODAL_HF_ONLY = {'qwen3.5-35b-a3b-cut': ('Qwen3_5MoeForConditionalGeneration', 4),
                      'qwen3-vl-8b-cut': ('Qwen3VLForConditionalGeneration', 0)}


@pytest.mark.parametrize('name', list(MULTIMODAL_HF_ONLY))
def test_parity_reference_runs_a_multimodal_checkpoint_on_text(tiny_dirs, tmp_path, name):
    """parity.py --hf-only on a multimodal toy dir (Qwen3.5-MoE; Qwen3-VL, whose deepstack mergers stay unused on
    text): its language model on the pooled token embeddings (text position ids), random ids below the media token
    ids; a MoE one's routes recorded."""
    skip_unbuilt(name)
    cls, moe_layers = MULTIMODAL_HF_ONLY[name]
    out = tmp_path / 'p.json'
    model = str(tiny_dirs / name)
    r = subprocess.run([sys.executable, os.path.join(HERE, 'parity.py'), '--model', model, '--random-ids', '--S', '32',
                        '--hf-only', '--hf-device', 'cpu', '--hf64-device', 'none', '--json', str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert 'PARITY summary: 2 lines, 0 failed' in r.stdout and f'({cls})' in r.stdout
    moe_line = f'{moe_layers} MoE layers' if moe_layers else 'MoE layers'  # a dense one reports none
    assert (moe_line in r.stdout) == bool(moe_layers) and 'timing HF PatchTrain K=4' in r.stdout
    cfg = json.load(open(tiny_dirs / name / 'config.json'))
    assert json.load(open(out))['model_types'] == {name: cfg['model_type']}
    assert families.family(cfg['model_type']).text_only_multimodal
    assert parity.id_limit(cfg) == 508 and parity.is_moe(cfg) == bool(moe_layers) and parity.is_multimodal(cfg)


def test_random_batch_and_route_diff():
    ids = parity.random_batch(1000, 2, 16, seed=3)
    assert ids.shape == (2, 16) and int(ids.max()) < 1000 and torch.equal(ids, parity.random_batch(1000, 2, 16, 3))
    a = [torch.tensor([[1, 1, 0, 0], [0, 1, 1, 0]], dtype=torch.bool)] * 2
    b = [a[0], torch.tensor([[1, 1, 0, 0], [0, 1, 0, 1]], dtype=torch.bool)]
    rows, choices = parity.route_diff(a, b)
    assert rows == pytest.approx(1 / 4) and choices == pytest.approx(1 / 8)
    assert parity.route_diff(a, a[:1]) is None and parity.route_diff([], []) is None
    assert parity.routes_ok((0.005, 0.001), 'fp32') and not parity.routes_ok((0.02, 0.01), 'fp32')
    assert parity.routes_ok((0.3, 0.1), 'bf16') and parity.routes_ok(None, 'fp32')


def test_mcore_route_map_is_reordered_batch_major():
    """megatron's routing_map rows are [T*B] (sequence-major); HF's are [B*T]: the hook must transpose them."""

    class Router(torch.nn.Module):

        def forward(self, x):  # x [T, B, H]: route row (t, b) to expert b*T + t (a distinct expert per row)
            T, B, _ = x.shape
            rmap = torch.zeros(T * B, T * B, dtype=torch.bool)
            for t in range(T):
                for b in range(B):
                    rmap[t * B + b, b * T + t] = True
            return None, rmap

    pytest.importorskip('megatron.core')
    import megatron.core.transformer.moe.router as router_mod
    model = torch.nn.Module()
    model.r = Router()
    orig = router_mod.TopKRouter
    router_mod.TopKRouter = Router
    try:
        with parity.record_routes(model, 'mcore', batch_size=2) as maps:
            model.r(torch.zeros(3, 2, 4))
    finally:
        router_mod.TopKRouter = orig
    assert torch.equal(maps[0], torch.eye(6, dtype=torch.bool))  # row b*T + t -> expert b*T + t


def _placement_worker(hf_dir):
    """In a harness rank: the toy mcore `gpt` model of hf_dir, brought to the state megatron-core leaves it in on a GPU
    (every parameter and buffer on the device, 'meta' standing in for it, but the shared-expert gates, which
    SharedExpertMLP creates on the CPU), then placed as parity.py's old rule did, and by place_model."""
    from harness import build_mcore_model
    (model, ) = build_mcore_model(hf_dir, load_weights=False)
    gates = sorted(n for n, _ in model.named_parameters() if n.endswith('shared_experts.gate_weight'))
    for module in model.modules():
        for key, t in list(module._parameters.items()):
            if t is not None and key != 'gate_weight':
                module._parameters[key] = torch.nn.Parameter(t.to('meta'), requires_grad=t.requires_grad)
        for key, t in list(module._buffers.items()):
            if t is not None:
                module._buffers[key] = t.to('meta')
    before = parity.off_device(model, 'meta')
    if next(model.parameters()).device.type != 'meta':  # the old rule: move when the first parameter is elsewhere
        model.to('meta')
    old_rule = parity.off_device(model, 'meta')
    to = model.to
    model.to = lambda *a, **k: model  # a placement that moves nothing: place_model must fail, naming the gates
    try:
        parity.place_model(model, 'meta')
        skipped = None
    except RuntimeError as e:
        skipped = str(e)
    model.to = to
    parity.place_model(model, 'meta')
    return dict(gates=gates, before=before, old_rule=old_rule, skipped=skipped, after=parity.off_device(model, 'meta'),
                count=len(list(model.parameters())))


def test_place_model_moves_every_parameter_and_catches_one_left_behind(tiny_dirs):
    """qwen2_moe's shared-expert gate (megatron-core 0.16.1 makes it on the CPU, the rest on the GPU) stayed behind
    under parity.py's old placement ("move when the first parameter is not on the GPU"): the GPU error
    'mat2 is on cpu' in shared_experts_compute. place_model moves it and fails loudly on anything left behind."""
    from harness import spawn
    (r, ) = spawn(_placement_worker, 1, str(tiny_dirs / 'qwen1.5-moe-a2.7b-cut'))
    assert len(r['gates']) == 2 and r['count'] > 20  # one gate per MoE layer of the toy model
    assert r['before'] == r['old_rule'] == r['gates']  # exactly the gates are left behind by the old rule
    assert r['skipped'] and all(g in r['skipped'] for g in r['gates'])
    assert r['after'] == []
