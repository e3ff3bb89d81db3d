#!/usr/bin/env python3
"""PLT parity, one process, one GPU: Megatron PLTGPTModel (built through ms-swift + mcore-bridge, TE layers, HF weights
loaded by mcore-bridge's GPTBridge) against PatchTrain's formula on plain transformers LlamaForCausalLM.

    python3 tests/gpu/parity.py --model DIR [--model DIR2 ...] --data train.jsonl [--json OUT.json]
    python3 tests/gpu/parity.py --model DIR --data train.jsonl --hf-only --hf-device cpu   # reference only (CPU)

For every model dir, on one fixed batch (B=2, S=256 token ids of real text from the jsonl, tokenized with the
first model dir's tokenizer):
  1. HF reference FIRST (mcore-bridge's rope code replaces transformers' ROPE_INIT_FUNCTIONS['default'] once it
     runs), swift_plt.patch_level.reference: the forward in fp32 on the GPU and fp64 on the CPU, the loss in fp64:
       e = embed(input_ids).view(B, P, K, H).mean(2); h = model.model(inputs_embeds=e, position_ids=arange(P))
       logits = lm_head(h); loss = sum_k nll_loss(log_softmax(logits[:, :-1]), labels[:, K:].view(B,P-1,K)[..., k]) / K
     plus the token-level (K=1) causal-LM loss, and a control: the PLT loss with targets shifted by one token (how
     far a mis-aligned target would move the loss: the margin the parity numbers must beat).
  2. Megatron: MegatronArguments(model_type=llama3_2_plt, patch_size=K) -> swift.megatron.model.get_mcore_model
     -> config.bridge.load_weights; forward(input_ids, position_ids, labels) with labels token-aligned and the first
     patch -100 (swift_plt.patch_level.layout.mask_first_patch), loss = sum(losses * (labels != -100)) / count (ms-swift's
     loss_func). bf16 params with --attention_backend fused, fp32 params with unfused (cuDNN fused attention has
     no fp32).
     fp32 runs with NVIDIA_TF32_OVERRIDE=0 (no TF32 anywhere); their check also requires the difference to stay
     below the control margin. Every check requires the largest per-token NLL difference to stay below the largest
     change a one-token mis-alignment makes to a token's NLL.
  3. K=1: PLT model (llama3_2_plt, patch_size=1) vs stock model type `llama` (mcore type gpt): logits and per-token
     losses must be bit-identical (bf16/fused and fp32/unfused); both also against the HF token-level loss.
Prints `PARITY ...` lines (run_all.sh copies them to summary.txt); exit code 1 when a check fails or errors.
"""
import argparse
import gc
import json
import os
import sys
import traceback

# fp32 means fp32 on both sides: no TF32 in cuBLAS(Lt)/cuDNN, whatever TE or torch would pick (bf16 is unaffected).
# Must be set before CUDA initializes.
os.environ.setdefault('NVIDIA_TF32_OVERRIDE', '0')

import torch  # noqa: E402

IGN = -100
NVTE_ATTN_VARS = ('NVTE_FLASH_ATTN', 'NVTE_FUSED_ATTN', 'NVTE_UNFUSED_ATTN')
TOL_REL = {'bf16': 1e-2, 'fp32': 1e-3}  # |megatron - hf fp32| / hf fp32 on the mean loss
RESULTS = {'checks': []}
FAILED = []


def say(msg):
    print(msg, flush=True)


def record(line, ok=None, **data):
    verdict = '' if ok is None else (' -> OK' if ok else ' -> FAIL')
    say(f'PARITY {line}{verdict}')
    RESULTS['checks'].append(dict(line=line, ok=ok, **data))
    if ok is False:
        FAILED.append(line)


