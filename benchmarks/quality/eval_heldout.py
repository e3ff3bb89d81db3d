"""Held-out token-level loss and perplexity of exported HF models, with plain transformers only.

    SWIFT_PLT_DISABLE=1 python benchmarks/quality/eval_heldout.py HELDOUT_IDS.npy OUT.jsonl NAME=HF_DIR [...]
    SWIFT_PLT_DISABLE=1 python benchmarks/quality/eval_heldout.py A_IDS.npy,B=B_IDS.npy OUT.jsonl NAME=HF_DIR [...]

With several held-out sets (the continued-pretraining study: corpus A's and corpus B's rows), each model is loaded
once and scored on each: records NAME (the first set) and NAME@B (the set labelled B).

Every model sees the same rows (heldout_ids.npy: [n, T] int32, BOS + T-1 tokens of held-out documents). Loss = the
mean next-token cross entropy over all n*(T-1) predicted tokens (fp32 model and fp32 softmax); PPL = exp(loss).
Nothing of ms-swift or of swift-plt's training path is imported: `AutoModelForCausalLM.from_pretrained` as any user
would (a multimodal checkpoint, Qwen3.5: `AutoModelForImageTextToText`, its forward on the text ids alone).
QUAL_EVAL_GDN=torch: a hybrid's Gated DeltaNet layers run transformers' own torch code instead of
flash-linear-attention's kernels (swift_plt.tools.hf_gdn: the same recurrence; no Triton compile, minutes on a cold
cache, in the call's few seconds of eval).
"""
import json
import math
import os
import sys
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

from swift_plt.tools.hf_gdn import hf_torch_gdn


def load(model_dir, device='cuda'):
    with open(os.path.join(model_dir, 'config.json')) as f:
        multimodal = 'vision_config' in json.load(f)
    auto = AutoModelForImageTextToText if multimodal else AutoModelForCausalLM
    model = auto.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    if os.environ.get('QUAL_EVAL_GDN') == 'torch' and hf_torch_gdn(model):
        print(f'{model_dir}: Gated DeltaNet on transformers\' torch code', flush=True)
    return model


@torch.no_grad()
def heldout_loss(model_dir, ids, batch=32, device='cuda', model=None):
    """(mean loss, predicted tokens, class name); ``model``: already loaded from ``model_dir`` (kept)."""
    keep = model is not None
    model = model if keep else load(model_dir, device)
    total, count = 0.0, 0
    for s in range(0, len(ids), batch):
        x = torch.as_tensor(ids[s:s + batch], dtype=torch.long, device=device)
        logits = model(input_ids=x).logits.float()
        nll = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                                reduction='sum')
        total += nll.item()
        count += x[:, 1:].numel()
    cls = type(model).__module__ + '.' + type(model).__name__
    if not keep:
        del model
    return total / count, count, cls


def held_out_sets(arg):
    """'A.npy' -> [('', 'A.npy')]; 'A.npy,B=B.npy' -> [('', 'A.npy'), ('@B', 'B.npy')] (record name suffixes)."""
    out = []
    for i, part in enumerate(arg.split(',')):
        label, _, path = part.rpartition('=') if i else ('', '', part)
        out.append(('@' + label if label else '', path))
    return out


def main():
    rows = int(os.environ.get('QUAL_EVAL_ROWS', 0)) or None  # fewer rows only for the CPU dry run
    sets = [(sfx, np.load(p)[:rows]) for sfx, p in held_out_sets(sys.argv[1])]
    out = sys.argv[2]
    device = 'cuda' if torch.cuda.is_available() else 'cpu'

    def write(rec):
        print('EVAL ' + json.dumps(rec), flush=True)
        with open(out, 'a') as f:
            f.write(json.dumps(rec) + '\n')

    for spec in sys.argv[3:]:
        name, d = spec.split('=', 1)
        t = time.time()
        if not os.path.isdir(d):
            for sfx, _ in sets:
                write({'name': name + sfx, 'dir': d, 'error': 'missing: the run did not produce this model'})
            continue
        try:
            model = load(d, device)
        except Exception as e:  # noqa: BLE001 -- report and go on with the other models
            for sfx, _ in sets:
                write({'name': name + sfx, 'dir': d, 'error': f'{type(e).__name__}: {e}'})
            continue
        for sfx, ids in sets:
            try:
                loss, n, cls = heldout_loss(d, ids, device=device, model=model)
                rec = {'name': name + sfx, 'dir': d, 'loss': loss, 'ppl': math.exp(loss), 'tokens': n, 'class': cls,
                       'seconds': round(time.time() - t, 2)}
            except Exception as e:  # noqa: BLE001 -- report and go on with the other models
                rec = {'name': name + sfx, 'dir': d, 'error': f'{type(e).__name__}: {e}'}
            write(rec)
            t = time.time()
        del model


if __name__ == '__main__':
    main()
