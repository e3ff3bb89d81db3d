#!/usr/bin/env python3
"""GPU helper of tests/gpu/critic_families.sh: the critic of each family (swift_plt.critic.families) against the
family's transformers ``*ForTokenClassification``, and its export.

    critic_families.py make --spec SPEC --out DIR [--layers 2] [--tiny]   a random-init critic dir (bf16)
    critic_families.py hf-values --model DIR --out FILE [--hf-gdn auto|torch]   transformers values, fp32 and bf16
    critic_families.py mg-values --model DIR --out FILE [--mg-kwargs JSON] [--gdn fla|torch]   Megatron values
    critic_families.py compare NAME HF.pt MG.pt                           -> two `CRITIC NAME values ...` lines
    critic_families.py export-check NAME --orig DIR --exported DIR --ref HF.pt   -> one `CRITIC NAME export` line

SPEC: a name of make_family_configs.py (its published config.json, the layers cut to --layers; --tiny: its toy
widths) or `tiny:<family>` (swift_plt.tools.tiny_families, toy widths). Every per-family decision reads the family's
record (swift_plt.families.family(model_type): moe, linear_attention, text_only_multimodal, critic / no_critic).
The cut applies to the language model's config (text_config of a multimodal checkpoint: Qwen3.5), `layer_types`
cut with it; a Gated-DeltaNet hybrid (linear_attention) keeps a whole number of its full_attention_interval (at
least one: 2 asked -> 4 kept; mcore-bridge builds the layer pattern from full_attention_interval, transformers from
layer_types, and transformers' cache needs a full-attention layer). A family whose record has no critic (no_critic:
Qwen3.5-MoE) is refused before anything is built: `no_critic: <reason>` (critic_families.sh: a SKIP line).
The critic dir: the family's ``*ForTokenClassification`` (num_labels=1, our format: swift_plt.critic.keys), HF's init
with biases, norms and DeepSeek's expert bias made random (make_family_configs.randomize), value head
N(0, (scale / sqrt(H))^2) (values ~N(0, scale^2): the value loss then depends on the forward, not only on the
targets); config.json the published one in our critic format (critic_hf_config_dict: what swift_plt.critic.convert
writes for a hub model); tiny BPE tokenizer; a multimodal checkpoint also the processor files its hub checkpoints
ship (ms-swift loads them). Prints `critic_type: <type>`, `template: <ms-swift template>` (chatml; a multimodal
checkpoint its record's), `params_b: <B>` and for a hybrid `gdn: fla|torch (why)`: the Gated DeltaNet path its
Megatron runs take (torch: megatron-core's, deterministic_mode with padded batches, where fla refuses its backward on
this GPU and Triton: swift_plt.plugin.arguments.fla_hopper_problem).
The batch: B=2, S=256 token ids from torch.Generator seed 0 in [4, limit), limit the vocabulary and a multimodal
checkpoint's media token ids (parity.id_limit), positions 0..S-1, causal.
Megatron: MegatronArguments(model_type=<family>_critic) + get_mcore_model + CriticBridge.load_weights, fp32 with
unfused attention and no TF32, bf16 with fused attention; MoE: grouped GEMM, fp32 router, no aux loss (as parity.py);
a multimodal checkpoint's HF config read without its processor (as parity.py); --gdn torch: megatron-core's torch
Gated DeltaNet (deterministic_mode, NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 while it is built).
HF: eager attention and eager experts, fp32 (the reference), then the same weights in bf16 (a yardstick); --hf-gdn
torch: a hybrid's Gated DeltaNet on transformers' own torch code (swift_plt.tools.hf_gdn: no cold fla compile, and an
exact reference). fp32 with NVIDIA_TF32_OVERRIDE=0 and TRITON_F32_DEFAULT=ieee (no TF32 in cuBLAS, cuDNN, Triton).
Tolerances (relative to max|v| of the HF fp32 values; MoE: a route tie may flip one token, so up to 1 % of the
tokens may exceed the per-token bound):
  fp32   every token |d| <= 1e-4 max|v|
  bf16   dense: mean|d| <= 3e-2 mean|v| and every token |d| <= 1e-1 max|v|.
         MoE or hybrid (record.moe / record.linear_attention): measured against the yardstick, HF's own bf16 model
         against HF fp32 on the same weights (a bf16 route flip or a bf16 recurrence moves values for HF as much as
         for Megatron: Qwen3-Next cut, HF bf16 0.20 from HF fp32): mean|d| <= max(3e-2, YARD_FACTOR x the
         yardstick's mean|d|), YARD_FACTOR 1.5; per token: MoE reported, a dense hybrid's share of tokens over
         1e-1 max|v| <= YARD_FACTOR x the yardstick's (0 where HF's bf16 has none). The line prints the bar, the
         yardstick and the rule.
  export every tensor bit for bit as the original dir; transformers loads it with no missing / unexpected key; its
         fp32 values = the original's (every token |d| <= 1e-6 max|v|: same weights, same code)
HF and Megatron run in separate processes (mcore-bridge's RoPE code must not run before HF builds its model).
"""
import argparse
import json
import os
import sys

