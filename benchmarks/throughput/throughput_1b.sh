#!/usr/bin/env bash
# `megatron pt` throughput the way users train: a random-init model with the exact Llama-3.2-1B config.json (llama3
# RoPE scaling, tied embeddings), the real Llama-3 tokenizer, English text, --packing true, GBS 16, fused attention,
# bf16, 1 GPU. Four runs, interleaved ROUNDS times at MBS 4 (A B C D, rotated: B C D A, ...), then ROUNDS_M8 times at MBS 8:
#   A stock : --model_type llama, SWIFT_PLT_DISABLE=1 (the plugin off), --max_length 2048
#   B plt1  : --model_type llama3_2_plt --patch_size 1, --max_length 2048
#   C plt4  : --model_type llama3_2_plt --patch_size 4, --max_length 8192 (the same 2048 positions per sequence)
#   D stock2: A again, the control: stock2/stock step time is the noise floor of a ratio of two runs
# (names at MBS 8: stock_m8 plt1_m8 plt4_m8). The MBS 4 rounds come first, so a budget cut drops the MBS 8 runs first.
#
# Pipelined (benchmarks/tput_launch.py): up to LOOKAHEAD (3) processes are alive; they start up at once (imports,
# megatron init, tokenisation, packing: CPU) pinned to the start cores, and wait in BaseMegatronTrainer.__init__ (the
# first GPU-heavy work) for their turn, which the launcher hands out in the interleaved order once the previous run's
# process has exited; the run with the turn moves all its threads to the training cores (16 cores: 0-5 train, 6-15
# start; no pinning below 8 cores). LOOKAHEAD=1: serial runs.
# Timing: benchmarks/step_probe (sitecustomize, first on PYTHONPATH) records the end of every train_step after a
# torch.cuda.synchronize(); step time = median of the intervals over steps WARM+1..ITERS; the process exits after
# step ITERS (no final save). tokens/s = GBS * max_length / step time (sequence slots). Probes in $TPUT_WORK/probes;
# figures in $OUT/throughput.json and TPUT lines.
# ITERS=12, WARM=3: in the H100 runs of 2026-11-23 (benchmarks/results/h100_2026-11-23) the step intervals were settled
# from step 3 on: stock 695 (step 2), then 642 646 649 663 638 650 684 691 641 643 645 721 ms; plt1 713 (step 2), 686
# (step 3) before its profiled step 4. So intervals of steps 4..12 (9 of them) are timed, the median of 9 (the single
# slow 684..721 ms steps seen then do not move it).
#
#   bash benchmarks/throughput_1b.sh     (device machine, repo root)
# env: OUT, TPUT_WORK (/tmp/plt_tput), TOKENIZER_DIR (dir with tokenizer.json of Llama-3; required), TEXT (a .txt;
#      default /work/shared/data/pd_extract_2mb.txt), ROUNDS (3), ROUNDS_M8 (1), ITERS (12), WARM (3), MBS (4),
#      GBS (16), RUNS ("stock plt1 plt4 stock2"), FIRST_ROUND (1), M8_AFTER (ROUNDS: MBS-4 rounds before the MBS-8 rounds;
#      2 = A B C A B C A8 B8 C8 A B C), LOOKAHEAD (3), BUDGET (seconds from the start of this
#      script, setup included; no run gets its turn with less than TURN_SECS (45, or the longest turn-to-exit seen)
#      left; every process is killed at BUDGET - 12 s and the summary printed), PROFILE_STEP (0: off; n: the first
#      MBS-4 round's plt1 and plt4 run step n under torch.profiler; n = ITERS + 1 profiles after the timed steps),
#      MODEL_DIR (reuse), REPEAT (5: copies of the text for K=4; 192 rows of 8192 tokens), REPEAT_K1 (2: for K=1),
#      DATASET_NUM_PROC (default: start cores / (LOOKAHEAD - 1), at most 8), TRAIN_CPUS / START_CPUS (override),
#      SWIFT_PLT_REPORT_DOCS (200), ROTATE (1: round i runs the names rotated by i, A B C / B C A / C A B),
#      WARMUP_RUN (1: one run of the first name before round 1, round 0, not in any ratio: the machine's first run
#      was 9 % slower than later ones on the H200 of 2026-11-23).
set -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 1
T0=$(date +%s.%N)
OUT=${OUT:-/tmp/plt_tput_out}
mkdir -p "$OUT"
W=${TPUT_WORK:-/tmp/plt_tput}
mkdir -p "$W/runs" "$W/probes"
ROUNDS=${ROUNDS:-3} ROUNDS_M8=${ROUNDS_M8:-1} ITERS=${ITERS:-12} WARM=${WARM:-3} MBS=${MBS:-4} GBS=${GBS:-16}
PROFILE_STEP=${PROFILE_STEP:-0} FIRST_ROUND=${FIRST_ROUND:-1} RUNS=${RUNS:-stock plt1 plt4 stock2} LOOKAHEAD=${LOOKAHEAD:-3}
BUDGET=${BUDGET:-100000} TURN_SECS=${TURN_SECS:-45}
TEXT=${TEXT:-/work/shared/data/pd_extract_2mb.txt}
# the plugin's K>1 data report (start-up, not timed; it never changes the data) encodes 200 documents, not all 1,665
export SWIFT_PLT_REPORT_DOCS=${SWIFT_PLT_REPORT_DOCS:-200}
[ -f "$TOKENIZER_DIR/tokenizer.json" ] || { echo "TPUT: TOKENIZER_DIR with the Llama-3 tokenizer.json is required"; exit 1; }

