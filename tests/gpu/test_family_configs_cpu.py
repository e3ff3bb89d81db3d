"""CPU checks of the families GPU step: make_family_configs.py (published sizes on the meta device, toy-width dirs
that transformers loads with the structure intact) and parity.py's pure helpers (random ids, route comparison)."""
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

from swift_plt.compat.transformers import is_transformers_5  # noqa: E402


def test_published_sizes_fit_one_80gb_gpu():
    expect = {'qwen2.5-1.5b': 1.544e9, 'qwen3-1.7b': 1.721e9, 'qwen3-30b-a3b-cut': 3.115e9, 'deepseek-v3-cut': 4.309e9}
    for name, n in expect.items():
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
    assert mfc.main(['--out', str(out), '--tiny', '--device', 'cpu', '--json', str(out / 'models.json')]) == 0
    return out


def test_tiny_dirs_load_with_their_structure(tiny_dirs):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from swift_plt.compat.transformers import hf_rope_guard
    report = json.load(open(tiny_dirs / 'models.json'))
    classes = {'qwen2.5-1.5b': 'Qwen2ForCausalLM', 'qwen3-1.7b': 'Qwen3ForCausalLM',
               'qwen3-30b-a3b-cut': 'Qwen3MoeForCausalLM', 'deepseek-v3-cut': 'DeepseekV3ForCausalLM'}
    for name, cls in classes.items():
        d = tiny_dirs / name
        cfg = json.load(open(d / 'config.json'))
        assert cfg == mfc.family_config(name, tiny=True) and report[name]['model_type'] == cfg['model_type']
        with hf_rope_guard():
            model = AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32)
        assert type(model).__name__ == cls
        tok = AutoTokenizer.from_pretrained(str(d))
        ids = torch.tensor([tok('The old sailor walked to the harbour.')['input_ids']])
        assert int(ids.max()) < cfg['vocab_size']
        with torch.no_grad():
            assert torch.isfinite(model(input_ids=ids).logits).all()
        params = dict(model.named_parameters())
        norms = [p for n, p in params.items() if p.dim() == 1 and 'norm' in n]
        assert norms and all(not torch.equal(p, torch.ones_like(p)) for p in norms)  # a swapped norm would show
        with safe_open(str(d / 'model.safetensors'), 'pt') as f:
            keys = set(f.keys())
            if name == 'qwen2.5-1.5b':
                assert float(f.get_tensor('model.layers.0.self_attn.q_proj.bias').abs().sum()) > 0
            if name == 'deepseek-v3-cut':
                b = f.get_tensor('model.layers.1.mlp.gate.e_score_correction_bias')
                assert b.dtype == torch.float32 and float(b.abs().sum()) > 0
        if 'moe' in cfg['model_type'] or cfg['model_type'] == 'deepseek_v3':
            assert 'model.layers.1.mlp.experts.0.gate_proj.weight' in keys  # the hub format mcore-bridge reads
    ds = AutoModelForCausalLM.from_config(mfc.hf_config(mfc.family_config('deepseek-v3-cut', tiny=True)))
    assert ds.config.q_lora_rank == 32 and ds.config.first_k_dense_replace == 1


@pytest.fixture(scope='module')
def parity_hf_only(tiny_dirs, tmp_path_factory):
    """parity.py --hf-only on the MoE dir: the HF reference and the plugin's loss on its logits."""
    out = tmp_path_factory.mktemp('parity') / 'p.json'
    moe = str(tiny_dirs / 'qwen3-30b-a3b-cut')
    r = subprocess.run([sys.executable, os.path.join(HERE, 'parity.py'), '--model', moe, '--random-ids', '--S', '32',
                        '--hf-only', '--hf-device', 'cpu', '--json', str(out)],
                       capture_output=True, text=True, timeout=600)
    return r, out


def test_parity_reference_runs_on_a_tiny_family_dir(parity_hf_only):
    r, out = parity_hf_only
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert 'PARITY summary: 1 lines, 0 failed' in r.stdout
    res = json.load(open(out))
    assert res['model_types'] == {'qwen3-30b-a3b-cut': 'qwen3_moe'}


@pytest.mark.skipif(not is_transformers_5(), reason='transformers 4.57 has no MoE router module (its gate is a Linear '
                    'inside the sparse block): parity.py records HF routes on 5.x only')
def test_parity_records_the_hf_moe_routes(parity_hf_only):
    r, _ = parity_hf_only
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert '2 MoE layers' in r.stdout


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