# fp32 means fp32 on both sides: no TF32 anywhere (set before CUDA initializes); deterministic cuBLAS
os.environ.setdefault('NVIDIA_TF32_OVERRIDE', '0')
os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')
os.environ.setdefault('TRITON_F32_DEFAULT', 'ieee')  # fp32 Triton dots (fla's Gated DeltaNet kernels) without TF32

import torch  # noqa: E402

B, S = 2, 256
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_family_configs as mfc  # noqa: E402  (stdlib only at import)
from parity import (MOE_KWARGS, NVTE_ATTN_VARS, fla_or_torch, id_limit, load_hf,  # noqa: E402  (the families' HF side)
                    read_config)
from swift_plt.tools.hf_gdn import hf_torch_gdn  # noqa: E402
TOL = dict(fp32=1e-4, bf16_mean=3e-2, bf16_tok=1e-1, export=1e-6, moe_share=0.01)
YARD_FACTOR = 1.5  # MoE / hybrid bf16: Megatron may be this many times as far from HF fp32 as HF's own bf16 is
CHATML = 'chatml'  # the sft template with the tiny BPE tokenizer (a multimodal checkpoint: its record's template)


def device():
    return 'cuda' if torch.cuda.is_available() else 'cpu'


def exact_fp32():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision('highest')
    torch.use_deterministic_algorithms(True, warn_only=True)


def batch(limit):
    """The fixed [B, S] ids in [4, limit) (limit: parity.id_limit, below a multimodal checkpoint's media ids)."""
    return torch.randint(4, limit, (B, S), generator=torch.Generator().manual_seed(0))


def record(model_type):
    """The family record of a config.json `model_type` (swift_plt.families); ValueError for none."""
    from swift_plt import families
    fam = families.family(model_type)
    if fam is None:
        raise ValueError(f'model type `{model_type}` is no family swift-plt knows (swift_plt.families)')
    return fam


def flags(cfg):
    """What the checks need of a family, from its record."""
    fam = record(cfg['model_type'])
    return dict(family=fam.hf_type, moe=fam.moe, hybrid=fam.linear_attention, structure=fam.structure)


