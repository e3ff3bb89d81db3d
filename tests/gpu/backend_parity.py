#!/usr/bin/env python3
"""Backend parity on one GPU: the HF-side PLT model (swift_plt.models.hf_llama.PLTLlamaForCausalLM, what `swift pt
--patch_size K` trains) against the Megatron PLT model (PLTGPTModel, what `megatron pt --patch_size K` trains), same
weights, same batch, and both against the PatchTrain formula written out on fp32 HF logits.

    python3 tests/gpu/backend_parity.py --model DIR [--model DIR2 ...] --data train.jsonl [--json OUT.json]

Batch: B=2 rows of S=256 token ids of real text (parity.make_batch), ~15% of the labels set to -100 (fixed seed).
  1. HF side first (mcore-bridge's RoPE code breaks HF Llama construction once it runs in a process):
     brute force: fp32 LlamaForCausalLM, e = mean of K embeddings, positions 0..P-1, log_softmax of patch p's
       logits scored against the K tokens of patch p+1, mean NLL over labels != -100 (first patch unpredicted);
     the HF PLT model in bf16 (sdpa) and fp32 (eager): model(input_ids, labels=labels).loss.
  2. Megatron PLT model via ms-swift's MegatronArguments + mcore-bridge (parity.build_megatron): bf16 with fused
     attention, fp32 with unfused; loss = ms-swift's loss_func (sum over labels != -100 / count).
Prints `BACKEND_PARITY ...` lines with the relative differences; checks: |hf - megatron| / ref and each vs the
brute force below 1e-2 (bf16) / 1e-4 (fp32). Exit code 1 when a check fails or errors.
"""
import argparse
import gc
import json
import os
import sys
import traceback

os.environ.setdefault('NVIDIA_TF32_OVERRIDE', '0')  # fp32 is fp32 (set before CUDA initialises)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import parity  # noqa: E402  (tests/gpu/parity.py: batch, Megatron build/forward, ms-swift's loss)

IGN = -100
TOL = {'bf16': 1e-2, 'fp32': 1e-4}
RESULTS, FAILED = [], []


def say(line, ok=None, **data):
    verdict = '' if ok is None else (' -> OK' if ok else ' -> FAIL')
    print(f'BACKEND_PARITY {line}{verdict}', flush=True)
    RESULTS.append(dict(line=line, ok=ok, **data))
    if ok is False:
        FAILED.append(line)


def make_labels(ids, K, seed=0):
    from swift_plt.patch_level.layout import mask_first_patch
    g = torch.Generator().manual_seed(seed)
    labels = ids.clone()
    labels[torch.rand(ids.shape, generator=g) < 0.15] = IGN
    pos = torch.arange(ids.shape[1]).expand_as(ids)
    return mask_first_patch(labels, pos, K)


@torch.no_grad()
def brute_force(model_dir, ids, labels, K):
    """PatchTrain's formula, the obvious way (swift_plt.patch_level.reference): fp32 forward on the GPU, fp64 loss,
    every valid (patch, k) target weighted the same."""
    from transformers import LlamaForCausalLM

    from swift_plt.patch_level.reference import patch_logits, reference_loss
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation='eager').cuda()
    out = float(reference_loss(patch_logits(model, ids.cuda(), K), labels, K))
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return out


@torch.no_grad()
def hf_plt_loss(model_dir, ids, labels, K, dtype, attn):
    from transformers import AutoConfig

    from swift_plt.models.hf_llama import PLTLlamaForCausalLM
    config = AutoConfig.from_pretrained(model_dir)
    config.patch_size = K
    model = PLTLlamaForCausalLM.from_pretrained(model_dir, config=config, dtype=dtype, attn_implementation=attn)
    model = model.cuda().eval()
    loss = float(model(input_ids=ids.cuda(), labels=labels.cuda()).loss)
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return loss


def megatron_plt_loss(model_dir, ids, labels, K, dtype, attn):
    _, model = parity.build_megatron(model_dir, 'llama3_2_plt', K, dtype, attn)
    with torch.no_grad():
        losses = parity.mg_forward(model, ids.cuda(), labels.cuda())
    loss = parity.swift_loss(losses, labels.cuda())
    parity.free(model)
    return loss


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--model', action='append', required=True)
    ap.add_argument('--data', required=True)
    ap.add_argument('--patch-size', type=int, default=4)
    ap.add_argument('--B', type=int, default=2)
    ap.add_argument('--S', type=int, default=256)
    ap.add_argument('--port', type=int, default=29753)  # not two_stage.sh's 29741: the two may share a machine
    ap.add_argument('--json', default=None)
    ap.add_argument('--backend', default='nccl', help='torch.distributed backend (gloo: CPU dry run via the harness)')
    ap.add_argument('--mg-kwargs', default=None, help='JSON dict of extra MegatronArguments fields (CPU dry run)')
    a = ap.parse_args()
    if a.mg_kwargs:
        parity.MG_KWARGS.update(json.loads(a.mg_kwargs))
    K = a.patch_size
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ids = parity.make_batch(a.model[0], a.data, a.B, a.S)
    labels = make_labels(ids, K)
    precs = {'bf16': (torch.bfloat16, 'sdpa', 'fused'), 'fp32': (torch.float32, 'eager', 'unfused')}
    hf = {}
    for mdir in a.model:  # 1. every HF-side number before mcore-bridge runs
        try:
            hf[mdir] = {'ref': brute_force(mdir, ids, labels, K)}
            for prec, (dtype, attn, _) in precs.items():
                hf[mdir][prec] = hf_plt_loss(mdir, ids, labels, K, dtype, attn)
        except Exception as e:
            traceback.print_exc()
            say(f'[{os.path.basename(mdir)}] HF side: ERROR {e!r}', False)
    try:  # 2. Megatron
        parity.megatron_init(a.port, a.backend)
        for mdir, h in hf.items():
            tag = os.path.basename(os.path.normpath(mdir))
            for prec, (dtype, _, mg_attn) in precs.items():
                try:
                    mg = megatron_plt_loss(mdir, ids, labels, K, dtype, mg_attn)
                    ref, hl = h['ref'], h[prec]
                    d_hm, d_h, d_m = abs(hl - mg) / ref, abs(hl - ref) / ref, abs(mg - ref) / ref
                    say(f'[{tag}] K={K} {prec}: hf_model={hl:.8f} megatron={mg:.8f} brute_force_fp32={ref:.8f} '
                        f'rel|hf-megatron|={d_hm:.3e} rel|hf-ref|={d_h:.3e} rel|megatron-ref|={d_m:.3e} '
                        f'(tol {TOL[prec]:g})',
                        max(d_hm, d_h, d_m) < TOL[prec], model=tag, prec=prec, hf=hl, megatron=mg, ref=ref)
                except Exception as e:
                    traceback.print_exc()
                    say(f'[{tag}] K={K} {prec}: Megatron ERROR {e!r}', False)
    except Exception as e:
        traceback.print_exc()
        say(f'Megatron setup: ERROR {e!r}', False)
    say(f'summary: {len(RESULTS)} lines, {len(FAILED)} failed')
    path = a.json or (os.path.join(os.environ['OUT'], 'backend_parity.json') if os.environ.get('OUT') else None)
    if path:
        with open(path, 'w') as f:
            json.dump(RESULTS, f, indent=2)
    return 1 if FAILED else 0


if __name__ == '__main__':
    sys.exit(main())
