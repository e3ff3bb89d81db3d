#!/usr/bin/env bash
# The two-stage PLT recipe as a shell command you can edit (same as examples/two_stage.yaml). From the repo root:
#     bash examples/two_stage.sh /path/to/llama-hf-dir train.jsonl runs/plt     # add --dry_run to only print the plan
# Another family (config.json model_type picks --model_type): pass its template, e.g. --template qwen3 at the end.
# Rerunning the same command resumes: finished stages are skipped, an interrupted one continues from its last
# checkpoint. The result is the family's plain HF model in runs/plt/hf. GPUs: every visible one unless NPROC_PER_NODE
# is set.
set -euo pipefail
MODEL=$1 DATA=$2 OUT=${3:-runs/plt_two_stage}; shift $(( $# < 3 ? $# : 3 ))
swift-plt-two-stage \
  --model "$MODEL" --output_dir "$OUT" \
  --tokens 2B --patch_size 4 --lam 2/3 --max_length 2048 --global_batch_size 256 \
  --dataset "$DATA" --template llama3_2 --micro_batch_size 4 --lr 3e-4 --min_lr 3e-5 --lr_warmup_iters 100 \
  --torch_dtype bfloat16 --save_steps 200 --logging_steps 10 \
  --export_args "--torch_dtype bfloat16" \
  "$@"