# ------------------------------------------------------------------------------------------------------------ make
def cut_layers(cfg, layers):
    """cfg (a config.json dict) cut to `layers` layers of its language model (mfc.text_config: Qwen3.5's text_config),
    layer_types with it. A Gated-DeltaNet hybrid (record.linear_attention) keeps a whole number of its
    full_attention_interval, at least one (a cut of only Gated DeltaNet layers: transformers' cache raises in
    get_seq_length, and mcore-bridge reads the pattern from full_attention_interval, transformers from layer_types:
    whole intervals keep both the same). Returns (cfg, note: why the layers differ from the ask, or '')."""
    fam, text = record(cfg['model_type']), mfc.text_config(cfg)
    note = ''
    if fam.linear_attention:
        interval = text.get('full_attention_interval') or 4  # transformers' and mcore-bridge's default alike
        whole = max(1, -(-layers // interval)) * interval
        if whole != layers:
            note = (f'{layers} layers asked, {whole} kept: a hybrid keeps whole full_attention_interval={interval} '
                    'groups (its full-attention layer last)')
        layers = whole
    n = min(layers, text['num_hidden_layers'])
    text['num_hidden_layers'] = n
    if 'max_window_layers' in text:
        text['max_window_layers'] = min(text['max_window_layers'], n)
    if isinstance(text.get('layer_types'), list):
        text['layer_types'] = text['layer_types'][:n]
    if text.get('first_k_dense_replace', 0) >= n:
        raise ValueError(f'{layers} layers leave no MoE layer (first_k_dense_replace={text["first_k_dense_replace"]})')
    if fam.linear_attention:
        types = text.get('layer_types') or mfc.hybrid_layer_types(n, interval)
        if types != mfc.hybrid_layer_types(n, interval) or 'full_attention' not in types:
            raise ValueError(f'the cut keeps layer_types {types}: not the full_attention_interval={interval} pattern '
                             'mcore-bridge builds, or no full-attention layer (transformers needs one)')
    return cfg, note


def spec_model_type(spec):
    """The config.json model_type SPEC builds (nothing built)."""
    if spec.startswith('tiny:'):
        return spec[5:]
    if spec not in mfc.FAMILIES:
        raise ValueError(f'unknown spec {spec!r}: tiny:<family> or one of {mfc.NAMES}')
    return mfc.FAMILIES[spec][0]['model_type']


def keep_interval(out, lm_cfg):
    """transformers 5 re-dumps a hybrid's config without full_attention_interval, which mcore-bridge reads: put the
    source's back into out/config.json (its text_config for a multimodal checkpoint)."""
    interval = mfc.text_config(lm_cfg).get('full_attention_interval')
    if interval is None:
        return
    path = os.path.join(out, 'config.json')
    with open(path) as f:
        saved = json.load(f)
    mfc.text_config(saved)['full_attention_interval'] = interval
    with open(path, 'w') as f:
        json.dump(saved, f, indent=2)


def make(spec, out, layers, tiny, head_scale, seed):
    import shutil
    import tempfile

    from transformers import AutoConfig, AutoModelForTokenClassification

    from swift_plt.compat.transformers import hf_rope_guard
    from swift_plt.critic.families import critic_for
    from swift_plt.critic.keys import critic_hf_config, critic_hf_config_dict
    fam = record(spec_model_type(spec))
    if fam.critic is None:  # refused before anything is built (critic_families.sh: a SKIP line)
        print(f'critic: {spec} ({fam.hf_type}, {fam.structure}): no critic')
        print('critic_type: None')
        print(f'no_critic: {fam.no_critic or f"the record of `{fam.hf_type}` has no critic type"}')
        return 0 if fam.no_critic else 1
    dev = device()
    tmp = tempfile.mkdtemp(prefix='critic_families_')
    note = ''
    try:
        if spec.startswith('tiny:'):
            from swift_plt.tools.tiny_families import make_tiny_family
            lm = make_tiny_family(spec[5:], os.path.join(tmp, 'lm'), seed=seed)
            cfg = read_config(lm)
            config = critic_hf_config(AutoConfig.from_pretrained(lm))
            with hf_rope_guard():
                model = AutoModelForTokenClassification.from_pretrained(lm, config=config, dtype=torch.bfloat16)
            tok_dir = lm
        else:
            cfg, note = cut_layers(mfc.family_config(spec, tiny), layers)
            config = critic_hf_config(mfc.hf_config(cfg))
            torch.manual_seed(seed)
            with hf_rope_guard(), torch.device(dev):
                model = AutoModelForTokenClassification.from_config(config, dtype=torch.bfloat16)
            mfc.randomize(model, seed)
            tok_dir = mfc.make_tokenizer(os.path.join(tmp, 'tok'))
        hidden = model.score.weight.shape[1]  # (a multimodal config has no top-level hidden_size)
        g = torch.Generator(device='cpu').manual_seed(seed + 2)
        with torch.no_grad():
            w = torch.randn(model.score.weight.shape, generator=g) * head_scale / hidden**0.5
            model.score.weight.copy_(w.to(model.score.weight.dtype))
            if getattr(model.score, 'bias', None) is not None:  # transformers 4.57.x: the format's zero bias
                model.score.bias.zero_()
        model.save_pretrained(out, safe_serialization=True)
        n = sum(p.numel() for p in model.parameters())
        del model
        if spec.startswith('tiny:'):
            keep_interval(out, cfg)
        else:  # the published config.json in our critic format
            with open(os.path.join(out, 'config.json'), 'w') as f:
                json.dump(critic_hf_config_dict(cfg), f, indent=2)
        if fam.text_only_multimodal:  # ms-swift loads the checkpoint's processor (Qwen3-VL's for Qwen3.5)
            mfc.write_qwen3_5_processor(out)
        for f in os.listdir(tok_dir):
            if f.startswith(('tokenizer', 'special_tokens')):
                shutil.copy(os.path.join(tok_dir, f), out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    text = mfc.text_config(cfg)
    if note:
        print(f'layers: {note}')
    print(f'critic: {spec} ({cfg["model_type"]}, {fam.structure}, {text["num_hidden_layers"]} layers'
          f'{" " + str(text["layer_types"]) if text.get("layer_types") else ""}, H={hidden}, {n / 1e9:.3g} B params, '
          f'moe={fam.moe}) -> {out}')
    print(f'critic_type: {critic_for(cfg["model_type"])}')
    print(f'template: {fam.critic.template if fam.text_only_multimodal else CHATML}')
    print(f'params_b: {n / 1e9:.3f}')
    if fam.linear_attention:
        path, why = fla_or_torch()
        print(f'gdn: {path} ({why})')
    return 0


# ------------------------------------------------------------------------------------------------------ HF values
def hf_critic(model_dir, hf_gdn):
    """(model, loading info) of the critic dir in transformers, fp32; hf_gdn 'torch': a hybrid's Gated DeltaNet on
    transformers' own torch code (swift_plt.tools.hf_gdn)."""
    model, info = load_hf(model_dir, torch.float32, 'AutoModelForTokenClassification', output_loading_info=True)
    rebound = hf_torch_gdn(model) if hf_gdn == 'torch' else []
    if rebound:
        print(f'HF GDN: transformers\' torch code (rebound: {", ".join(rebound)})')
    return model, info


@torch.no_grad()
def hf_values(model_dir, out, hf_gdn='auto'):
    exact_fp32()
    cfg = read_config(model_dir)
    model, info = hf_critic(model_dir, hf_gdn)
    ids = batch(id_limit(cfg)).to(device())
    model = model.to(device()).eval()
    res = {'class': type(model).__name__, **flags(cfg), 'hf_gdn': hf_gdn,
           'loading_info': {k: sorted(map(str, v)) for k, v in info.items() if isinstance(v, (set, list))}}
    res['fp32'] = model(input_ids=ids).logits[..., 0].float().cpu()
    res['bf16'] = model.to(torch.bfloat16)(input_ids=ids).logits[..., 0].float().cpu()
    torch.save(res, out)
    print(f'hf-values: {res["class"]} values {list(res["fp32"].shape)} ({res["structure"]}, hf gdn {hf_gdn}) '
          f'loading_info={res["loading_info"]}')


# ------------------------------------------------------------------------------------------------ Megatron values
def mg_values(model_dir, out, precisions, mg_kwargs, port, gdn='fla'):
    for k, v in dict(RANK='0', WORLD_SIZE='1', LOCAL_RANK='0', LOCAL_WORLD_SIZE='1', MASTER_ADDR='127.0.0.1').items():
        os.environ.setdefault(k, v)  # a plain `python` run is a world of one
    os.environ['MASTER_PORT'] = str(port)  # lanes run side by side: each its own port
    exact_fp32()
    import swift_plt.plugin.import_hook as activation
    activation.install()  # no-op when the .pth startup hook already ran
    from swift_plt.plugin.register import register_all
    register_all()
    from swift.megatron.arguments import MegatronArguments
    from swift.megatron.model import get_mcore_model
    from swift.model import get_processor

    from swift_plt.critic.families import critic_for
    from swift_plt.critic.model import values as values_of
    cfg = read_config(model_dir)
    fam = record(cfg['model_type'])
    model_type = critic_for(cfg['model_type'])
    if torch.cuda.is_available():
        torch.cuda.set_device(0)
    ids = batch(id_limit(cfg)).to(device())
    pos = torch.arange(S, device=device()).unsqueeze(0).expand(B, S)
    res = {'model_type': model_type, 'gdn': gdn if fam.linear_attention else None}
    for prec in precisions:
        dtype, attn = (torch.bfloat16, 'fused') if prec == 'bf16' else (torch.float32, 'unfused')
        for v in NVTE_ATTN_VARS:  # megatron asserts these match the backend of the previous model
            os.environ.pop(v, None)
        kw = dict(model=model_dir, model_type=model_type, torch_dtype=dtype, bf16=prec == 'bf16', fp16=False,
                  attention_backend=attn, padding_free=False, recompute_granularity='none', seed=42,
                  micro_batch_size=B, global_batch_size=B, finetune=True, no_save_optim=True, no_save_rng=True,
                  no_load_optim=True, no_load_rng=True)
        if fam.moe:
            kw.update(MOE_KWARGS)
        kw.update(mg_kwargs)
        nvte_det = os.environ.get('NVTE_ALLOW_NONDETERMINISTIC_ALGO')
        if fam.linear_attention and gdn == 'torch':  # megatron-core's torch Gated DeltaNet (as parity.py)
            extra = kw.get('megatron_extra_kwargs') or {}
            extra = json.loads(extra) if isinstance(extra, str) else dict(extra)
            kw['megatron_extra_kwargs'] = {**extra, 'deterministic_mode': True}
            # megatron's TEDotProductAttention refuses deterministic_mode unless this is 0 (read at build time)
            os.environ['NVTE_ALLOW_NONDETERMINISTIC_ALGO'] = '0'
        try:
            args = MegatronArguments(**kw)
            if fam.text_only_multimodal:  # text only: ms-swift's loader's config, without the processor (as parity.py)
                from transformers import AutoConfig
                hf_config = AutoConfig.from_pretrained(model_dir)
                hf_config.name_or_path = model_dir
            else:
                hf_config = get_processor(model_dir, model_type=model_type).model_info.config
            models = get_mcore_model(args, hf_config)
        finally:
            if nvte_det is None:
                os.environ.pop('NVTE_ALLOW_NONDETERMINISTIC_ALGO', None)
            else:
                os.environ['NVTE_ALLOW_NONDETERMINISTIC_ALGO'] = nvte_det
        models[0].config.bridge.load_weights(models, model_dir)
        model = models[0].to(device()).eval()
        if fam.linear_attention and gdn == 'torch' and not getattr(model.config, 'deterministic_mode', False):
            raise RuntimeError('the torch Gated DeltaNet was asked for, but the model config has deterministic_mode '
                               'off')
        with torch.no_grad():
            out_t = model(input_ids=ids, position_ids=pos, attention_mask=None)
        assert torch.equal(values_of(out_t), out_t[:, :-1, 0])
        lm_model = getattr(model, 'language_model', model)  # a multimodal checkpoint's (Qwen3.5) language model
        mlp = getattr(lm_model.decoder.layers[-1], 'mlp', None)
        res[prec] = out_t[..., 0].float().cpu()
        res[f'{prec}_info'] = dict(type=type(model).__name__, task_type=model.config.task_type,
                                   untied=not lm_model.share_embeddings_and_output_weights,
                                   head=list(model.value_head.weight.shape), params=str(next(model.parameters()).dtype),
                                   attn=model.config.attention_backend.name,
                                   experts=type(getattr(mlp, 'experts', None)).__name__)
        if fam.linear_attention:
            res[f'{prec}_info']['gdn'] = gdn
        print(f'mg-values {prec}: {model_type} {res[f"{prec}_info"]}', flush=True)
        del model, models
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    torch.save(res, out)
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------------- checks
def diff(got, ref):
    d = (got.double() - ref.double()).abs()
    vmax = ref.abs().max().item()
    return dict(rel_max=d.max().item() / vmax, rel_mean=d.mean().item() / ref.abs().mean().item(), vmax=vmax,
                share=lambda tol: (d > tol * vmax).double().mean().item())


def tok_ok(dd, tol, moe):
    share = dd['share'](tol)
    return share <= (TOL['moe_share'] if moe else 0.0), share


def bf16_bar(hf, dd, yard):
    """(ok, words) of the bf16 values: dense as fixed bars; MoE / hybrid (hf['moe'] / hf['hybrid'], from the family
    record) against the yardstick (HF bf16 vs HF fp32 on the same weights), YARD_FACTOR times it (module docstring)."""
    moe, by_yard = hf['moe'], hf['moe'] or hf.get('hybrid', False)
    tok, share = tok_ok(dd, TOL['bf16_tok'], False)
    yard_share = yard['share'](TOL['bf16_tok'])
    yard_words = (f'HF bf16 vs HF fp32 (yardstick) rel_max={yard["rel_max"]:.3g} rel_mean={yard["rel_mean"]:.3g} '
                  f'tokens over {TOL["bf16_tok"]:g} max|v|: {yard_share * 100:.2f}%')
    if not by_yard:
        ok = dd['rel_mean'] <= TOL['bf16_mean'] and tok
        return ok, (f'mean bar {TOL["bf16_mean"]:g} (dense); tokens over {TOL["bf16_tok"]:g} max|v|: '
                    f'{share * 100:.2f}% (allowed 0%); {yard_words}')
    bar = max(TOL['bf16_mean'], YARD_FACTOR * yard['rel_mean'])
    ok = dd['rel_mean'] <= bar
    kind = 'MoE' if moe else 'hybrid'
    if moe:
        tok_words = f'tokens over {TOL["bf16_tok"]:g} max|v|: {share * 100:.2f}% (reported: MoE)'
    else:
        allowed = YARD_FACTOR * yard_share
        ok = ok and share <= allowed
        tok_words = (f'tokens over {TOL["bf16_tok"]:g} max|v|: {share * 100:.2f}% (allowed {allowed * 100:.2f}% = '
                     f'{YARD_FACTOR:g} x the yardstick\'s)')
    return ok, (f'mean bar {bar:.3g} = max({TOL["bf16_mean"]:g}, {YARD_FACTOR:g} x yardstick rel_mean) ({kind}: '
                f'against the yardstick); {tok_words}; {yard_words}')


def compare(name, hf_path, mg_path):
    hf, mg = torch.load(hf_path, weights_only=False), torch.load(mg_path, weights_only=False)
    moe, rc = hf['moe'], 0
    for prec in ('fp32', 'bf16'):
        if prec not in mg:
            print(f'CRITIC {name} values {prec}: no Megatron values -> FAIL')
            rc = 1
            continue
        if mg[prec].shape != hf['fp32'].shape:
            print(f'CRITIC {name} values {prec}: shapes {list(mg[prec].shape)} vs {list(hf["fp32"].shape)} -> FAIL')
            rc = 1
            continue
        dd, info = diff(mg[prec], hf['fp32']), mg[f'{prec}_info']
        built = info['task_type'] == 'seq_cls' and info['untied'] and info['head'][0] == 1
        if prec == 'fp32':
            ok, share = tok_ok(dd, TOL['fp32'], moe)
            allowed = TOL['moe_share'] * 100 if moe else 0
            bound = f'tokens over {TOL["fp32"]:g} max|v|: {share * 100:.2f}% (allowed {allowed:g}%)'
        else:
            ok, bound = bf16_bar(hf, dd, diff(hf['bf16'], hf['fp32']))
        ok = ok and built
        gdn = f', gdn {info["gdn"]}, HF gdn {hf.get("hf_gdn", "auto")}' if info.get('gdn') else ''
        print(f'CRITIC {name} values {prec}: Megatron {mg["model_type"]} {prec}/{info["attn"]} ({info["type"]}, '
              f'experts {info["experts"]}{gdn}) vs HF {hf["class"]} fp32: rel_max={dd["rel_max"]:.3g} '
              f'rel_mean={dd["rel_mean"]:.3g} max|v|={dd["vmax"]:.3g}; {bound}'
              f'{"" if built else f" [not built as a critic: {info}]"} -> {"OK" if ok else "FAIL"}')
        rc |= not ok
    return rc


def export_check(name, orig, exported, ref_path, ignore_dtype=False, hf_gdn='auto'):
    from safetensors import safe_open
    from transformers import AutoConfig

    def tensors(d):
        out = {}
        for f in sorted(os.listdir(d)):
            if f.endswith('.safetensors'):
                with safe_open(os.path.join(d, f), 'pt') as g:
                    out.update({k: g.get_tensor(k) for k in g.keys()})
        return out

    a, b = tensors(orig), tensors(exported)
    differ = sorted(k for k in set(a) & set(b) if not torch.equal(a[k], b[k]) or  # (equal values in any dtype)
                    (a[k].dtype != b[k].dtype and not ignore_dtype))
    keys_ok = set(a) == set(b)
    ca, cb = AutoConfig.from_pretrained(orig), AutoConfig.from_pretrained(exported)
    fields = ('architectures', 'num_labels', 'tie_word_embeddings', 'rope_scaling')
    text_fields = ('num_hidden_layers', 'layer_types', 'rope_scaling')  # the language model's (Qwen3.5: text_config)
    cfg_differ = [k for k in fields if getattr(ca, k, None) != getattr(cb, k, None)]
    cfg_differ += [f'text.{k}' for k in text_fields
                   if getattr(ca.get_text_config(), k, None) != getattr(cb.get_text_config(), k, None)]
    exact_fp32()
    model, info = hf_critic(exported, hf_gdn)
    loading = {k: sorted(map(str, v)) for k, v in info.items() if isinstance(v, (set, list)) and v}
    ids = batch(id_limit(read_config(orig))).to(device())
    with torch.no_grad():
        values = model.to(device()).eval()(input_ids=ids).logits[..., 0].float().cpu()
    ref = torch.load(ref_path, weights_only=False)
    dd = diff(values, ref['fp32'])
    vals_ok, share = tok_ok(dd, TOL['export'], ref['moe'])
    ok = keys_ok and not differ and not cfg_differ and not loading and vals_ok and type(model).__name__ == ref['class']
    detail = []
    if not keys_ok:
        detail.append(f'keys only in original {sorted(set(a) - set(b))[:5]}, '
                      f'only in export {sorted(set(b) - set(a))[:5]}')
    if differ:
        detail.append('tensors differ: ' + ', '.join(f'{k} {a[k].dtype}->{b[k].dtype}' for k in differ[:5]) +
                      (f' (+{len(differ) - 5})' if len(differ) > 5 else ''))
    if cfg_differ:
        detail.append(f'config fields differ: {cfg_differ}')
    if ignore_dtype:
        detail.append('dtypes not compared (--ignore-dtype)')
    print(f'CRITIC {name} export: {len(b)} tensors, {len(b) - len(differ) if keys_ok else "?"} bit for bit as the '
          f'original; {type(model).__name__} loads it (loading info {loading or "empty"}); fp32 values vs the '
          f'original dir rel_max={dd["rel_max"]:.3g} (tokens over {TOL["export"]:g} max|v|: {share * 100:.2f}%)'
          f'{"; " + "; ".join(detail) if detail else ""} -> {"OK" if ok else "FAIL"}')
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest='cmd', required=True)
    p = sub.add_parser('make')
    p.add_argument('--spec', required=True)
    p.add_argument('--out', required=True)
    p.add_argument('--layers', type=int, default=2)
    p.add_argument('--tiny', action='store_true')
    p.add_argument('--head-scale', type=float, default=1.0)
    p.add_argument('--seed', type=int, default=0)
    hf_gdn = dict(choices=('auto', 'torch'), default='auto',
                  help="a hybrid's HF Gated DeltaNet: what transformers picks (auto) or its own torch code")
    p = sub.add_parser('hf-values')
    p.add_argument('--model', required=True)
    p.add_argument('--out', required=True)
    p.add_argument('--hf-gdn', **hf_gdn)
    p = sub.add_parser('mg-values')
    p.add_argument('--model', required=True)
    p.add_argument('--out', required=True)
    p.add_argument('--precisions', default='fp32,bf16')
    p.add_argument('--mg-kwargs', default='{}', help='JSON of extra MegatronArguments fields (CPU harness)')
    p.add_argument('--port', type=int, default=29631)
    p.add_argument('--gdn', choices=('fla', 'torch'), default='fla',
                   help="a hybrid's Megatron Gated DeltaNet: fla's kernels or megatron-core's torch path "
                   '(deterministic_mode)')
    p = sub.add_parser('compare')
    p.add_argument('name')
    p.add_argument('hf')
    p.add_argument('mg')
    p = sub.add_parser('export-check')
    p.add_argument('name')
    p.add_argument('--orig', required=True)
    p.add_argument('--exported', required=True)
    p.add_argument('--ref', required=True)
    p.add_argument('--ignore-dtype', action='store_true',
                   help='CPU dry run: the harness keeps the norms in fp32 (torch norms for TE ones)')
    p.add_argument('--hf-gdn', **hf_gdn)
    a = ap.parse_args()
    if a.cmd == 'make':
        return make(a.spec, a.out, a.layers, a.tiny, a.head_scale, a.seed)
    elif a.cmd == 'hf-values':
        hf_values(a.model, a.out, a.hf_gdn)
    elif a.cmd == 'mg-values':
        mg_values(a.model, a.out, a.precisions.split(','), json.loads(a.mg_kwargs), a.port, a.gdn)
    elif a.cmd == 'compare':
        return compare(a.name, a.hf, a.mg)
    else:
        return export_check(a.name, a.orig, a.exported, a.ref, a.ignore_dtype, a.hf_gdn)
    return 0


if __name__ == '__main__':
    sys.exit(main())
