#!/usr/bin/env python3
"""PLT parity, one process, one GPU: the Megatron PLT model (built through ms-swift + mcore-bridge, TE layers, HF
weights loaded by mcore-bridge's GPTBridge) against PatchTrain's formula on the family's own HF causal LM
(AutoModelForCausalLM; a multimodal checkpoint's class from `architectures`; Ling 2.0, which transformers has no
class for: tests/harness/bailing_moe.py, its published modeling code written out), for any family of
swift_plt/families/.

    python3 tests/gpu/parity.py --model DIR [--model DIR2 ...] --data train.jsonl [--json OUT.json]
    python3 tests/gpu/parity.py --model DIR --random-ids --hf64-device cuda      # no tokenizer/text needed
    python3 tests/gpu/parity.py --model LLAMA_DIR --model-type llama3_2_plt --data train.jsonl
    python3 tests/gpu/parity.py --model DIR --data train.jsonl --hf-only --hf-device cpu   # reference only (CPU)

Model type (--model-type, one per --model or one for all; default `auto`): config.json's model_type, which is the
ms-swift model type of the family (qwen2, qwen3, qwen3_moe, deepseek_v3, llama, qwen3_next, qwen3_5, ...);
`llama3_2_plt` keeps the design's Llama type. For every model dir, on one fixed batch (B=2, S=256: token ids of real
text from the jsonl, tokenized with the first model dir's tokenizer, or with --random-ids uniform ids below the
smallest vocab):
  1. HF reference FIRST (and under swift_plt.compat.transformers.hf_rope_guard: mcore-bridge's rope code replaces
     transformers' ROPE_INIT_FUNCTIONS['default'] once it runs), swift_plt.patch_level.reference: the forward in fp32
     (--hf-device) and fp64 (--hf64-device: the same model converted; `none` skips it), the loss in fp64:
       e = embed(input_ids).view(B, P, K, H).mean(2); h = model.model(inputs_embeds=e, position_ids=arange(P))
       logits = lm_head(h); loss = sum_k nll_loss(log_softmax(logits[:, :-1]), labels[:, K:].view(B,P-1,K)[..., k]) / K
     plus the token-level (K=1) causal-LM loss, and a control: the PLT loss with targets shifted by one token (how
     far a mis-aligned target would move the loss: the margin the parity numbers must beat). MoE experts run HF's
     eager loop. A multimodal checkpoint (Qwen3.5) is run on text only: `model.model` above is its language model
     (inputs_embeds, text position ids), the token-level pass the same on the token embeddings; random ids stay
     below its media token ids. The hybrids' Gated DeltaNet layers run what transformers picks (fla's Triton
     kernels when flash-linear-attention is installed; an fp64 pass those kernels refuse is reported and skipped),
     or with --hf-gdn torch transformers' own torch code for them (the functions its modeling module bound to fla's
     kernels at import rebound to the torch ones they wrap: nothing to compile, on a GPU or the CPU, and an fp64
     reference; `HF GDN` line).
     A sliding window of W tokens (GPT-OSS) is ceil(W / K) patches in the PatchTrain pass (the HF model loaded with
     that sliding_window, tests/harness/plt_cases.patch_level_hf_config) and W tokens in the token-level pass (a
     second load). Each pass times its first PatchTrain forward and the same forward repeated (`timing` lines: the
     first one compiles the Triton kernels of a cold cache).
  2. Megatron: MegatronArguments(model_type=TYPE, patch_size=K) -> swift.megatron.model.get_mcore_model
     -> config.bridge.load_weights -> every parameter and buffer moved to the GPU, one left elsewhere an error
     (place_model: megatron-core makes the shared-expert gate on the CPU); forward(input_ids, position_ids, labels)
     with labels token-aligned and the first patch -100 (swift_plt.patch_level.layout.mask_first_patch),
     loss = sum(losses * (labels != -100)) / count (ms-swift's loss_func). bf16 params with --attention_backend
     fused, fp32 params with unfused (cuDNN fused attention has no fp32). A Gated-DeltaNet hybrid's Megatron side
     runs megatron-core's torch Gated DeltaNet (deterministic_mode, with NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 while it
     is built) where fla refuses its backward on this GPU and Triton (swift_plt.plugin.arguments.fla_hopper_problem:
     the plugin refuses K > 1 there otherwise), else fla's kernels; a `[parity] Gated DeltaNet path` line and the
     `built` line (gdn=torch|fla) say which. A family type must come out as mcore type
     `gpt_plt` (PLTGPTModel) at K > 1, a family mcore-bridge builds with its own type as `<mcore type>_plt`
     (swift_plt.families.FAMILY_MCORE_TYPES: qwen3_next_plt, olmoe_plt, glm4_plt, minimax_m2_plt, hy_v3_plt,
     bailing_moe_plt: PLTGPTModel; qwen3_5_plt: PLTMultimodalGPTModel). A multimodal checkpoint's
     HF config is read as ms-swift's loader reads it, without its processor (which needs qwen_vl_utils and
     torchvision, and serves media only). The first forward of each K > 1 model is timed (Triton compiles).
     fp32 runs with NVIDIA_TF32_OVERRIDE=0 and TRITON_F32_DEFAULT=ieee (no TF32 anywhere: cuBLAS, cuDNN, Triton
     dots such as fla's); their check also requires the difference to stay
     below the control margin. Every check requires the largest per-token NLL difference to stay below the largest
     change a one-token mis-alignment makes to a token's NLL.
     MoE: --moe_grouped_gemm true, router in fp32 (--moe_router_dtype fp32), aux loss coefficient 0 (only the LM
     loss is compared; in eval mode megatron adds no aux loss anyway). Routing is a top-k: where two experts' scores
     tie within rounding, a bf16 forward may pick the other one, which moves that token's output by a fraction of
     one expert. So fp32 is held to the dense tolerances (routes agree up to fp32 rounding) and bf16 to rel 1e-2 on
     the mean loss and the per-token control bound; each MoE line reports the share of (token, layer) routes whose
     expert set differs from the HF fp32 reference (`routes differ`): at most 1 % in fp32 (ties), reported in bf16.
  3. K=1 (at --k1-precisions): the PLT model at patch_size 1 vs the stock model: logits and per-token losses must be
     bit-identical (deterministic algorithms on; a repeat of the stock forward is the control). Family types:
     mcore-bridge's `gpt_plt` (an own type's `<type>_plt`) built with patch_size=1 (what K > 1 selects) vs the
     family's stock `gpt` (`<type>`);
     llama3_2_plt: llama3_2_plt --patch_size 1 vs stock `llama`. The stock model is also compared with the HF
     token-level loss.
Prints `PARITY ...` lines (run_all.sh and families.sh copy them to their summary); exit code 1 when a check fails or
errors.
"""
import argparse
import contextlib
import gc
import json
import os
import sys
import time
import traceback
from types import SimpleNamespace

