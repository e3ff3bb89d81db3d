#!/usr/bin/env python3
"""GPU helper of tests/gpu/critic_families.sh: the critic of each family (swift_plt.critic.families) against the
family's transformers ``*ForTokenClassification``, and its export.

    critic_families.py make --spec SPEC --out DIR [--layers 2] [--tiny]   a random-init critic dir (bf16)
    critic_families.py hf-values --model DIR --out FILE                   transformers values, fp32 and bf16
    critic_families.py mg-values --model DIR --out FILE [--mg-kwargs JSON]   Megatron values, fp32 and bf16
    critic_families.py compare NAME HF.pt MG.pt                           -> two `CRITIC NAME values ...` lines
    critic_families.py export-check NAME --orig DIR --exported DIR --ref HF.pt   -> one `CRITIC NAME export` line

SPEC: a name of make_family_configs.py (its published config.json, the layers cut to --layers; --tiny: its toy
widths) or `tiny:<family>` (swift_plt.tools.tiny_families, toy widths). The critic dir: the family's
``*ForTokenClassification`` (num_labels=1, our format: swift_plt.critic.keys), HF's init with biases, norms and
DeepSeek's expert bias made random (make_family_configs.randomize), value head N(0, (scale / sqrt(H))^2) (values
~N(0, scale^2): the value loss then depends on the forward, not only on the targets); config.json the published one
in our critic format (critic_hf_config_dict: what swift_plt.critic.convert writes for a hub model); tiny BPE
tokenizer. Prints `critic_type: <type>`.
The batch: B=2, S=256 token ids from torch.Generator seed 0 in [4, vocab), positions 0..S-1, causal.
Megatron: MegatronArguments(model_type=<family>_critic) + get_mcore_model + CriticBridge.load_weights, fp32 with
unfused attention and no TF32, bf16 with fused attention; MoE: grouped GEMM, fp32 router, no aux loss (as parity.py).
HF: eager attention and eager experts, fp32 (the reference), then the same weights in bf16 (a yardstick).
Tolerances (relative to max|v| of the HF fp32 values; MoE: a route tie may flip one token, so up to 1 % of the
tokens may exceed the per-token bound):
  fp32   every token |d| <= 1e-4 max|v|
  bf16   mean|d| <= 3e-2 mean|v|; dense also every token |d| <= 1e-1 max|v| (MoE: reported)
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

import torch  # noqa: E402

B, S = 2, 256
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from parity import MOE_KWARGS, NVTE_ATTN_VARS, is_moe, load_hf, read_config  # noqa: E402  (the families' HF side)
TOL = dict(fp32=1e-4, bf16_mean=3e-2, bf16_tok=1e-1, export=1e-6, moe_share=0.01)


def device():
    return 'cuda' if torch.cuda.is_available() else 'cpu'


def exact_fp32():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision('highest')
    torch.use_deterministic_algorithms(True, warn_only=True)


def batch(vocab):
    return torch.randint(4, vocab, (B, S), generator=torch.Generator().manual_seed(0))


# ------------------------------------------------------------------------------------------------------------ make
def cut_layers(cfg, layers):
    n = min(layers, cfg['num_hidden_layers'])
    cfg['num_hidden_layers'] = n
    if 'max_window_layers' in cfg:
        cfg['max_window_layers'] = min(cfg['max_window_layers'], n)
    if isinstance(cfg.get('layer_types'), list):
        cfg['layer_types'] = cfg['layer_types'][:n]
    if cfg.get('first_k_dense_replace', 0) >= n:
        raise ValueError(f'{layers} layers leave no MoE layer (first_k_dense_replace={cfg["first_k_dense_replace"]})')
    return cfg


def make(spec, out, layers, tiny, head_scale, seed):
    import shutil
    import tempfile

    from transformers import AutoConfig, AutoModelForTokenClassification

    from swift_plt.compat.transformers import hf_rope_guard
    from swift_plt.critic.families import critic_for
    from swift_plt.critic.keys import critic_hf_config, critic_hf_config_dict
    dev = device()
    tmp = tempfile.mkdtemp(prefix='critic_families_')
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
            import make_family_configs as mfc
            cfg = cut_layers(mfc.family_config(spec, tiny), layers)
            config = critic_hf_config(mfc.hf_config(cfg))
            torch.manual_seed(seed)
            with hf_rope_guard(), torch.device(dev):
                model = AutoModelForTokenClassification.from_config(config, dtype=torch.bfloat16)
            mfc.randomize(model, seed)
            tok_dir = mfc.make_tokenizer(os.path.join(tmp, 'tok'))
        hidden = model.config.hidden_size
        g = torch.Generator(device='cpu').manual_seed(seed + 2)
        with torch.no_grad():
            w = torch.randn(model.score.weight.shape, generator=g) * head_scale / hidden**0.5
            model.score.weight.copy_(w.to(model.score.weight.dtype))
            if getattr(model.score, 'bias', None) is not None:  # transformers 4.57.x: the format's zero bias
                model.score.bias.zero_()
        model.save_pretrained(out, safe_serialization=True)
        n = sum(p.numel() for p in model.parameters())
        del model
        if not spec.startswith('tiny:'):  # the published config.json in our critic format
            with open(os.path.join(out, 'config.json'), 'w') as f:
                json.dump(critic_hf_config_dict(cfg), f, indent=2)
        for f in os.listdir(tok_dir):
            if f.startswith(('tokenizer', 'special_tokens')):
                shutil.copy(os.path.join(tok_dir, f), out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f'critic: {spec} ({cfg["model_type"]}, {cfg["num_hidden_layers"]} layers, H={hidden}, '
          f'{n / 1e9:.3g} B params, moe={is_moe(cfg)}) -> {out}')
    print(f'critic_type: {critic_for(cfg["model_type"])}')
    print(f'params_b: {n / 1e9:.3f}')


# ------------------------------------------------------------------------------------------------------ HF values
@torch.no_grad()
def hf_values(model_dir, out):
    exact_fp32()
    model, info = load_hf(model_dir, torch.float32, 'AutoModelForTokenClassification', output_loading_info=True)
    ids = batch(model.config.vocab_size).to(device())
    model = model.to(device()).eval()
    res = {'class': type(model).__name__, 'moe': is_moe(read_config(model_dir)),
           'loading_info': {k: sorted(map(str, v)) for k, v in info.items() if isinstance(v, (set, list))}}
    res['fp32'] = model(input_ids=ids).logits[..., 0].float().cpu()
    res['bf16'] = model.to(torch.bfloat16)(input_ids=ids).logits[..., 0].float().cpu()
    torch.save(res, out)
    print(f'hf-values: {res["class"]} values {list(res["fp32"].shape)} loading_info={res["loading_info"]}')


# ------------------------------------------------------------------------------------------------ Megatron values
def mg_values(model_dir, out, precisions, mg_kwargs, port):
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
    model_type = critic_for(cfg['model_type'])
    if torch.cuda.is_available():
        torch.cuda.set_device(0)
    ids = batch(cfg['vocab_size']).to(device())
    pos = torch.arange(S, device=device()).unsqueeze(0).expand(B, S)
    res = {'model_type': model_type}
    for prec in precisions:
        dtype, attn = (torch.bfloat16, 'fused') if prec == 'bf16' else (torch.float32, 'unfused')
        for v in NVTE_ATTN_VARS:  # megatron asserts these match the backend of the previous model
            os.environ.pop(v, None)
        kw = dict(model=model_dir, model_type=model_type, torch_dtype=dtype, bf16=prec == 'bf16', fp16=False,
                  attention_backend=attn, padding_free=False, recompute_granularity='none', seed=42,
                  micro_batch_size=B, global_batch_size=B, finetune=True, no_save_optim=True, no_save_rng=True,
                  no_load_optim=True, no_load_rng=True)
        if is_moe(cfg):
            kw.update(MOE_KWARGS)
        kw.update(mg_kwargs)
        args = MegatronArguments(**kw)
        hf_config = get_processor(model_dir, model_type=model_type).model_info.config
        models = get_mcore_model(args, hf_config)
        models[0].config.bridge.load_weights(models, model_dir)
        model = models[0].to(device()).eval()
        with torch.no_grad():
            out_t = model(input_ids=ids, position_ids=pos, attention_mask=None)
        assert torch.equal(values_of(out_t), out_t[:, :-1, 0])
        mlp = getattr(model.decoder.layers[-1], 'mlp', None)
        res[prec] = out_t[..., 0].float().cpu()
        res[f'{prec}_info'] = dict(type=type(model).__name__, task_type=model.config.task_type,
                                   untied=not model.share_embeddings_and_output_weights,
                                   head=list(model.value_head.weight.shape), params=str(next(model.parameters()).dtype),
                                   attn=model.config.attention_backend.name,
                                   experts=type(getattr(mlp, 'experts', None)).__name__)
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
            tok, share = tok_ok(dd, TOL['bf16_tok'], False)
            ok = dd['rel_mean'] <= TOL['bf16_mean'] and (moe or tok)
            yard = diff(hf['bf16'], hf['fp32'])
            bound = (f'mean tol {TOL["bf16_mean"]:g}; tokens over {TOL["bf16_tok"]:g} max|v|: {share * 100:.2f}%'
                     f'{" (reported: MoE)" if moe else ""}; HF bf16 vs HF fp32 (yardstick) rel_max='
                     f'{yard["rel_max"]:.3g} rel_mean={yard["rel_mean"]:.3g}')
        ok = ok and built
        print(f'CRITIC {name} values {prec}: Megatron {mg["model_type"]} {prec}/{info["attn"]} ({info["type"]}, '
              f'experts {info["experts"]}) vs HF {hf["class"]} fp32: rel_max={dd["rel_max"]:.3g} '
              f'rel_mean={dd["rel_mean"]:.3g} max|v|={dd["vmax"]:.3g}; {bound}'
              f'{"" if built else f" [not built as a critic: {info}]"} -> {"OK" if ok else "FAIL"}')
        rc |= not ok
    return rc


def export_check(name, orig, exported, ref_path, ignore_dtype=False):
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
    fields = ('architectures', 'num_labels', 'tie_word_embeddings', 'num_hidden_layers', 'rope_scaling')
    cfg_differ = [k for k in fields if getattr(ca, k, None) != getattr(cb, k, None)]
    exact_fp32()
    model, info = load_hf(exported, torch.float32, 'AutoModelForTokenClassification', output_loading_info=True)
    loading = {k: sorted(map(str, v)) for k, v in info.items() if isinstance(v, (set, list)) and v}
    ids = batch(model.config.vocab_size).to(device())
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
    p = sub.add_parser('hf-values')
    p.add_argument('--model', required=True)
    p.add_argument('--out', required=True)
    p = sub.add_parser('mg-values')
    p.add_argument('--model', required=True)
    p.add_argument('--out', required=True)
    p.add_argument('--precisions', default='fp32,bf16')
    p.add_argument('--mg-kwargs', default='{}', help='JSON of extra MegatronArguments fields (CPU harness)')
    p.add_argument('--port', type=int, default=29631)
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
    a = ap.parse_args()
    if a.cmd == 'make':
        make(a.spec, a.out, a.layers, a.tiny, a.head_scale, a.seed)
    elif a.cmd == 'hf-values':
        hf_values(a.model, a.out)
    elif a.cmd == 'mg-values':
        mg_values(a.model, a.out, a.precisions.split(','), json.loads(a.mg_kwargs), a.port)
    elif a.cmd == 'compare':
        return compare(a.name, a.hf, a.mg)
    else:
        return export_check(a.name, a.orig, a.exported, a.ref, a.ignore_dtype)
    return 0


if __name__ == '__main__':
    sys.exit(main())
