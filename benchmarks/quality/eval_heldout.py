"""Held-out token-level loss and perplexity of exported HF models, with plain transformers only.

    SWIFT_PLT_DISABLE=1 python benchmarks/quality/eval_heldout.py HELDOUT_IDS.npy OUT.jsonl NAME=HF_DIR [...]

Every model sees the same rows (heldout_ids.npy: [n, T] int32, BOS + T-1 tokens of held-out documents). Loss = the
mean next-token cross entropy over all n*(T-1) predicted tokens (fp32 model and fp32 softmax); PPL = exp(loss).
Nothing of swift-plt or ms-swift is imported: `AutoModelForCausalLM.from_pretrained` as any user would.
"""
import json
import math
import os
import sys
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM


@torch.no_grad()
def heldout_loss(model_dir, ids, batch=32, device='cuda'):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    total, count = 0.0, 0
    for s in range(0, len(ids), batch):
        x = torch.as_tensor(ids[s:s + batch], dtype=torch.long, device=device)
        logits = model(input_ids=x).logits.float()
        nll = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                                reduction='sum')
        total += nll.item()
        count += x[:, 1:].numel()
    cls = type(model).__module__ + '.' + type(model).__name__
    del model
    return total / count, count, cls


def main():
    ids = np.load(sys.argv[1])
    ids = ids[:int(os.environ.get('QUAL_EVAL_ROWS', len(ids)))]  # fewer rows only for the CPU dry run
    out = sys.argv[2]
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    for spec in sys.argv[3:]:
        name, d = spec.split('=', 1)
        t = time.time()
        if not os.path.isdir(d):
            rec = {'name': name, 'dir': d, 'error': 'missing: the run did not produce this model'}
            print('EVAL ' + json.dumps(rec), flush=True)
            with open(out, 'a') as f:
                f.write(json.dumps(rec) + '\n')
            continue
        try:
            loss, n, cls = heldout_loss(d, ids, device=device)
            rec = {'name': name, 'dir': d, 'loss': loss, 'ppl': math.exp(loss), 'tokens': n, 'class': cls,
                   'seconds': round(time.time() - t, 2)}
        except Exception as e:  # noqa: BLE001 -- report and go on with the other models
            rec = {'name': name, 'dir': d, 'error': f'{type(e).__name__}: {e}'}
        print('EVAL ' + json.dumps(rec), flush=True)
        with open(out, 'a') as f:
            f.write(json.dumps(rec) + '\n')


if __name__ == '__main__':
    main()