def make_batch(tokenizer_dir, data, B, S):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = []
    with open(data, encoding='utf-8') as f:
        for line in f:
            row = json.loads(line)
            text = '\n'.join(m.get('content') or '' for m in row.get('messages', []))
            ids.extend(tok(text)['input_ids'])  # BOS + text, as ms-swift's pretraining template encodes it
            if len(ids) >= B * S:
                break
    if len(ids) < B * S:
        raise ValueError(f'{data}: only {len(ids)} tokens, need {B * S}')
    return torch.tensor(ids[:B * S], dtype=torch.long).view(B, S)


# ----------------------------------------------------------------------------------------------------------- HF side
@torch.no_grad()
def hf_reference(model_dir, input_ids, K, device, dtype):
    from transformers import LlamaForCausalLM

    from swift_plt.patch_level.reference import patch_logits, patchtrain_loss, token_nll
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation='eager')
    model = model.to(device).eval()
    ids = input_ids.to(device)
    labels = ids
    B, S = ids.shape
    out = {}
    # PatchTrain (shaochenze/PatchTrain modeling_llama.py): swift_plt.patch_level.reference
    logits = patch_logits(model, ids, K)  # [B, P, V]
    out['plt_loss'] = float(patchtrain_loss(logits, labels, K))
    plt_tok = token_nll(logits, labels, K)  # [B, S] token-aligned, first patch 0
    out['plt_tok'] = plt_tok.cpu()
    out['plt_logits'] = logits.double().cpu()
    # the plugin's loss math (swift_plt.patch_level, torch only) on these HF logits, labels prepared as the plugin does
    from swift_plt.patch_level.layout import mask_first_patch
    from swift_plt.patch_level.loss import plt_token_losses
    tok_pos = torch.arange(S, device=device).unsqueeze(0).expand(B, S)
    plt_labels = mask_first_patch(labels, tok_pos, K)
    plugin_losses = plt_token_losses(logits.transpose(0, 1).contiguous(), plt_labels, K)
    valid = plt_labels != IGN
    out['plugin_on_hf_logits'] = float((plugin_losses.float() * valid).sum() / valid.sum())
    bad = labels.roll(1, dims=1)  # control: targets one token too early (bad[:, K:] = labels[:, K-1:S-1])
    out['plt_loss_shift1'] = float(patchtrain_loss(logits, bad, K))
    # per-token control: how much each token's NLL moves under that mis-alignment
    out['tok_control'] = float((plt_tok - token_nll(logits, bad, K)).abs().max())
    # token-level causal LM: the stock HF forward, scored as PatchTrain at K=1
    tl = model(input_ids=ids, use_cache=False).logits  # [B, S, V]
    out['tok_loss'] = float(patchtrain_loss(tl, ids, 1))
    out['tok_tok'] = token_nll(tl, ids, 1).roll(-1, dims=1).cpu()  # at position t: its NLL of token t+1 (rolled)
    out['tok_logits'] = tl.double().cpu()
    del model
    gc.collect()
    if device != 'cpu':
        torch.cuda.empty_cache()
    return out


# ----------------------------------------------------------------------------------------------------- Megatron side
def megatron_init(port, backend='nccl'):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), RANK='0', WORLD_SIZE='1', LOCAL_RANK='0',
                      LOCAL_WORLD_SIZE='1')
    torch.cuda.set_device(0)
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=0, world_size=1)
    import swift_plt.plugin.import_hook as activation
    activation.install()  # no-op when the .pth startup hook already ran (the installed case)
    from swift_plt.plugin.register import register_all
    register_all()
    from swift.megatron.arguments import MegatronArguments
    from dataclasses import fields
    if 'patch_size' not in {f.name for f in fields(MegatronArguments)}:
        raise RuntimeError('MegatronArguments has no patch_size: the swift-plt patches are not active')


MG_KWARGS = {}  # --mg-kwargs: extra MegatronArguments fields (e.g. for the CPU test harness)


