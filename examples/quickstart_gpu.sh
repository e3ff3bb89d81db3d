#!/usr/bin/env bash
# PLT (K=4) on a generated tiny Llama through the stock `megatron pt`; 1 GPU, ~1 minute.
# Needs: ms-swift[megatron] 4.6 + Transformer Engine, and swift-plt installed (`pip install .`). Run from the repo root.
set -euo pipefail
W=${1:-/tmp/plt_quickstart}
python examples/make_tiny_llama.py "$W"
NPROC_PER_NODE=1 megatron pt \
  --model "$W/model" --model_type llama3_2_plt --custom_register_path custom_model/llama.py \
  --patch_size 4 --template llama --dataset "$W/train.jsonl" --max_length 256 \
  --micro_batch_size 4 --global_batch_size 8 --train_iters 100 \
  --lr 1e-3 --min_lr 1e-4 --lr_warmup_iters 5 --torch_dtype bfloat16 --attention_backend fused \
  --logging_steps 10 --save_steps 100 --no_save_optim true --no_save_rng true --output_dir "$W/out"
