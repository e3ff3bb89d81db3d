#!/usr/bin/env bash
# `megatron pt` throughput the way users train: a random-init model with the exact Llama-3.2-1B config.json (llama3
# RoPE scaling, tied embeddings), the Llama-3 tokenizer, English text, --packing true, GBS 16, fused attention, bf16,
# 1 GPU. Four runs, interleaved ROUNDS times at MBS 4 (rotated: A B C D, B C D A, ...), then ROUNDS_M8 times at MBS 8:
#   A stock : --model_type llama, SWIFT_PLT_DISABLE=1 (the plugin off), --max_length 2048
#   B plt1  : --model_type llama3_2_plt --patch_size 1, --max_length 2048
#   C plt4  : --model_type llama3_2_plt --patch_size 4, --max_length 8192 (the same 2048 positions per sequence)
#   D stock2: A again, the control: stock2/stock is the noise floor of a ratio of two runs
# (names at MBS 8: stock_m8 ...). A warm-up run (round 0, in no ratio) comes first.
#
# Pipelined (tput_launch.py): up to LOOKAHEAD (3) processes start up at once (CPU work) and wait in
# BaseMegatronTrainer.__init__ for their turn; one run at a time uses the GPU. LOOKAHEAD=1: serial runs.
# Timing (step_probe/, first on PYTHONPATH): step time = median interval of steps WARM+1..ITERS after a
# torch.cuda.synchronize(); tokens/s = GBS * max_length / step time. Figures: $OUT/throughput.json and TPUT lines.
#
#   TOKENIZER_DIR=... TEXT=... bash benchmarks/throughput/throughput_1b.sh     (repo root, a GPU machine)
# env: TOKENIZER_DIR (dir with the Llama-3 tokenizer.json; required), TEXT (English .txt, blank-line paragraphs;
#      required), OUT (/tmp/plt_tput_out), TPUT_WORK (/tmp/plt_tput), ROUNDS (3), ROUNDS_M8 (1), M8_AFTER (ROUNDS:
#      MBS-4 rounds before the MBS-8 rounds), ITERS (12), WARM (3), MBS (4), GBS (16), RUNS ("stock plt1 plt4
#      stock2"), FIRST_ROUND (1), LOOKAHEAD (3), BUDGET (seconds from the start, setup included; no turn with less
#      than TURN_SECS (45) left; everything killed at BUDGET - 12 s, the summary still printed), PROFILE_STEP (0: off;
#      n: step n of the first MBS-4 round's plt1 and plt4 under torch.profiler), MODEL_DIR (reuse), REPEAT (5: copies
#      of the text for K=4), REPEAT_K1 (2), DATASET_NUM_PROC, TRAIN_CPUS / START_CPUS, SWIFT_PLT_REPORT_DOCS (200),
#      ROTATE (1), WARMUP_RUN (1), SWIFT_PLT_GPU_ENV (optional script sourced first: the machine's environment).
set -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 1
T0=$(date +%s.%N)
OUT=${OUT:-/tmp/plt_tput_out}
mkdir -p "$OUT"
W=${TPUT_WORK:-/tmp/plt_tput}
mkdir -p "$W/runs" "$W/probes"
ROUNDS=${ROUNDS:-3} ROUNDS_M8=${ROUNDS_M8:-1} ITERS=${ITERS:-12} WARM=${WARM:-3} MBS=${MBS:-4} GBS=${GBS:-16}
PROFILE_STEP=${PROFILE_STEP:-0} FIRST_ROUND=${FIRST_ROUND:-1} RUNS=${RUNS:-stock plt1 plt4 stock2} LOOKAHEAD=${LOOKAHEAD:-3}
BUDGET=${BUDGET:-100000} TURN_SECS=${TURN_SECS:-45}
# the plugin's K>1 data report (start-up, not timed; it never changes the data) encodes 200 documents, not all 1,665
export SWIFT_PLT_REPORT_DOCS=${SWIFT_PLT_REPORT_DOCS:-200}
[ -f "$TOKENIZER_DIR/tokenizer.json" ] || { echo "TPUT: TOKENIZER_DIR with the Llama-3 tokenizer.json is required"; exit 1; }
[ -f "${TEXT:-}" ] || { echo "TPUT: TEXT (an English .txt file) is required"; exit 1; }

