#!/usr/bin/env bash
# PLT parity on four real family shapes, one GPU, one command (summary: $OUT/summary.txt, $OUT default
# ./gpu_results/families under the current directory):
#     bash tests/gpu/families.sh
#   0. tests/gpu/make_family_configs.py: random-init HF dirs with the published config.json (bf16) of Qwen2.5-1.5B
#      (qwen2: qkv bias, tied), Qwen3-1.7B (qwen3: QK-norm), Qwen3-30B-A3B cut to 4 layers (qwen3_moe: 128 experts,
#      top-8) and DeepSeek-V3 cut to 3 layers and 16 routed experts (deepseek_v3: MLA, yarn RoPE, shared expert,
#      group-limited sigmoid routing with expert bias); tiny BPE tokenizer. Made in the background, in that order,
#      while the parity of the models before runs.
#   1. tests/gpu/parity.py per model (its own process), random token ids, B=2, S=256: the family's own HF model
#      (fp32 and fp64 on the GPU) vs `--model_type <family> --patch_size 4` (built as mcore gpt_plt), bf16/fused and
#      fp32/unfused; K=1: gpt_plt at patch_size 1 vs the stock gpt model, bit-identical, and stock vs HF token-level
#      (at K1_PRECISIONS). One PARITY_<model> check per model.
#   2. (a benchmark: only with RUN_TPS=1 and >= TPS_MIN_LEFT s left) benchmarks/throughput/families.sh on the
#      models of step 0: tokens/s K=4 vs K=1, Qwen3-1.7B and the Qwen3-30B-A3B cut, A B A B.
# Budget: BUDGET seconds in all (default 470; ~6 min without step 2 on an H100: models ~1 min, overlapped, parity
# ~1 min a dense model and ~1.5-2.5 min a MoE one; a model past its cap is killed and counted as failed).
# env: OUT, BUDGET, FAMILIES (comma list, default all four), PARITY_CAP (s per model, 240), K1_PRECISIONS (bf16),
# PRECISIONS (bf16,fp32), PARITY_EXTRA (JSON of extra MegatronArguments fields for parity.py, e.g.
# '{"moe_grouped_gemm": false}'), FAMILY_WORK (scratch dir, emptied; the models are ~21 GB), RUN_TPS=1,
# TPS_MIN_LEFT (s, 240), SWIFT_PLT_GPU_ENV, SWIFT_PLT_GPU_DRY_RUN (lib.sh: toy widths, S=64, gloo).
set -o pipefail
set -m # background jobs get their own process group (killed whole at their deadline)

# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_init families summary.txt "${FAMILY_WORK:-/tmp/swift_plt_gpu/families}" 470 1 megatron,swift
DRY=${SWIFT_PLT_GPU_DRY_RUN:-0}
FAMILIES=${FAMILIES:-qwen2.5-1.5b,qwen3-1.7b,qwen3-30b-a3b-cut,deepseek-v3-cut}
IFS=, read -r -a NAMES <<<"$FAMILIES"
M=$W/models
MAKE_ARGS=()
PARITY_ARGS=(--random-ids --hf64-device cuda --precisions "${PRECISIONS:-bf16,fp32}"
  --k1-precisions "${K1_PRECISIONS:-bf16}")
if [ "$DRY" = 1 ]; then
  MAKE_ARGS=(--tiny --device cpu)
  PARITY_ARGS=(--random-ids --hf64-device cpu --S 64 --precisions fp32 --k1-precisions fp32 --backend gloo
    --mg-kwargs '{"use_cpu_initialization": true, "ddp_backend": "gloo"}')
fi

# ------------------------------------------------------------------------------------------- 0. models (background)
say "== 0. models: ${NAMES[*]} -> $M (make_family_configs.py, in the background), $(now)"
python3 tests/gpu/make_family_configs.py --out "$M" --only "$FAMILIES" --json "$OUT/models.json" "${MAKE_ARGS[@]}" \
  >"$OUT/make_models.log" 2>&1 &
MAKE_PID=$!
model_ready() { # model_ready NAME: wait until make_family_configs.py reports NAME written (or has exited)
  while ! grep -q "^model: $1 " "$OUT/make_models.log" 2>/dev/null; do
    kill -0 "$MAKE_PID" 2>/dev/null || { grep -q "^model: $1 " "$OUT/make_models.log"; return; }
    [ "$(left)" -le 5 ] && return 1
    sleep 1
  done
}

# ------------------------------------------------------------------------------------------------ 1. parity per model
PORT=29751
for name in "${NAMES[@]}"; do
  if ! model_ready "$name"; then
    say "-- $name: model not written ($(tail -2 "$OUT/make_models.log" | tr '\n' ' '))"
    check "PARITY_$name" 1
    continue
  fi
  say "-- $name: $(grep -E "^$name: " "$OUT/make_models.log" | head -1 | cut -d';' -f1); parity, $(now)"
  t=$SECONDS
  timeout -k 10 "$(cap "${PARITY_CAP:-240}")" python3 tests/gpu/parity.py --model "$M/$name" --port "$PORT" \
    --json "$OUT/parity_$name.json" "${PARITY_ARGS[@]}" ${PARITY_EXTRA:+--mg-kwargs "$PARITY_EXTRA"} \
    >"$OUT/parity_$name.log" 2>&1
  rc=$?
  PORT=$((PORT + 1))
  grep -E '^PARITY' "$OUT/parity_$name.log" | tee -a "$SUM"
  grep -qE '^PARITY summary' "$OUT/parity_$name.log" ||
    say "   parity did not finish (rc=$rc, $((SECONDS - t)) s); last lines:" \
      "$(tail -3 "$OUT/parity_$name.log" | tr '\n' ' ')"
  say "   $name: rc=$rc in $((SECONDS - t)) s"
  check "PARITY_$name" $rc
done
kill -- -"$MAKE_PID" 2>/dev/null
wait "$MAKE_PID" 2>/dev/null

# ------------------------------------------------------------------------------------- 2. tokens/s (optional)
if [ "$DRY" = 1 ]; then
  skip tokens-per-s "dry run: CUDA only"
elif [ "${RUN_TPS:-0}" = 1 ] && [ "$(left)" -ge "${TPS_MIN_LEFT:-240}" ]; then
  say "== 2. tokens/s K=4 vs K=1, qwen3-1.7b and qwen3-30b-a3b-cut (benchmarks/throughput/families.sh), $(now)"
  MODELS_DIR=$M OUT=$OUT/tps TPUT_WORK=$W/tps BUDGET=$(($(left) - 10)) \
    bash benchmarks/throughput/families.sh >"$OUT/tokens_per_s.log" 2>&1
  rc=$?
  grep -E '^TPUT (ratio|[a-z0-9.-]+ (stock|plt4) )' "$OUT/tokens_per_s.log" | tee -a "$SUM"
  [ $rc = 0 ] || say "   tokens/s rc=$rc; log tail: $(tail -3 "$OUT/tokens_per_s.log" | tr '\n' ' ')"
  check tokens-per-s $rc
else
  skip tokens-per-s "a benchmark: RUN_TPS=1 runs it (${TPS_MIN_LEFT:-240} s needed, $(left) s left)"
fi

say "== done, $(now), logs in $OUT"
finish
