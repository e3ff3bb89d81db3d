#!/usr/bin/env bash
# PLT (K=4) with the stock `swift pt` (ms-swift's HF backend) on a generated tiny Llama: CPU only, no GPU, ~1 minute.
# Needs swift-plt installed (`pip install .`; no Transformer Engine needed). Run from the repo root.
#     bash examples/quickstart_cpu.sh [WORKDIR] [extra swift pt flags, e.g. --max_steps 5]
set -euo pipefail
W=${1:-/tmp/plt_quickstart_cpu}
shift || true
python examples/make_tiny_llama.py "$W"
CUDA_VISIBLE_DEVICES= swift pt \
  --model "$W/model" --model_type llama3_2_plt --custom_register_path custom_model/llama.py \
  --patch_size 4 --template llama --dataset "$W/train.jsonl" --max_length 256 --tuner_type full \
  --torch_dtype float32 --fp16 false --bf16 false --per_device_train_batch_size 8 --learning_rate 1e-3 \
  --max_steps 40 --logging_steps 5 --save_steps 40 --split_dataset_ratio 0 --dataset_num_proc 1 \
  --dataloader_num_workers 0 --report_to none --output_dir "$W/out" "$@"