# shellcheck disable=SC1090
[ -n "${SWIFT_PLT_GPU_ENV:-}" ] && source "$SWIFT_PLT_GPU_ENV"
command -v megatron >/dev/null 2>&1 || { echo "TPUT: megatron (ms-swift[megatron]) not found"; exit 1; }
if ! (cd /tmp && python3 -c "import swift_plt.plugin.import_hook as a; assert a._finder is not None") 2>/dev/null; then
  python3 -m pip install --no-deps --no-build-isolation --no-index . >"$OUT/tput_pip.log" 2>&1 ||
    python3 -m pip install --no-deps --no-build-isolation --no-index --break-system-packages . >>"$OUT/tput_pip.log" 2>&1
fi

# ---- data, then the model (exact Llama-3.2-1B config.json, random init, bf16): config and tokenizer are written at
# once, the weights in the background while the first runs start up (the launcher gives no turn before they exist)
python3 benchmarks/throughput/make_text_jsonl.py "$TEXT" "$W/text_k1.jsonl" --repeat "${REPEAT_K1:-2}" | sed 's/^/data K=1: /'
python3 benchmarks/throughput/make_text_jsonl.py "$TEXT" "$W/text_k4.jsonl" --repeat "${REPEAT:-5}" | sed 's/^/data K=4: /'
MODEL=${MODEL_DIR:-$W/llama32_1b}
rm -f "$W/model_failed"
MODEL_PID=
if [ ! -f "$MODEL/model.safetensors" ]; then
  ( CUDA_VISIBLE_DEVICES='' python3 benchmarks/throughput/make_llama32_1b.py "$MODEL" "$TOKENIZER_DIR" >"$W/make_model.log" 2>&1 ||
      touch "$W/model_failed" ) &
  MODEL_PID=$!
  for _ in $(seq 600); do [ -f "$MODEL/config.json" ] && [ -f "$MODEL/tokenizer.json" ] && break; [ -f "$W/model_failed" ] && break; sleep 0.1; done
fi
[ -f "$MODEL/config.json" ] || { echo "TPUT model creation failed"; cat "$W/make_model.log"; exit 1; }

ELAPSED=$(python3 -c "import time; print(time.time() - $T0)")
echo "TPUT setup done after ${ELAPSED%.*} s"
python3 benchmarks/throughput/tput_launch.py --work "$W" --model "$MODEL" --data-k1 "$W/text_k1.jsonl" --data-k4 "$W/text_k4.jsonl" \
  --names "$RUNS" --rounds "$ROUNDS" --rounds-m8 "$ROUNDS_M8" --first-round "$FIRST_ROUND" ${M8_AFTER:+--m8-after "$M8_AFTER"} --mbs "$MBS" --gbs "$GBS" \
  $([ "${ROTATE:-1}" = 1 ] && echo --rotate) $([ "${WARMUP_RUN:-1}" = 1 ] && echo --warmup) \
  --iters "$ITERS" --profile-step "$PROFILE_STEP" --lookahead "$LOOKAHEAD" --turn-secs "$TURN_SECS" \
  --deadline "$(python3 -c "print($T0 + $BUDGET - 12)")" --wait-file "$MODEL/model.safetensors" \
  --fail-file "$W/model_failed" ${DATASET_NUM_PROC:+--dataset-num-proc "$DATASET_NUM_PROC"} \
  ${TRAIN_CPUS:+--train-cpus "$TRAIN_CPUS"} ${START_CPUS:+--start-cpus "$START_CPUS"} ${MEGATRON:+--megatron "$MEGATRON"}
if [ -n "$MODEL_PID" ]; then  # done by now unless the budget ran out first
  pkill -P "$MODEL_PID" 2>/dev/null; kill "$MODEL_PID" 2>/dev/null; wait "$MODEL_PID" 2>/dev/null
  grep -h '^model:' "$W/make_model.log"
fi
python3 benchmarks/throughput/throughput_summary.py "$W/probes" --warm "$WARM" --gbs "$GBS" --json "$OUT/throughput.json"