# fp32 means fp32 on both sides: no TF32 in cuBLAS(Lt)/cuDNN, whatever TE or torch would pick (bf16 is unaffected).
# Must be set before CUDA initializes. The cuBLAS workspace setting makes cuBLAS deterministic (K=1 identity).
os.environ.setdefault('NVIDIA_TF32_OVERRIDE', '0')
os.environ.setdefault('TRITON_F32_DEFAULT', 'ieee')  # fp32 Triton dots (fla's Gated DeltaNet kernels) without TF32
os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')

import torch  # noqa: E402

import make_family_configs as mfc  # noqa: E402  (hand-written families, tests/harness; stdlib only at import)
from swift_plt.tools.hf_gdn import hf_torch_gdn  # noqa: E402

IGN = -100
NVTE_ATTN_VARS = ('NVTE_FLASH_ATTN', 'NVTE_FUSED_ATTN', 'NVTE_UNFUSED_ATTN')
TOL_REL = {'bf16': 1e-2, 'fp32': 1e-3}  # |megatron - hf fp32| / hf fp32 on the mean loss
ROUTES_FP32 = 0.01  # fp32 MoE: at most this share of (token, layer) routes may differ from HF fp32 (ties only)
PLT_TYPE = 'llama3_2_plt'  # swift_plt.PLT_MODEL_TYPE (not imported here: --help must work without the stack)
STOCK_OF_PLT_TYPE = 'llama'
GPT_PLT = 'gpt_plt'  # swift_plt.families.PLT_GPT_MODEL_TYPE
MEDIA_ID_KEYS = ('image_token_id', 'video_token_id', 'vision_start_token_id', 'vision_end_token_id')
MOE_KWARGS = dict(moe_grouped_gemm=True, moe_router_dtype='fp32', moe_aux_loss_coeff=0.0)
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


def read_config(model_dir):
    with open(os.path.join(model_dir, 'config.json')) as f:
        return json.load(f)


def text_config(cfg):
    """The language model's fields of a config.json dict: its text_config (multimodal checkpoints) or itself."""
    return cfg.get('text_config') or cfg


def is_multimodal(cfg):
    return 'text_config' in cfg


def is_moe(cfg):
    text = text_config(cfg)
    return any(text.get(k) for k in ('num_experts', 'n_routed_experts', 'num_local_experts', 'moe_num_experts'))


def id_limit(cfg):
    """Random ids stay below this: the vocabulary, and a multimodal checkpoint's media token ids (an image id in a
    text batch would ask for image features)."""
    return min([text_config(cfg)['vocab_size']] + [cfg[k] for k in MEDIA_ID_KEYS if cfg.get(k) is not None])


def expected_plt_build(model_type):
    """(mcore-bridge model type, model class name) a family's K > 1 must be built as: `gpt_plt`, or `<type>_plt` of a
    family mcore-bridge builds with its own type (a hybrid's, OLMoE's, ...: FAMILY_MCORE_TYPES)."""
    from swift_plt.families import FAMILY_MCORE_TYPES, TEXT_ONLY_MULTIMODAL, plt_mcore_type
    if model_type in FAMILY_MCORE_TYPES:
        cls = 'PLTMultimodalGPTModel' if model_type in TEXT_ONLY_MULTIMODAL else 'PLTGPTModel'
        return plt_mcore_type(FAMILY_MCORE_TYPES[model_type]), cls
    return GPT_PLT, 'PLTGPTModel'


