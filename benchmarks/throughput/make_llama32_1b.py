#!/usr/bin/env python3
"""A random-init model with the exact meta-llama/Llama-3.2-1B config.json (llama3 RoPE scaling, tied embeddings),
bf16 safetensors, plus the tokenizer files of TOKENIZER_DIR (the Llama-3 tokenizer, e.g. the tokenizer files of
meta-llama/Llama-3.2-1B; its licence forbids committing it).

    python3 benchmarks/throughput/make_llama32_1b.py OUT_DIR TOKENIZER_DIR      (CPU is enough: ~1.2 B params, 2.5 GB)
        [--hidden_size H --num_hidden_layers L --num_attention_heads A --num_key_value_heads G --intermediate_size F]
    (the options: another size of the same architecture, recipe_sizes.sh)

config.json and the tokenizer files are written first, the weights last (saved to OUT_DIR.weights_tmp, then renamed into OUT_DIR):
a `megatron pt` run can start up (it reads only the config and the tokenizer before building the model) while the
weights are made; model.safetensors appears in OUT_DIR only when complete (tput_launch.py --wait-file).
"""
import argparse
import copy
import json
import os
import shutil
import sys

ap = argparse.ArgumentParser()
ap.add_argument('out')
ap.add_argument('tokenizer')
for k in ('hidden_size', 'num_hidden_layers', 'num_attention_heads', 'num_key_value_heads', 'intermediate_size'):
    ap.add_argument(f'--{k}', type=int, help='another size of the same architecture (head_dim stays 64)')
a = ap.parse_args()
out, tok = a.out, a.tokenizer
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'tests', 'gpu'))
from make_family_configs import LLAMA32_1B  # noqa: E402  (meta-llama/Llama-3.2-1B config.json)

cfg = dict(LLAMA32_1B, **{k: v for k, v in vars(a).items() if k not in ('out', 'tokenizer') and v is not None})

os.makedirs(out, exist_ok=True)
with open(os.path.join(out, 'config.json'), 'w') as f:  # the original file, as users download it
    json.dump(cfg, f, indent=2)
for f in os.listdir(tok):
    if f.startswith(('tokenizer', 'special_tokens')):
        shutil.copy(os.path.join(tok, f), out)
import torch  # noqa: E402  (after the config and tokenizer files: the runs can start on them)
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

torch.manual_seed(0)
torch.set_default_dtype(torch.bfloat16)
model = LlamaForCausalLM(LlamaConfig(**copy.deepcopy(cfg)))  # transformers edits nested dicts in place
tmp = os.path.normpath(out) + '.weights_tmp'
model.save_pretrained(tmp, safe_serialization=True)
for f in sorted(os.listdir(tmp), key=lambda f: f == 'model.safetensors'):  # the weights last
    if f != 'config.json':
        os.replace(os.path.join(tmp, f), os.path.join(out, f))
shutil.rmtree(tmp)
saved = cfg
n = sum(p.numel() for p in model.parameters())
print(f'model: {n / 1e9:.4f} B params, tied={saved.get("tie_word_embeddings")}, rope_scaling={saved.get("rope_scaling") or saved.get("rope_parameters")} -> {out}')
