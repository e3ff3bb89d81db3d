#!/usr/bin/env bash
# Issue 12 in one device call (1 GPU): the fused Triton PLT loss against the torch reference on real shapes
# (tests/gpu/plt_triton_check.py), the loss benchmark (benchmarks/plt_loss_bench.py), then the throughput benchmark
# (benchmarks/throughput_1b.sh: stock / llama3_2_plt K=1 / K=4, interleaved, with the K=4 vs K=1 profiler step).
#
#   TOKENIZER_DIR=... TEXT=... bash tests/gpu/fused_loss_throughput.sh     (repo root, .gpu_kit present)
# env: BUDGET (seconds for the whole script, default 370), ROUNDS (1), ITERS (14), WARM (6), PROFILE_STEP (14).
# Seen on H100: each `megatron pt` run takes 90-110 s (start-up ~80 s), so 3 runs need ~5.5 min after the ~110 s of
# kernel check, loss bench and model creation: give it BUDGET=560 and a 600 s call, or RUNS=... FIRST_ROUND=... in
# further calls (the probes come back in logs.tgz; benchmarks/throughput_summary.py combines probe dirs).
# $OUT: 00_summary.txt (every figure), plt_loss_bench.json, throughput.json, logs.tgz (all logs, probes, profiles).
set -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 1
# shellcheck disable=SC1091
source tests/gpu/lib.sh
gpu_init /tmp/plt_issue12_out 00_summary.txt /tmp/plt_issue12 "${BUDGET:-370}"
mkdir -p "$W/logs"
L=$W/logs
say "machine: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | xargs), $(nproc) CPUs"
# shellcheck disable=SC1091
source .gpu_kit/setup_device.sh >"$L/setup_kit.log" 2>&1 || say "setup_device.sh FAILED"
install_plugin >"$L/pip_install.log" 2>&1
say "0 setup: plugin $(grep -o 'INSTALLED_BY=.*' "$L/pip_install.log" | tail -1); $(python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' 2>&1 | tail -1); $(now)"

# model (CPU, in the background while the kernel runs on the GPU)
MODEL=$W/llama32_1b
(CUDA_VISIBLE_DEVICES='' python3 benchmarks/make_llama32_1b.py "$MODEL" "$TOKENIZER_DIR" >"$L/make_model.log" 2>&1;
  echo "rc=$?" >>"$L/make_model.log") &
MODEL_PID=$!

# 1. kernel vs reference, real shapes
(cd /tmp && timeout "$(cap 120)" python3 "$REPO/tests/gpu/plt_triton_check.py") >"$L/plt_triton_check.log" 2>&1
say "1 kernel check: rc=$? $(grep -E '^PLT_TRITON' "$L/plt_triton_check.log") $(now)"
grep -E '^(case|dispatch)' "$L/plt_triton_check.log" | sed 's/^/  /' | tee -a "$SUM"
grep -q '^PLT_TRITON' "$L/plt_triton_check.log" || tail -15 "$L/plt_triton_check.log" | sed 's/^/  | /' | tee -a "$SUM"

# 2. loss benchmark (time and peak memory vs megatron's CE and fused CE)
(cd /tmp && timeout "$(cap 150)" python3 "$REPO/benchmarks/plt_loss_bench.py" --iters 20 --warmup 3 --skip ce_xK \
  --json "$OUT/plt_loss_bench.json") >"$L/plt_loss_bench.log" 2>&1
say "2 loss bench: rc=$? $(now)"
sed -n '/^PLT loss benchmark/,$p' "$L/plt_loss_bench.log" | grep -v '^\[bench\] wrote' | sed 's/^/  /' | tee -a "$SUM"

# 3. throughput
wait "$MODEL_PID"
say "3 model: $(grep -E '^(model|rc)' "$L/make_model.log" | tr '\n' ' ') $(now)"
BUDGET=$(left) MODEL_DIR=$MODEL TPUT_WORK=$W/tput ROUNDS=${ROUNDS:-1} ROUNDS_M8=${ROUNDS_M8:-0} ITERS=${ITERS:-14} WARM=${WARM:-6} \
  PROFILE_STEP=${PROFILE_STEP:-14} bash benchmarks/throughput_1b.sh >"$L/throughput.log" 2>&1
say "3 throughput: rc=$? $(now)"
grep -E '^(TPUT|  |data:)' "$L/throughput.log" | sed 's/^/  /' | tee -a "$SUM"
cp "$W"/tput/runs/*.log "$L/" 2>/dev/null
cp -r "$W/tput/probes" "$L/" 2>/dev/null
tar czf "$OUT/logs.tgz" -C "$W" logs
say "done $(now)"