def family_plt_meta(model_type):
    """The PLT mcore-bridge meta of a family (`gpt_plt`, or its own type's `<type>_plt`), whatever K is."""
    from swift_plt.families import FAMILY_MCORE_TYPES, MCORE_GPT_TYPE
    from swift_plt.plugin.register import plt_model_meta
    return plt_model_meta(FAMILY_MCORE_TYPES.get(model_type, MCORE_GPT_TYPE))


def timed(fn):
    """(fn(), seconds), the GPU synchronized around it."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t


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


def random_batch(vocab, B, S, seed=0):
    """Uniform token ids in [0, vocab): every row of the embedding and LM head may be hit (no tokenizer needed)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (B, S), generator=g)


# ------------------------------------------------------------------------------------------------------------ routes
def hf_routers(model):
    """HF MoE routers: modules with a top_k whose forward returns the chosen experts' indices, the last integer
    tensor of its output (transformers 5's *TopKRouter: (logits, weights, indices); the hand-written Ling 2.0's Gate:
    (indices, weights))."""
    return [m for m in model.modules() if type(m).__name__.lower().endswith(('router', 'gate')) and hasattr(m, 'top_k')]


@contextlib.contextmanager
def record_routes(model, kind, batch_size=None):
    """Collect each MoE layer's routing as a bool map [B*T, E] (batch-major) per forward, in layer order.
    kind 'hf': transformers routers (input [B*T, H]); 'mcore': megatron TopKRouter (routing_map [T*B, E], seq-major)."""
    maps, hooks = [], []
    if kind == 'hf':

        def hook(mod, inp, out):
            outs = out if isinstance(out, tuple) else (out, )
            idx = [t for t in outs if isinstance(t, torch.Tensor) and not t.is_floating_point()][-1]
            n = getattr(mod, 'num_experts', None) or mod.weight.shape[0]
            maps.append(torch.zeros(idx.shape[0], n, dtype=torch.bool, device=idx.device).scatter_(1, idx, True).cpu())

        mods = hf_routers(model)
    else:
        from megatron.core.transformer.moe.router import TopKRouter

        def hook(mod, inp, out):
            rmap = out[1]
            T = rmap.shape[0] // batch_size
            maps.append(rmap.view(T, batch_size, -1).transpose(0, 1).reshape(T * batch_size, -1).bool().cpu())

        mods = [m for m in model.modules() if isinstance(m, TopKRouter)]
    hooks = [m.register_forward_hook(hook) for m in mods]
    try:
        yield maps
    finally:
        for h in hooks:
            h.remove()


def route_diff(a, b):
    """(share of (token, layer) routes whose expert set differs, share of expert choices that differ) or None."""
    if not a or not b or len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        return None
    rows = sum(x.shape[0] for x in a)
    differ = sum(int((x != y).any(1).sum()) for x, y in zip(a, b))
    chosen = sum(int(x.sum()) for x in a)
    moved = sum(int((x & ~y).sum()) for x, y in zip(a, b))
    return differ / rows, moved / max(chosen, 1)


def routes_ok(d, prec):
    """fp32: the routes must agree with HF fp32 but for rounding ties; bf16 flips are reported, not counted."""
    return d is None or prec != 'fp32' or d[0] <= ROUTES_FP32


def route_text(d):
    if d is None:
        return ''
    return f' routes differ from HF fp32: {d[0] * 100:.2f}% of (token, layer), {d[1] * 100:.2f}% of expert choices'


# ----------------------------------------------------------------------------------------------------------- HF side
def load_hf(model_dir, dtype, auto_cls='AutoModelForCausalLM', **kw):
    """The family's own HF model (``auto_cls``: its causal LM, or critic_families.py's token classifier; Ling 2.0's
    causal LM: tests/harness's hand-written one), eager attention, MoE experts in HF's eager loop; ``kw`` to
    from_pretrained (e.g. output_loading_info, or config fields replaced)."""
    import transformers

    from swift_plt.compat.transformers import hf_rope_guard
    cfg = read_config(model_dir)
    if auto_cls == 'AutoModelForCausalLM' and mfc.hand_written(cfg['model_type']):
        assert not kw, kw
        return mfc.model_class(cfg).from_pretrained(model_dir, dtype=dtype)
    auto = getattr(transformers, auto_cls)
    if auto_cls == 'AutoModelForCausalLM' and is_multimodal(cfg):  # Auto* would pick Qwen3.5's text-only class
        auto = getattr(transformers, cfg['architectures'][0])
    kw.update(dtype=dtype, attn_implementation='eager')
    if is_moe(cfg):
        kw['experts_implementation'] = 'eager'
    with hf_rope_guard():
        try:
            return auto.from_pretrained(model_dir, **kw)
        except (TypeError, ValueError):
            if 'experts_implementation' not in kw:  # older transformers: `torch_dtype`, no experts_implementation
                raise
            kw.pop('experts_implementation')
            return auto.from_pretrained(model_dir, **kw)