def build_megatron(model_dir, model_type, patch_size, dtype, attn):
    """What `megatron pt` does to get its model (MegatronArguments.__post_init__ -> initialize_megatron, then
    BaseMegatronTrainer.prepare_model: get_mcore_model(args, template.config) + bridge.load_weights)."""
    from swift.megatron.arguments import MegatronArguments
    from swift.megatron.model import get_mcore_model
    from swift.model import get_processor
    for v in NVTE_ATTN_VARS:  # megatron's LanguageModule asserts these match the backend of the previous model
        os.environ.pop(v, None)
    kw = dict(
        model=model_dir,
        model_type=model_type,
        torch_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=False,
        attention_backend=attn,
        padding_free=False,
        recompute_granularity='none',
        seed=42,
        micro_batch_size=1,
        global_batch_size=1,
        finetune=True,
        no_save_optim=True,
        no_save_rng=True,
        no_load_optim=True,
        no_load_rng=True)
    kw.update(MG_KWARGS)
    if patch_size is not None:
        kw['patch_size'] = patch_size
    args = MegatronArguments(**kw)
    hf_config = get_processor(model_dir, model_type=model_type).model_info.config
    model = get_mcore_model(args, hf_config)[0]
    model.config.bridge.load_weights([model], model_dir)
    p = next(model.parameters())
    if p.device.type != 'cuda':
        model.cuda()
    model.eval()
    cfg = model.config
    say(f'[parity] built {type(model).__name__} model_type={model_type} mcore_type={cfg.mcore_model_type} '
        f'patch_size={getattr(cfg, "patch_size", "-")} params={p.dtype} attn={cfg.attention_backend.name} '
        f'tied={not cfg.untie_embeddings_and_output_weights}')
    return args, model


@torch.no_grad()
def mg_forward(model, ids, labels=None):
    B, S = ids.shape
    pos = torch.arange(S, device=ids.device).unsqueeze(0).expand(B, S).contiguous()
    return model(input_ids=ids, position_ids=pos, attention_mask=None, labels=labels)


def swift_loss(losses, labels):
    """ms-swift MegatronTrainer.loss_func: sum(losses * (labels != -100)) / count."""
    mask = labels != IGN
    return float((losses.float() * mask).sum() / mask.sum())


def rel(a, b):
    return abs(a - b) / abs(b)


def max_diff(a, b, mask=None):
    d = (a.double().cpu() - b.double().cpu()).abs()
    if mask is not None:
        d = d[mask.cpu()]
    return float(d.max())


def free(*models):
    for m in models:
        del m
    gc.collect()
    torch.cuda.empty_cache()