if ! command -v megatron >/dev/null 2>&1; then
  # shellcheck disable=SC1091
  source .gpu_kit/setup_device.sh >"$OUT/tput_setup_kit.log" 2>&1 || { echo "TPUT setup failed"; exit 1; }
fi
if ! (cd /tmp && python3 -c "import swift_plt.activation as a; assert a._finder is not None") 2>/dev/null; then
  python3 -m pip install --no-deps --no-build-isolation --no-index . >"$OUT/tput_pip.log" 2>&1 ||
    python3 -m pip install --no-deps --no-build-isolation --no-index --break-system-packages . >>"$OUT/tput_pip.log" 2>&1
fi

# ---- data, then the model (exact Llama-3.2-1B config.json, random init, bf16): config and tokenizer are written at
# once, the weights in the background while the first runs start up (the launcher gives no turn before they exist)
python3 benchmarks/make_text_jsonl.py "$TEXT" "$W/text_k1.jsonl" --repeat "${REPEAT_K1:-2}" | sed 's/^/data K=1: /'
python3 benchmarks/make_text_jsonl.py "$TEXT" "$W/text_k4.jsonl" --repeat "${REPEAT:-5}" | sed 's/^/data K=4: /'
MODEL=${MODEL_DIR:-$W/llama32_1b}
rm -f "$W/model_failed"
MODEL_PID=
if [ ! -f "$MODEL/model.safetensors" ]; then
  ( CUDA_VISIBLE_DEVICES='' python3 benchmarks/make_llama32_1b.py "$MODEL" "$TOKENIZER_DIR" >"$W/make_model.log" 2>&1 ||
      touch "$W/model_failed" ) &
  MODEL_PID=$!
  for _ in $(seq 600); do [ -f "$MODEL/config.json" ] && [ -f "$MODEL/tokenizer.json" ] && break; [ -f "$W/model_failed" ] && break; sleep 0.1; done
fi
[ -f "$MODEL/config.json" ] || { echo "TPUT model creation failed"; cat "$W/make_model.log"; exit 1; }

ELAPSED=$(python3 -c "import time; print(time.time() - $T0)")
echo "TPUT setup done after ${ELAPSED%.*} s"
python3 benchmarks/tput_launch.py --work "$W" --model "$MODEL" --data-k1 "$W/text_k1.jsonl" --data-k4 "$W/text_k4.jsonl" \
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
python3 benchmarks/throughput_summary.py "$W/probes" --warm "$WARM" --gbs "$GBS" --json "$OUT/throughput.json"