def text_lm(model):
    """The causal LM PatchTrain runs (get_input_embeddings, model, lm_head, forward(input_ids) -> .logits): a
    multimodal checkpoint's text path (its language model on the token embeddings, text position ids), else the
    model itself."""
    if not hasattr(model.model, 'language_model'):
        return model

    def forward(input_ids, use_cache=False):
        B, S = input_ids.shape
        pos = torch.arange(S, device=input_ids.device).expand(B, S)
        hidden = model.model.language_model(inputs_embeds=model.get_input_embeddings()(input_ids), position_ids=pos,
                                            use_cache=use_cache).last_hidden_state
        return SimpleNamespace(logits=model.lm_head(hidden))

    return SimpleNamespace(get_input_embeddings=model.get_input_embeddings, model=model.model.language_model,
                           lm_head=model.lm_head, forward=forward)


@torch.no_grad()
def hf_pass(model, input_ids, K, device, parts=('plt', 'tok')):
    """The reference numbers of one HF model (its current dtype) on input_ids: PatchTrain's ('plt') and the
    token-level ones ('tok')."""
    from swift_plt.patch_level.reference import patchtrain_loss, token_nll
    model = model.to(device).eval()
    lm = text_lm(model)
    ids = input_ids.to(device)
    out = {}
    if 'plt' in parts:
        out.update(hf_plt_numbers(model, lm, ids, K, device))
    if 'tok' in parts:
        # token-level causal LM: the stock HF forward, scored as PatchTrain at K=1
        with record_routes(model, 'hf') as routes:
            tl = lm.forward(input_ids=ids, use_cache=False).logits  # [B, S, V]
        out['tok_routes'] = list(routes)
        out['tok_loss'] = float(patchtrain_loss(tl, ids, 1))
        out['tok_tok'] = token_nll(tl, ids, 1).roll(-1, dims=1).cpu()  # at position t: its NLL of token t+1 (rolled)
        out['tok_logits'] = tl.double().cpu()
    return out


def hf_plt_numbers(model, lm, ids, K, device):
    """PatchTrain's numbers of hf_pass (lm: text_lm(model); ids on device), the plugin's loss on its logits and the
    one-token mis-alignment control."""
    from swift_plt.patch_level.layout import mask_first_patch
    from swift_plt.patch_level.loss import plt_token_losses
    from swift_plt.patch_level.reference import patch_logits, patchtrain_loss, token_nll
    labels = ids
    B, S = ids.shape
    out = {}
    # PatchTrain (shaochenze/PatchTrain modeling_llama.py): swift_plt.patch_level.reference
    with record_routes(model, 'hf') as routes:
        logits, first = timed(lambda: patch_logits(lm, ids, K))  # [B, P, V]
    out['plt_routes'] = list(routes)
    _, again = timed(lambda: patch_logits(lm, ids, K))
    out['timing'] = dict(first_forward_s=first, repeat_s=again)
    out['plt_loss'] = float(patchtrain_loss(logits, labels, K))
    plt_tok = token_nll(logits, labels, K)  # [B, S] token-aligned, first patch 0
    out['plt_tok'] = plt_tok.cpu()
    out['plt_logits'] = logits.double().cpu()
    # the plugin's loss math (swift_plt.patch_level, torch only) on these HF logits, labels prepared as the plugin does
    tok_pos = torch.arange(S, device=device).unsqueeze(0).expand(B, S)
    plt_labels = mask_first_patch(labels, tok_pos, K)
    plugin_losses = plt_token_losses(logits.transpose(0, 1).contiguous(), plt_labels, K)
    valid = plt_labels != IGN
    out['plugin_on_hf_logits'] = float((plugin_losses.float() * valid).sum() / valid.sum())
    bad = labels.roll(1, dims=1)  # control: targets one token too early (bad[:, K:] = labels[:, K-1:S-1])
    out['plt_loss_shift1'] = float(patchtrain_loss(logits, bad, K))
    # per-token control: how much each token's NLL moves under that mis-alignment
    out['tok_control'] = float((plt_tok - token_nll(logits, bad, K)).abs().max())
    return out


HF_GDN = 'auto'  # --hf-gdn
def hf_references(model_dir, input_ids, K, device, device64):
    """(fp32 numbers on `device`, fp64 numbers on `device64` or None): per load the fp32 pass, then the fp64 pass on
    the same weights. A sliding-window family is loaded twice: with its window in patches for PatchTrain's numbers
    (ceil(W / K): tests/harness/plt_cases.patch_level_hf_config, as the CPU tests load it), as published (W tokens) for
    the token-level ones."""
    window = mfc.harness_module('plt_cases').patch_level_hf_config(model_dir, K)
    loads = [(window, ('plt', )), ({}, ('tok', ))] if window else [({}, ('plt', 'tok'))]
    ref32, ref64 = {}, {} if device64 and device64 != 'none' else None
    for config, parts in loads:
        model = load_hf(model_dir, torch.float32, **config)
        if HF_GDN == 'torch':
            rebound = hf_torch_gdn(model)
            if rebound:
                say(f'[parity] HF GDN: transformers\' torch code (--hf-gdn torch; rebound: {", ".join(rebound)})')
        for name, value in config.items():  # the config took them (from_pretrained passes unknown names elsewhere)
            assert getattr(model.config, name) == value, (name, getattr(model.config, name), value)
        ref32.update(hf_pass(model, input_ids, K, device, parts))
        if ref64 is not None:
            model = model.to(device64, torch.float64)
            try:
                ref64.update(hf_pass(model, input_ids, K, device64, parts))
            except Exception as e:  # e.g. a Triton kernel (fla's Gated DeltaNet) without fp64
                traceback.print_exc()
                say(f'[parity] fp64 reference skipped: {type(e).__name__}: {str(e)[:300]}')
                ref64 = None
        del model
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return ref32, ref64


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