def run_megatron(tag, model_dir, ids_cpu, K, ref32, ref64, prec):
    from swift_plt.patch_level.layout import mask_first_patch
    dtype, attn = (torch.bfloat16, 'fused') if prec == 'bf16' else (torch.float32, 'unfused')
    ids = ids_cpu.cuda()
    B, S = ids.shape
    pos = torch.arange(S, device='cuda').unsqueeze(0).expand(B, S)

    # --- K > 1: PLT vs PatchTrain
    try:
        _, m = build_megatron(model_dir, 'llama3_2_plt', K, dtype, attn)
        labels = mask_first_patch(ids, pos, K)
        losses = mg_forward(m, ids, labels)  # [B, S] token-aligned
        loss = swift_loss(losses, labels)
        logits = mg_forward(m, ids)  # [B, P, V]
        valid = labels != IGN
        tok_d = max_diff(losses, ref32['plt_tok'], valid)
        log_d = max_diff(logits, ref32['plt_logits'])
        margin = abs(ref32['plt_loss_shift1'] - ref32['plt_loss'])
        r = rel(loss, ref32['plt_loss'])
        beats = abs(loss - ref32['plt_loss']) < margin
        # fp32 must also beat the mis-alignment margin; every precision must keep each token's NLL closer to the
        # reference than a one-token mis-alignment moves it
        ok = r < TOL_REL[prec] and (prec != 'fp32' or beats) and tok_d < ref32['tok_control']
        record(
            f'[{tag}] K={K} {prec}/{attn}: megatron={loss:.8f} hf_fp32={ref32["plt_loss"]:.8f} '
            f'hf_fp64={ref64["plt_loss"]:.8f} abs={abs(loss - ref32["plt_loss"]):.3e} rel={r:.3e} '
            f'(tol {TOL_REL[prec]:g}) rel_vs_fp64={rel(loss, ref64["plt_loss"]):.3e} '
            f'per-token max|d|={tok_d:.3e} logits max|d|={log_d:.3e} '
            f'control |loss(targets shifted 1 token)-loss|={margin:.3e} (diff below it: {beats}), '
            f'per-token {ref32["tok_control"]:.3e}',
            ok,
            model=tag,
            prec=prec,
            megatron=loss,
            hf_fp32=ref32['plt_loss'],
            hf_fp64=ref64['plt_loss'],
            rel=r,
            per_token_max_abs=tok_d,
            logits_max_abs=log_d,
            control_margin=margin)
        free(m)
    except Exception as e:
        traceback.print_exc()
        record(f'[{tag}] K={K} {prec}/{attn}: ERROR {e!r}', False, model=tag, prec=prec)

    # --- K = 1: PLT model at patch_size 1 vs stock llama (gpt) model, both vs HF token-level
    try:
        rolled = torch.roll(ids, -1, dims=1)
        rolled[:, -1] = IGN  # ms-swift's causal-LM label roll (position t predicts token t+1)
        outs = {}
        for name, mt, ps in (('plt_k1', 'llama3_2_plt', 1), ('gpt', 'llama', None)):
            _, m = build_megatron(model_dir, mt, ps, dtype, attn)
            outs[name] = (mg_forward(m, ids).clone(), mg_forward(m, ids, rolled).clone())
            free(m)
        (l1, t1), (lg, tg) = outs['plt_k1'], outs['gpt']
        same_logits = torch.equal(l1, lg)
        same_losses = torch.equal(t1, tg)
        loss1, lossg = swift_loss(t1, rolled), swift_loss(tg, rolled)
        record(
            f'[{tag}] K=1 {prec}/{attn}: PLT(patch_size=1) vs stock gpt: logits bit-identical={same_logits} '
            f'(max|d|={max_diff(l1, lg):.3e}) per-token losses bit-identical={same_losses} '
            f'loss plt={loss1!r} gpt={lossg!r}',
            same_logits and same_losses,
            model=tag,
            prec=prec,
            logits_identical=same_logits,
            losses_identical=same_losses,
            loss_plt=loss1,
            loss_gpt=lossg)
        r = rel(lossg, ref32['tok_loss'])
        record(
            f'[{tag}] K=1 {prec}/{attn}: stock gpt vs HF token-level: megatron={lossg:.8f} '
            f'hf_fp32={ref32["tok_loss"]:.8f} hf_fp64={ref64["tok_loss"]:.8f} rel={r:.3e} '
            f'per-token max|d|={max_diff(tg, ref32["tok_tok"], rolled != IGN):.3e} '
            f'logits max|d|={max_diff(lg, ref32["tok_logits"]):.3e}',
            r < TOL_REL[prec],
            model=tag,
            prec=prec,
            megatron=lossg,
            hf_fp32=ref32['tok_loss'],
            rel=r)
    except Exception as e:
        traceback.print_exc()
        record(f'[{tag}] K=1 {prec}/{attn}: ERROR {e!r}', False, model=tag, prec=prec)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--model', action='append', required=True, help='HF Llama dir (repeatable); tag=basename')
    ap.add_argument('--tag', action='append', default=None, help='label per --model (default: basename)')
    ap.add_argument('--data', required=True, help='jsonl ({"messages": [...]} rows)')
    ap.add_argument('--patch-size', type=int, default=4)
    ap.add_argument('--B', type=int, default=2)
    ap.add_argument('--S', type=int, default=256)
    ap.add_argument('--port', type=int, default=29731)
    ap.add_argument('--precisions', default='bf16,fp32')
    ap.add_argument('--hf-only', action='store_true', help='reference numbers only (no Megatron; CPU is fine)')
    ap.add_argument('--hf-device', default=None, help='device of the fp32 reference (default cuda if available)')
    ap.add_argument('--json', default=None)
    ap.add_argument('--backend', default='nccl', help='torch.distributed backend of the 1-rank group')
    ap.add_argument('--mg-kwargs', default=None, help='JSON dict of extra MegatronArguments fields')
    a = ap.parse_args()
    if a.mg_kwargs:
        MG_KWARGS.update(json.loads(a.mg_kwargs))
    K = a.patch_size
    tags = a.tag or [os.path.basename(os.path.normpath(m)) for m in a.model]
    hf_dev = a.hf_device or ('cuda' if torch.cuda.is_available() else 'cpu')
    # exact fp32 everywhere on the reference side
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision('highest')

    ids = make_batch(a.model[0], a.data, a.B, a.S)
    say(f'[parity] batch {tuple(ids.shape)}, K={K}, P={a.S // K}, first ids {ids[0, :8].tolist()}')
    RESULTS.update(K=K, B=a.B, S=a.S, models=dict(zip(tags, a.model)))

    # 1. every HF reference before anything of mcore-bridge runs
    refs = {}
    for tag, mdir in zip(tags, a.model):
        try:
            refs[tag] = (hf_reference(mdir, ids, K, hf_dev, torch.float32), hf_reference(mdir, ids, K, 'cpu',
                                                                                       torch.float64))
            r32, r64 = refs[tag]
            pr = rel(r64['plugin_on_hf_logits'], r64['plt_loss'])
            record(f'[{tag}] HF reference: PatchTrain K={K} loss fp32={r32["plt_loss"]:.8f} '
                   f'fp64={r64["plt_loss"]:.8f} (fp32 rel err {rel(r32["plt_loss"], r64["plt_loss"]):.1e}); '
                   f'swift_plt.patch_level loss on the fp64 HF logits={r64["plugin_on_hf_logits"]:.8f} (rel {pr:.1e}); '
                   f'token-level loss fp32={r32["tok_loss"]:.8f}; control: K={K} loss with targets shifted by '
                   f'one token {r32["plt_loss_shift1"]:.8f}',
                   model=tag,
                   plt_fp32=r32['plt_loss'],
                   plt_fp64=r64['plt_loss'],
                   tok_fp32=r32['tok_loss'],
                   shift1=r32['plt_loss_shift1'],
                   plugin_on_hf_logits_fp64=r64['plugin_on_hf_logits'])
            if pr > 1e-6:
                record(f'[{tag}] swift_plt.patch_level loss on HF logits differs from PatchTrain (rel {pr:.1e})', False)
        except Exception as e:
            traceback.print_exc()
            record(f'[{tag}] HF reference: ERROR {e!r}', False, model=tag)

    # 2./3. Megatron
    if not a.hf_only:
        try:
            megatron_init(a.port, a.backend)
            for prec in [p.strip() for p in a.precisions.split(',') if p.strip()]:
                for tag, mdir in zip(tags, a.model):
                    if tag in refs:
                        run_megatron(tag, mdir, ids, K, refs[tag][0], refs[tag][1], prec)
        except Exception as e:
            traceback.print_exc()
            record(f'Megatron setup: ERROR {e!r}', False)

    say(f'PARITY summary: {len(RESULTS["checks"])} lines, {len(FAILED)} failed')
    path = a.json or (os.path.join(os.environ['OUT'], 'parity.json') if os.environ.get('OUT') else None)
    if path:
        with open(path, 'w') as f:
            json.dump(RESULTS, f, indent=2, default=str)
    try:
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass
    return 1 if FAILED else 0


if __name__ == '__main__':
    sys.exit(main())
