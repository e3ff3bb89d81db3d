#!/usr/bin/env bash
# The fused PLT loss and its effect on throughput, one GPU (from anywhere; $OUT default
# ./gpu_results/fused_loss_throughput):
#     TOKENIZER_DIR=... TEXT=... bash tests/gpu/fused_loss_throughput.sh
#   1. the fused Triton PLT loss against the torch reference on real shapes (tests/gpu/plt_triton_check.py)
#   2. the loss benchmark (benchmarks/loss/plt_loss_bench.py): time and peak memory vs megatron's cross entropy
#   3. the throughput benchmark (benchmarks/throughput/throughput_1b.sh: stock / llama3_2_plt K=1 / K=4,
#      interleaved, with the K=4 vs K=1 profiler step). Needs TOKENIZER_DIR (a dir with the Llama-3 tokenizer.json;
#      its licence keeps it out of the repo) and TEXT (an English .txt file); without them: a SKIP line.
# env: OUT, BUDGET (seconds for the whole script, default 370), ROUNDS (1), ITERS (14), WARM (6), PROFILE_STEP (14),
#      FLT_WORK (scratch dir), SWIFT_PLT_GPU_ENV. Each `megatron pt` run of step 3 takes 90-110 s on an H100
#      (start-up ~80 s), so the 3 runs need ~5.5 min after the ~110 s of steps 1-2 and model creation: BUDGET=560
#      runs them all; RUNS=... FIRST_ROUND=... split them over several calls (benchmarks/throughput/
#      throughput_summary.py combines the probe dirs from logs.tgz).
# $OUT: 00_summary.txt (every figure), plt_loss_bench.json, throughput.json, logs.tgz (all logs, probes, profiles).
# Last line "FUSED_LOSS_THROUGHPUT: OK|FAIL (n/m)".
set -o pipefail
# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
GPU_CUDA_ONLY="Triton kernels and CUDA timings"
gpu_init fused_loss_throughput 00_summary.txt "${FLT_WORK:-/tmp/swift_plt_gpu/fused_loss_throughput}" 370 1
mkdir -p "$W/logs"
L=$W/logs
export CUDA_VISIBLE_DEVICES=$(dev 0)
say "0 setup: $(cd / && python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' 2>&1 | tail -1); $(now)"
TPUT=1
[ -f "${TOKENIZER_DIR:-}/tokenizer.json" ] && [ -f "${TEXT:-}" ] || TPUT=0

# model (CPU, in the background while the kernel runs on the GPU)
MODEL=$W/llama32_1b
if [ $TPUT = 1 ]; then
  (CUDA_VISIBLE_DEVICES='' python3 benchmarks/throughput/make_llama32_1b.py "$MODEL" "$TOKENIZER_DIR" >"$L/make_model.log" 2>&1;
    echo "rc=$?" >>"$L/make_model.log") &
  MODEL_PID=$!
fi

# 1. kernel vs reference, real shapes
(cd / && timeout "$(cap 120)" python3 "$REPO/tests/gpu/plt_triton_check.py") >"$L/plt_triton_check.log" 2>&1
rc=$?
say "1 kernel check: rc=$rc $(grep -E '^PLT_TRITON' "$L/plt_triton_check.log") $(now)"
grep -E '^(case|dispatch)' "$L/plt_triton_check.log" | sed 's/^/  /' | tee -a "$SUM"
grep -q '^PLT_TRITON' "$L/plt_triton_check.log" || tail -15 "$L/plt_triton_check.log" | sed 's/^/  | /' | tee -a "$SUM"
check kernel $rc

# 2. loss benchmark (time and peak memory vs megatron's CE and fused CE)
(cd / && timeout "$(cap 150)" python3 "$REPO/benchmarks/loss/plt_loss_bench.py" --iters 20 --warmup 3 --skip ce_xK \
  --json "$OUT/plt_loss_bench.json") >"$L/plt_loss_bench.log" 2>&1
rc=$?
say "2 loss bench: rc=$rc $(now)"
sed -n '/^PLT loss benchmark/,$p' "$L/plt_loss_bench.log" | grep -v '^\[bench\] wrote' | sed 's/^/  /' | tee -a "$SUM"
check loss-bench $rc

# 3. throughput
if [ $TPUT = 1 ]; then
  wait "$MODEL_PID"
  say "3 model: $(grep -E '^(model|rc)' "$L/make_model.log" | tr '\n' ' ') $(now)"
  BUDGET=$(left) MODEL_DIR=$MODEL TPUT_WORK=$W/tput ROUNDS=${ROUNDS:-1} ROUNDS_M8=${ROUNDS_M8:-0} ITERS=${ITERS:-14} \
    WARM=${WARM:-6} PROFILE_STEP=${PROFILE_STEP:-14} bash benchmarks/throughput/throughput_1b.sh >"$L/throughput.log" 2>&1
  rc=$?
  say "3 throughput: rc=$rc $(now)"
  grep -E '^(TPUT|  |data:)' "$L/throughput.log" | sed 's/^/  /' | tee -a "$SUM"
  check throughput $rc
  cp "$W"/tput/runs/*.log "$L/" 2>/dev/null
  cp -r "$W/tput/probes" "$L/" 2>/dev/null
else
  skip throughput "set TOKENIZER_DIR (a dir with the Llama-3 tokenizer.json) and TEXT (an English .txt file)"
fi
tar czf "$OUT/logs.tgz" -C "$W" logs
finish