def gdn_path(model_dir):
    """(path, why) of a Gated-DeltaNet hybrid's Megatron side: 'fla' (fla's Triton kernels, mcore-bridge's
    default) or 'torch' (megatron-core's torch Gated DeltaNet, config.deterministic_mode) where fla refuses its
    backward on this GPU and Triton (swift_plt.plugin.arguments.fla_hopper_problem: Hopper with Triton 3.4.0 to
    3.7.0, no tilelang). Forward only here, but the plugin refuses K > 1 on such a machine unless the torch path is
    chosen, so parity checks what trains there. None for the other families."""
    from swift_plt import families
    family = families.family(read_config(model_dir)['model_type'])
    if family is None or not family.linear_attention:
        return None, ''
    extra = MG_KWARGS.get('megatron_extra_kwargs') or {}
    extra = json.loads(extra) if isinstance(extra, str) else extra
    if extra.get('deterministic_mode'):
        return 'torch', 'deterministic_mode given in --mg-kwargs'
    return fla_or_torch()


def fla_or_torch():
    """(path, why) of a hybrid's Megatron Gated DeltaNet on this machine: 'torch' (megatron-core's, deterministic_mode)
    where fla refuses its backward (swift_plt.plugin.arguments.fla_backward_problem), else 'fla'."""
    from swift_plt.plugin.arguments import fla_backward_problem
    problem = fla_backward_problem()
    return ('torch', f'fla refuses its backward here: {problem}') if problem else ('fla', 'fla runs its backward here')


def target_device():
    """Where the Megatron models run: the current GPU (the CPU under the dry-run harness, which has no CUDA)."""
    return torch.device('cuda', torch.cuda.current_device()) if torch.cuda.is_available() else torch.device('cpu')


def off_device(model, device):
    """Names of the parameters and buffers of model that are not on device."""
    device = torch.device(device)
    named = list(model.named_parameters()) + list(model.named_buffers())
    return [n for n, t in named if t is not None and t.device != device]


def place_model(model, device):
    """Move every parameter and buffer of model to device, then fail loudly on any left elsewhere. megatron-core
    creates some on the CPU whatever use_cpu_initialization says (0.16.1: SharedExpertMLP.gate_weight, the
    shared-expert gate of qwen2_moe), so the first parameter's device says nothing about the others."""
    model.to(device)
    left = off_device(model, device)
    if left:
        raise RuntimeError(f'{len(left)} parameters/buffers are not on {device} after placement: {left[:8]}')
    return model


def build_megatron(model_dir, model_type, patch_size, dtype, attn, plt_meta=False):
    """What `megatron pt` does to get its model (MegatronArguments.__post_init__ -> initialize_megatron, then
    BaseMegatronTrainer.prepare_model: get_mcore_model(args, template.config) + bridge.load_weights).
    plt_meta: build through the family's PLT meta (`gpt_plt`, or a hybrid's `<type>_plt`: PLT's model classes,
    PLTModelConfig) whatever K is (the K=1 check of a family; at K > 1 the plugin selects it itself)."""
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
    if is_moe(read_config(model_dir)):
        kw.update(MOE_KWARGS)
    kw.update(MG_KWARGS)
    if patch_size is not None:
        kw['patch_size'] = patch_size
    gdn, why = gdn_path(model_dir)
    nvte_det = os.environ.get('NVTE_ALLOW_NONDETERMINISTIC_ALGO')
    if gdn == 'torch':  # megatron-core's torch Gated DeltaNet (padded batches: padding_free=False above)
        extra = kw.get('megatron_extra_kwargs') or {}
        extra = json.loads(extra) if isinstance(extra, str) else dict(extra)
        kw['megatron_extra_kwargs'] = {**extra, 'deterministic_mode': True}
        # megatron's TEDotProductAttention refuses deterministic_mode unless this is 0 (read at build time)
        os.environ['NVTE_ALLOW_NONDETERMINISTIC_ALGO'] = '0'
    if gdn:
        say(f'[parity] Gated DeltaNet path of the Megatron side: {gdn} '
            f'({"megatron-core torch, deterministic_mode" if gdn == "torch" else "fla Triton kernels"}; {why})')
    module = mfc.hand_written(read_config(model_dir)['model_type'])
    if module:  # no transformers class: its configuration class (a hub checkpoint brings its own) registered here
        module.register_config()
    try:
        args = MegatronArguments(**kw)
        if plt_meta:
            args.megatron_model_meta = family_plt_meta(model_type)
        if is_multimodal(read_config(model_dir)):  # text only: ms-swift's loader's config, without the processor
            from transformers import AutoConfig
            hf_config = AutoConfig.from_pretrained(model_dir)
            hf_config.name_or_path = model_dir
        else:
            hf_config = get_processor(model_dir, model_type=model_type).model_info.config
        model = get_mcore_model(args, hf_config)[0]
    finally:
        if gdn == 'torch':
            if nvte_det is None:
                os.environ.pop('NVTE_ALLOW_NONDETERMINISTIC_ALGO', None)
            else:
                os.environ['NVTE_ALLOW_NONDETERMINISTIC_ALGO'] = nvte_det
    model.config.bridge.load_weights([model], model_dir)
    place_model(model, target_device())  # as ms-swift's wrap_model does (.cuda() after the weights are loaded)
    p = next(model.parameters())
    model.eval()
    cfg = model.config
    if gdn == 'torch' and not getattr(cfg, 'deterministic_mode', False):
        raise RuntimeError('the torch Gated DeltaNet was asked for, but the model config has deterministic_mode off')
    say(f'[parity] built {type(model).__name__} model_type={model_type} mcore_type={cfg.mcore_model_type} '
        f'patch_size={getattr(cfg, "patch_size", "-")} params={p.dtype} attn={cfg.attention_backend.name} '
        f'tied={not cfg.untie_embeddings_and_output_weights} experts={cfg.num_moe_experts}'
        f'{"" if gdn is None else " gdn=" + gdn}')
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


