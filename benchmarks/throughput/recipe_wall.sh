#!/usr/bin/env bash
# The whole recipe (`swift-plt-two-stage`: stage 1 at K=4, stage 2, the export) against token-level training of the
# same tokens with the same settings (stock `megatron pt`, K=1), wall clock to wall clock, on the exact Llama-3.2-1B
# config (random init), one GPU. Default: 330 token-level steps of 64 x 2048 tokens (43.3 M tokens; ~10.5 min of
# token-level training on one H100); the text cycles as often as needed.
#
#   TOKENIZER=DIR TEXT=FILE.txt bash benchmarks/throughput/recipe_wall.sh     (a GPU machine; ~25 min)
#
# env: STEPS (330; a multiple of 3 at λ=2/3), RUNS ("recipe token"), MBS (8), WORK (/tmp/plt_recipe_wall),
# RECIPE_ARGS (more recipe flags, e.g. "--stage2_start after"), SWIFT_PLT_GPU_ENV (sourced first).
# Output: WALL lines; the recipe's summary (per stage: training, wall clock by phase) and the token-level run's phases.
set -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 1
: "${TOKENIZER:?set TOKENIZER (the Llama-3 tokenizer files)}" "${TEXT:?set TEXT (an English .txt file)}"
STEPS=${STEPS:-330} RUNS=${RUNS:-recipe token} MBS=${MBS:-8} W=${WORK:-/tmp/plt_recipe_wall}
mkdir -p "$W"
# shellcheck disable=SC1090
[ -n "${SWIFT_PLT_GPU_ENV:-}" ] && source "$SWIFT_PLT_GPU_ENV"
[ -f "$W/text.jsonl" ] || python3 benchmarks/throughput/make_text_jsonl.py "$TEXT" "$W/text.jsonl" --repeat 14 | tail -1
[ -f "$W/model/config.json" ] || CUDA_VISIBLE_DEVICES= python3 benchmarks/throughput/make_llama32_1b.py "$W/model" \
  "$TOKENIZER" > "$W/make.log" 2>&1 || { echo "WALL: model FAILED"; tail -3 "$W/make.log"; exit 1; }
TOKENS=$((STEPS * 64 * 2048))
SHARED=(--max_length 2048 --global_batch_size 64 --micro_batch_size "$MBS" --dataset "$W/text.jsonl" --template llama3_2
  --packing true --attention_backend fused --lr 1e-4 --min_lr 1e-5 --lr_warmup_iters 1 --bf16 true
  --torch_dtype bfloat16 --logging_steps 1 --save_steps 100000 --no_save_optim true --no_save_rng true
  --dataset_num_proc 8 --split_dataset_ratio 0)
rc_all=0
for run in $RUNS; do
  t0=$(date +%s.%N)
  case $run in
    recipe)
      rm -rf "$W/recipe"
      # shellcheck disable=SC2086
      swift-plt-two-stage --model "$W/model" --output_dir "$W/recipe" --tokens "$TOKENS" --patch_size 4 --lam 2/3 \
        "${SHARED[@]}" --export_args "--torch_dtype bfloat16" ${RECIPE_ARGS:-} > "$W/recipe.out" 2>&1
      rc=$?
      sed 's/^/WALL recipe | /' "$W/recipe/summary.txt" 2>/dev/null ;;
    token)
      rm -rf "$W/token"
      SWIFT_PLT_DISABLE=1 NPROC_PER_NODE=1 python3 benchmarks/throughput/timed_run.py "$W/token.log" "$W/token" -- \
        megatron pt --model "$W/model" --model_type llama --train_iters "$STEPS" --output_dir "$W/token" \
        --add_version false --save_safetensors false "${SHARED[@]}" > "$W/token.out" 2>&1
      rc=$?
      grep '^TIMED' "$W/token.out" | sed 's/^/WALL token | /' ;;
    *) echo "WALL: unknown run $run (recipe or token)"; exit 2 ;;
  esac
  wall=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
  echo "WALL $run: rc=$rc wall ${wall} s ($TOKENS tokens)"
  echo "$run $wall" >> "$W/walls.txt"
  [ "$rc" = 0 ] || rc_all=1
done
python3 - "$W/walls.txt" <<'PY'
import sys
w = {}
for line in open(sys.argv[1]):
    name, s = line.split()
    w[name] = float(s)  # the latest of each
if 'recipe' in w and 'token' in w:
    print(f"WALL recipe / token-level: {w['recipe'] / w['token']:.3f} ({w['recipe']:.1f} s / {w['token']:.1f} s)")
PY
exit $rc_all
