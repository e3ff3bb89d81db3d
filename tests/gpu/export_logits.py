#!/usr/bin/env python3
"""Vanilla export vs the Megatron checkpoint it came from, one process, one GPU.

    python3 tests/gpu/export_logits.py --hf OUT/hf --checkpoint OUT/stage2_token/checkpoint-N --source MODEL \\
        --data train.jsonl [--json OUT.json]

On one batch (B=2, S=256 token ids of real text from the jsonl):
  1. plain transformers FIRST (mcore-bridge's rope code replaces transformers' ROPE_INIT_FUNCTIONS['default'] once
     it runs): AutoModelForCausalLM.from_pretrained(--hf, trust_remote_code=False) in fp32 (eager attention, no
     TF32) and in bf16; the same for --source (the initial weights: a control of how far training moved logits).
  2. Megatron: the model `megatron pt` builds (tests/gpu/parity.py:build_megatron, --model-type at patch_size 1)
     with the checkpoint's weights loaded by ms-swift's load_mcore_checkpoint (weights only, as the two-stage recipe
     hands stage 1 to stage 2): bf16 params + fused attention (as trained), and fp32 params + unfused attention.
Prints `EXPORT_LOGITS ...` lines: max |megatron - hf|, rel = max|d| / max|hf|, mean |d|, argmax agreement;
exit code 1 when a check fails (fp32: rel < 1e-4; bf16: rel < 5e-2 and argmax agreement >= 0.95; control:
max|d| between the source and the export > 10x the fp32 difference).
"""
import argparse
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity  # noqa: E402  (sets NVIDIA_TF32_OVERRIDE=0 before CUDA starts)
import torch  # noqa: E402

RESULTS = []
FAILED = []


def stats(mg, hf):
    mg, hf = mg.double().cpu(), hf.double().cpu()
    d = (mg - hf).abs()
    return {'max_abs': float(d.max()), 'rel': float(d.max() / hf.abs().max()), 'mean_abs': float(d.mean()),
            'argmax_agree': float((mg.argmax(-1) == hf.argmax(-1)).double().mean())}


def record(name, s, ok):
    line = (f'EXPORT_LOGITS {name}: max|d|={s["max_abs"]:.3e} rel={s["rel"]:.3e} mean|d|={s["mean_abs"]:.3e} '
            f'argmax agree={s["argmax_agree"]:.4f}' + ('' if ok is None else (' -> OK' if ok else ' -> FAIL')))
    print(line, flush=True)
    RESULTS.append(dict(name=name, ok=ok, **s))
    if ok is False:
        FAILED.append(name)


@torch.no_grad()
def hf_logits(path, ids, dtype):
    from transformers import AutoModelForCausalLM
    kw = {'attn_implementation': 'eager'} if dtype == torch.float32 else {}
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=False, **kw).cuda().eval()
    print(f'[export_logits] {path}: {type(model).__module__}.{type(model).__name__} {dtype}', flush=True)
    out = model(input_ids=ids.cuda()).logits.float().cpu()
    parity.free(model)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--hf', required=True)
    ap.add_argument('--checkpoint', required=True)
    ap.add_argument('--source', required=True, help='the HF model dir the run started from')
    ap.add_argument('--data', required=True)
    ap.add_argument('--json')
    ap.add_argument('--port', type=int, default=29731)
    ap.add_argument('--model-type', default='llama3_2_plt', help="the checkpoint's `--model_type` (e.g. qwen3_next)")
    a = ap.parse_args()
    ids = parity.make_batch(a.hf, a.data, 2, 256)
    ref = {p: hf_logits(a.hf, ids, dt) for p, dt in (('fp32', torch.float32), ('bf16', torch.bfloat16))}
    source32 = hf_logits(a.source, ids, torch.float32)

    parity.megatron_init(a.port)
    from swift.megatron.utils import load_mcore_checkpoint
    fp32_diff = None
    for prec, dtype, attn in (('bf16', torch.bfloat16, 'fused'), ('fp32', torch.float32, 'unfused')):
        try:
            args, model = parity.build_megatron(a.source, a.model_type, 1, dtype, attn)
            args.mcore_model = a.checkpoint
            load_mcore_checkpoint(args, [model], load_arg='mcore_model')
            mg = parity.mg_forward(model, ids.cuda()).float().cpu()[..., :ref['fp32'].shape[-1]]
            parity.free(model)
            if prec == 'fp32':
                s = stats(mg, ref['fp32'])
                fp32_diff = s['max_abs']
                record('megatron fp32/unfused vs export fp32 (plain transformers)', s, s['rel'] < 1e-4)
            else:
                for ref_prec in ('bf16', 'fp32'):
                    s = stats(mg, ref[ref_prec])
                    record(f'megatron bf16/fused (as trained) vs export {ref_prec} (plain transformers)', s,
                           s['rel'] < 5e-2 and s['argmax_agree'] >= 0.95)
        except Exception as e:
            traceback.print_exc()
            print(f'EXPORT_LOGITS megatron {prec}: ERROR {e!r} -> FAIL', flush=True)
            FAILED.append(f'megatron {prec}')
    s = stats(source32, ref['fp32'])
    record('control: source (initial weights) vs export, fp32', s,
           None if fp32_diff is None else s['max_abs'] > 10 * fp32_diff)
    if a.json:
        with open(a.json, 'w') as f:
            json.dump({'checks': RESULTS, 'failed': FAILED}, f, indent=2)
    sys.exit(1 if FAILED else 0)


if __name__ == '__main__':
    main()