def fmt(x, spec='.8f'):
    return 'n/a' if x is None else format(x, spec)


def run_megatron(tag, model_dir, model_type, ids_cpu, K, ref32, ref64, prec, k1=True):
    """K > 1 against the HF reference; with k1 also the K=1 identity and stock vs HF token-level."""
    from swift_plt.patch_level.layout import mask_first_patch
    dtype, attn = (torch.bfloat16, 'fused') if prec == 'bf16' else (torch.float32, 'unfused')
    family = model_type != PLT_TYPE
    ids = ids_cpu.cuda()
    B, S = ids.shape
    pos = torch.arange(S, device='cuda').unsqueeze(0).expand(B, S)
    r64_plt = ref64['plt_loss'] if ref64 else None
    r64_tok = ref64['tok_loss'] if ref64 else None

    # --- K > 1: PLT vs PatchTrain
    try:
        args, m = build_megatron(model_dir, model_type, K, dtype, attn)
        meta_type = args.megatron_model_meta.model_type
        want_type, want_cls = expected_plt_build(model_type)
        meta_ok = not family or (meta_type == want_type and type(m).__name__ == want_cls)
        labels = mask_first_patch(ids, pos, K)
        with record_routes(m, 'mcore', B) as routes:
            losses, first = timed(lambda: mg_forward(m, ids, labels))  # [B, S] token-aligned
        loss = swift_loss(losses, labels)
        logits, again = timed(lambda: mg_forward(m, ids))  # [B, P, V]
        record(f'[{tag}] timing K={K} {prec} megatron ({meta_type}): first forward {first:.2f} s, the next '
               f'{again:.3f} s', model=tag, prec=prec, first_forward_s=first, repeat_s=again)
        rd = route_diff(list(routes), ref32['plt_routes'])
        valid = labels != IGN
        tok_d = max_diff(losses, ref32['plt_tok'], valid)
        log_d = max_diff(logits, ref32['plt_logits'])
        margin = abs(ref32['plt_loss_shift1'] - ref32['plt_loss'])
        r = rel(loss, ref32['plt_loss'])
        beats = abs(loss - ref32['plt_loss']) < margin
        # fp32 must also beat the mis-alignment margin; every precision must keep each token's NLL closer to the
        # reference than a one-token mis-alignment moves it
        ok = (meta_ok and r < TOL_REL[prec] and (prec != 'fp32' or beats) and tok_d < ref32['tok_control']
              and routes_ok(rd, prec))
        record(
            f'[{tag}] K={K} {prec}/{attn}: {model_type} -> mcore {meta_type} ({type(m).__name__}): '
            f'megatron={loss:.8f} hf_fp32={ref32["plt_loss"]:.8f} '
            f'hf_fp64={fmt(r64_plt)} abs={abs(loss - ref32["plt_loss"]):.3e} rel={r:.3e} '
            f'(tol {TOL_REL[prec]:g}) rel_vs_fp64={fmt(r64_plt and rel(loss, r64_plt), ".3e")} '
            f'per-token max|d|={tok_d:.3e} logits max|d|={log_d:.3e} '
            f'control |loss(targets shifted 1 token)-loss|={margin:.3e} (diff below it: {beats}), '
            f'per-token {ref32["tok_control"]:.3e}{route_text(rd)}' +
            ('' if meta_ok else f' [not built as {want_type} ({want_cls})]'),
            ok,
            model=tag,
            prec=prec,
            model_type=model_type,
            mcore_type=meta_type,
            megatron=loss,
            hf_fp32=ref32['plt_loss'],
            hf_fp64=r64_plt,
            rel=r,
            per_token_max_abs=tok_d,
            logits_max_abs=log_d,
            control_margin=margin,
            routes_differ=rd and rd[0],
            expert_choices_differ=rd and rd[1])
        free(m)
    except Exception as e:
        traceback.print_exc()
        record(f'[{tag}] K={K} {prec}/{attn}: ERROR {e!r}', False, model=tag, prec=prec)

    # --- K = 1: PLT model at patch_size 1 vs the stock model, the stock one vs HF token-level
    if not k1:
        return
    try:
        rolled = torch.roll(ids, -1, dims=1)
        rolled[:, -1] = IGN  # ms-swift's causal-LM label roll (position t predicts token t+1)
        if family:
            builds = (('plt_k1', model_type, 1, True), ('gpt', model_type, None, False))
        else:
            builds = (('plt_k1', PLT_TYPE, 1, False), ('gpt', STOCK_OF_PLT_TYPE, None, False))
        outs, types = {}, {}
        for name, mt, ps, plt_meta in builds:
            _, m = build_megatron(model_dir, mt, ps, dtype, attn, plt_meta=plt_meta)
            types[name] = f'{mt}/{m.config.mcore_model_type}/patch_size={getattr(m.config, "patch_size", "-")}'
            with record_routes(m, 'mcore', B) as routes:
                lg = mg_forward(m, ids).clone()
            outs[name] = (lg, mg_forward(m, ids, rolled).clone(), list(routes))
            if name == 'gpt':  # control: the same forward again
                outs['gpt_repeat'] = (mg_forward(m, ids).clone(), mg_forward(m, ids, rolled).clone(), None)
            free(m)
        lg, tg, g_routes = outs['gpt']
        lossg = swift_loss(tg, rolled)
        l1, t1, _ = outs['plt_k1']
        same_logits = torch.equal(l1, lg)
        same_losses = torch.equal(t1, tg)
        control = torch.equal(outs['gpt_repeat'][0], lg) and torch.equal(outs['gpt_repeat'][1], tg)
        loss1 = swift_loss(t1, rolled)
        record(
            f'[{tag}] K=1 {prec}/{attn}: PLT ({types["plt_k1"]}) vs stock ({types["gpt"]}): logits '
            f'bit-identical={same_logits} (max|d|={max_diff(l1, lg):.3e}) per-token losses bit-identical='
            f'{same_losses} loss plt={loss1!r} gpt={lossg!r}; control: stock forward repeated bit-identical={control}',
            same_logits and same_losses and control,
            model=tag,
            prec=prec,
            logits_identical=same_logits,
            losses_identical=same_losses,
            control_identical=control,
            loss_plt=loss1,
            loss_gpt=lossg)
        r = rel(lossg, ref32['tok_loss'])
        rd = route_diff(g_routes, ref32['tok_routes'])
        record(
            f'[{tag}] K=1 {prec}/{attn}: stock gpt vs HF token-level: megatron={lossg:.8f} '
            f'hf_fp32={ref32["tok_loss"]:.8f} hf_fp64={fmt(r64_tok)} rel={r:.3e} (tol {TOL_REL[prec]:g}) '
            f'per-token max|d|={max_diff(tg, ref32["tok_tok"], rolled != IGN):.3e} '
            f'logits max|d|={max_diff(lg, ref32["tok_logits"]):.3e}{route_text(rd)}',
            r < TOL_REL[prec] and routes_ok(rd, prec),
            model=tag,
            prec=prec,
            megatron=lossg,
            hf_fp32=ref32['tok_loss'],
            rel=r,
            routes_differ=rd and rd[0])
    except Exception as e:
        traceback.print_exc()
        record(f'[{tag}] K=1 {prec}/{attn}: ERROR {e!r}', False, model=tag, prec=prec)


