#!/usr/bin/env bash
# From which model size the patch stage's compute saving is a time saving on one GPU: `swift-plt-two-stage` (K=4,
# λ=2/3; stages 1 and 2, no export) on random-init models of the Llama-3.2-1B architecture at several sizes, each
# with the recipe's summary: per stage the training time, the wall clock and the same tokens' token-level estimate at
# stage 2's rate, and the whole recipe against token-level training.
#
#   TOKENIZER=DIR TEXT=FILE.txt bash benchmarks/throughput/recipe_sizes.sh     (a GPU machine; ~3-4 min a size)
#
# TOKENIZER: the Llama-3 tokenizer files; TEXT: English text (repeated to TOKENS). env: SIZES ("0.17b 0.6b": total
# parameters, 0.08 B / 0.40 B without the tied embedding; 1b = the exact Llama-3.2-1B config), TOKENS (4718592 =
# 24 + 12 steps of 64 x 2048), MBS (8, stage 2; stage 1: picked from memory), WORK (/tmp/plt_recipe_sizes),
# OUT (/tmp/plt_recipe_sizes_out), SWIFT_PLT_GPU_ENV (sourced first).
# Output: the `RECIPE SIZE` lines and each size's summary in $OUT/summary_SIZE.txt.
set -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 1
: "${TOKENIZER:?set TOKENIZER (the Llama-3 tokenizer files)}" "${TEXT:?set TEXT (an English .txt file)}"
SIZES=${SIZES:-0.17b 0.6b} TOKENS=${TOKENS:-4718592} MBS=${MBS:-8}
W=${WORK:-/tmp/plt_recipe_sizes} OUT=${OUT:-/tmp/plt_recipe_sizes_out}
mkdir -p "$W" "$OUT"
# shellcheck disable=SC1090
[ -n "${SWIFT_PLT_GPU_ENV:-}" ] && source "$SWIFT_PLT_GPU_ENV"
command -v swift-plt-two-stage >/dev/null 2>&1 ||
  { echo "RECIPE: swift-plt-two-stage not found (pip install .)"; exit 1; }
python3 benchmarks/throughput/make_text_jsonl.py "$TEXT" "$W/text.jsonl" --repeat 14 | tail -1
# hidden, layers, heads (of 64), KV heads, FFN
declare -A SHAPE=([0.17b]="768 12 12 4 2048" [0.6b]="1536 16 24 8 4096" [1b]="")
rc_all=0
for size in $SIZES; do
  [ -n "${SHAPE[$size]+x}" ] || { echo "RECIPE: unknown size $size (one of ${!SHAPE[*]})"; exit 2; }
  m=$W/model_$size run=$W/run_$size
  rm -rf "$run"
  read -r h l a g f <<<"${SHAPE[$size]}"
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES= python3 benchmarks/throughput/make_llama32_1b.py "$m" "$TOKENIZER" ${h:+--hidden_size $h \
    --num_hidden_layers $l --num_attention_heads $a --num_key_value_heads $g --intermediate_size $f} \
    > "$W/make_$size.log" 2>&1 || { echo "RECIPE $size: model FAILED"; tail -3 "$W/make_$size.log"; exit 1; }
  echo "RECIPE $size: $(tail -1 "$W/make_$size.log")"
  t0=$SECONDS
  for st in 1 2; do
    swift-plt-two-stage --stage $st --model "$m" --output_dir "$run" --tokens "$TOKENS" --patch_size 4 --lam 2/3 \
      --max_length 2048 --global_batch_size 64 --micro_batch_size "$MBS" --dataset "$W/text.jsonl" \
      --template llama3_2 --packing true --attention_backend fused --lr 1e-4 --min_lr 1e-5 --lr_warmup_iters 1 \
      --bf16 true --torch_dtype bfloat16 --logging_steps 1 --save_steps 1000 --no_save_optim true \
      --no_save_rng true --dataset_num_proc 8 --split_dataset_ratio 0 > "$W/recipe_${size}_stage$st.out" 2>&1
    rc=$?
    [ $rc = 0 ] || { echo "RECIPE $size: stage $st rc=$rc"; tail -5 "$W/recipe_${size}_stage$st.out"; rc_all=1; break; }
  done
  echo "RECIPE $size: stages 1-2 in $((SECONDS - t0)) s"
  cp "$run/summary.txt" "$OUT/summary_$size.txt" 2>/dev/null && sed 's/^/RECIPE '"$size"' | /' "$run/summary.txt"
done
exit $rc_all