def plist(s):
    return [p.strip() for p in (s or '').split(',') if p.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--model', action='append', required=True, help='HF model dir (repeatable); tag=basename')
    ap.add_argument('--model-type', action='append', default=None,
                    help='ms-swift model type per --model (or one for all); auto (default) = config.json model_type; '
                    f'{PLT_TYPE} for a Llama dir through the design\'s type')
    ap.add_argument('--tag', action='append', default=None, help='label per --model (default: basename)')
    ap.add_argument('--data', default=None, help='jsonl ({"messages": [...]} rows); not with --random-ids')
    ap.add_argument('--random-ids', action='store_true', help='uniform random token ids below the smallest vocab')
    ap.add_argument('--seed', type=int, default=0, help='of --random-ids')
    ap.add_argument('--patch-size', type=int, default=4)
    ap.add_argument('--B', type=int, default=2)
    ap.add_argument('--S', type=int, default=256)
    ap.add_argument('--port', type=int, default=29731)
    ap.add_argument('--precisions', default='bf16,fp32')
    ap.add_argument('--k1-precisions', default=None,
                    help='precisions of the K=1 lines, bit-identity and stock vs HF token-level (default: '
                    '--precisions; each costs two more model builds)')
    ap.add_argument('--hf-only', action='store_true', help='reference numbers only (no Megatron; CPU is fine)')
    ap.add_argument('--hf-device', default=None, help='device of the fp32 reference (default cuda if available)')
    ap.add_argument('--hf64-device', default='cpu', help='device of the fp64 reference (cpu, cuda, or none)')
    ap.add_argument('--hf-gdn', choices=('auto', 'torch'), default='auto',
                    help="the HF hybrids' Gated DeltaNet: what transformers picks (auto: fla's kernels when "
                    "installed) or transformers' torch code (torch: no Triton compile, fp64 possible)")
    ap.add_argument('--json', default=None)
    ap.add_argument('--backend', default='nccl', help='torch.distributed backend of the 1-rank group')
    ap.add_argument('--mg-kwargs', default=None, help='JSON dict of extra MegatronArguments fields')
    a = ap.parse_args()
    if not a.random_ids and not a.data:
        ap.error('--data or --random-ids is required')
    if a.mg_kwargs:
        MG_KWARGS.update(json.loads(a.mg_kwargs))
    global HF_GDN
    HF_GDN = a.hf_gdn
    K = a.patch_size
    tags = a.tag or [os.path.basename(os.path.normpath(m)) for m in a.model]
    mtypes = a.model_type or ['auto']
    if len(mtypes) == 1:
        mtypes = mtypes * len(a.model)
    if len(mtypes) != len(a.model) or len(tags) != len(a.model):
        ap.error('--model-type and --tag: one per --model (or one --model-type for all)')
    mtypes = [read_config(d)['model_type'] if t == 'auto' else t for t, d in zip(mtypes, a.model)]
    hf_dev = a.hf_device or ('cuda' if torch.cuda.is_available() else 'cpu')
    precisions = plist(a.precisions)
    k1_precisions = plist(a.k1_precisions) if a.k1_precisions is not None else precisions
    # exact fp32 everywhere on the reference side; deterministic kernels (MoE unpermute: index_add, not scatter_add)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision('highest')
    torch.use_deterministic_algorithms(True, warn_only=True)

    if a.random_ids:
        vocab = min(id_limit(read_config(d)) for d in a.model)
        ids = random_batch(vocab, a.B, a.S, a.seed)
    else:
        ids = make_batch(a.model[0], a.data, a.B, a.S)
    say(f'[parity] batch {tuple(ids.shape)}, K={K}, P={a.S // K}, first ids {ids[0, :8].tolist()}; model types '
        f'{dict(zip(tags, mtypes))}')
    RESULTS.update(K=K, B=a.B, S=a.S, models=dict(zip(tags, a.model)), model_types=dict(zip(tags, mtypes)))

    # 1. every HF reference before anything of mcore-bridge runs
    refs = {}
    for tag, mdir in zip(tags, a.model):
        try:
            r32, r64 = refs[tag] = hf_references(mdir, ids, K, hf_dev, a.hf64_device)
            rp = r64 or r32
            pr = rel(rp['plugin_on_hf_logits'], rp['plt_loss'])
            moe = f'; {len(r32["plt_routes"])} MoE layers' if r32['plt_routes'] else ''
            record(f'[{tag}] HF reference ({read_config(mdir).get("architectures", ["?"])[0]}): PatchTrain K={K} loss '
                   f'fp32={r32["plt_loss"]:.8f} fp64={fmt(r64 and r64["plt_loss"])} (fp32 rel err '
                   f'{fmt(r64 and rel(r32["plt_loss"], r64["plt_loss"]), ".1e")}); swift_plt.patch_level loss on the '
                   f'{"fp64" if r64 else "fp32"} HF logits={rp["plugin_on_hf_logits"]:.8f} (rel {pr:.1e}); '
                   f'token-level loss fp32={r32["tok_loss"]:.8f}; control: K={K} loss with targets shifted by '
                   f'one token {r32["plt_loss_shift1"]:.8f}{moe}',
                   model=tag,
                   plt_fp32=r32['plt_loss'],
                   plt_fp64=r64 and r64['plt_loss'],
                   tok_fp32=r32['tok_loss'],
                   shift1=r32['plt_loss_shift1'],
                   plugin_on_hf_logits=rp['plugin_on_hf_logits'])
            if pr > (1e-6 if r64 else 1e-5):  # fp32 logits over a 150k vocab: the sums round at ~1e-7 rel
                record(f'[{tag}] swift_plt.patch_level loss on HF logits differs from PatchTrain (rel {pr:.1e})', False)
            tm = [f'{name} first forward {r["timing"]["first_forward_s"]:.2f} s, repeated '
                  f'{r["timing"]["repeat_s"]:.3f} s' for name, r in (('fp32', r32), ('fp64', r64)) if r]
            gdn = 'fla (Triton)' if 'fla' in sys.modules and HF_GDN != 'torch' else 'torch'
            record(f'[{tag}] timing HF PatchTrain K={K} ({gdn} kernels loaded): ' + '; '.join(tm), model=tag,
                   hf_timing={name: r['timing'] for name, r in (('fp32', r32), ('fp64', r64)) if r})
        except Exception as e:
            traceback.print_exc()
            record(f'[{tag}] HF reference: ERROR {e!r}', False, model=tag)

    # 2./3. Megatron
    if not a.hf_only:
        try:
            megatron_init(a.port, a.backend)
            for prec in precisions:
                for tag, mdir, mt in zip(tags, a.model, mtypes):
                    if tag in refs:
                        run_megatron(tag, mdir, mt, ids, K, refs[tag][0], refs[tag][1], prec, prec in k1_precisions)
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
