#!/usr/bin/env bash
# PLT parity on real family shapes, one command, one GPU or several side by side (summary: $OUT/summary.txt, $OUT
# default ./gpu_results/families under the current directory):
#     bash tests/gpu/families.sh                                    # the default group, one H100, ~6 min
#     FAMILIES=qwen1.5-moe-a2.7b-cut,glm-4.5-air-cut,glm-4.7-flash-cut,deepseek-v2-lite-cut bash tests/gpu/families.sh
#     FAMILIES=llama-3.2-1b,ernie-4.5-21b-a3b-cut,ernie-4.5-0.3b,dots.llm1-cut,kimi-k2-cut bash tests/gpu/families.sh
#     FAMILIES=hybrid bash tests/gpu/families.sh                      # the Gated-DeltaNet hybrids, one H100
#     NGPU=2 FAMILIES=new bash tests/gpu/families.sh                  # mcore-bridge's own decoder types, 2 GPUs, ~7 min
#     NGPU=1 FAMILIES=qwen3-vl-8b-cut bash tests/gpu/families.sh      # one family of a group, by name
#   (the two before hybrid ~5 min each on 2 GPUs; FAMILIES=more runs those nine, FAMILIES=all the twenty-three)
#   0. tests/gpu/make_family_configs.py: random-init HF dirs with the published config.json (bf16), layers and
#      experts cut to one 80 GB GPU; tiny BPE tokenizer. Groups: `default` = Qwen2.5-1.5B (qwen2: qkv bias, tied),
#      Qwen3-1.7B (qwen3: QK-norm), Qwen3-30B-A3B cut to 4 layers (qwen3_moe: 128 experts, top-8) and DeepSeek-V3 cut
#      to 3 layers and 16 routed experts (deepseek_v3: MLA, yarn RoPE, shared expert, group-limited sigmoid routing
#      with expert bias); `more` = Qwen1.5-MoE-A2.7B (qwen2_moe: gated shared expert), GLM-4.5-Air (glm4_moe: partial
#      rotary), GLM-4.7-Flash (glm4_moe_lite: MLA), DeepSeek-V2-Lite (deepseek_v2: MLA without q-LoRA, softmax
#      routing), Llama-3.2-1B (llama: llama3 RoPE scaling), ERNIE-4.5-21B-A3B and -0.3B (ernie4_5_moe, ernie4_5:
#      interleaved rotary), dots.llm1 (dots1) and Kimi-K2 as its DeepSeek-V3 architecture; `hybrid` = Qwen3-Next-80B-A3B
#      cut to 4 layers (3 Gated DeltaNet + 1 gated attention) and 128 experts (qwen3_next), Qwen3.5-27B and
#      Qwen3.5-35B-A3B (qwen3_5 / qwen3_5_moe: multimodal checkpoints, their language model cut the same way, 128
#      experts, one small vision block); `new` = gpt-oss-20b (gpt_oss: sliding window, attention sinks), OLMoE-1B-7B
#      (olmoe), GLM-4-9B-0414 (glm4), MiniMax-M2 (minimax_m2), Hy3-preview (hy_v3, Hunyuan-V3), Ling-mini-2.0
#      (bailing_moe, Ling 2.0: its HF side tests/harness/bailing_moe.py), cut to 3-4 layers (MiniMax-M2 and Hy3 to 64
#      experts), and Qwen3-VL-8B (qwen3_vl: a multimodal checkpoint, its language model cut to 4 layers and run on
#      text, 3 small vision blocks for its 3 deepstack mergers); `all`. Which cut each has: make_family_configs.py.
#      Each GPU lane makes its own models in the background, in its order, while the parity of the ones before runs;
#      a model dir is deleted after its parity (KEEP_MODELS=1 keeps them; RUN_TPS=1 keeps the two it needs).
#   1. tests/gpu/parity.py per model (its own process), random token ids, B=2, S=256: the family's own HF model
#      (fp32 and fp64 on the GPU; Qwen3.5, Qwen3-VL: its language model on text; GPT-OSS's window ceil(W / K)
#      patches) vs `--model_type <family> --patch_size 4` (built as mcore gpt_plt; a family of mcore-bridge's own
#      type as <type>_plt: qwen3_next_plt / qwen3_5_plt, olmoe_plt, qwen3_vl_plt, ...), bf16/fused and
#      fp32/unfused; K=1: the PLT type at patch_size 1 vs the stock model, bit-identical, and stock vs HF
#      token-level (at K1_PRECISIONS). `timing` lines: the first forward of each model and precision against the next
#      (the first compiles the Triton kernels of a cold cache: fla's Gated DeltaNet kernels for the hybrids). With
#      LANES > 1 (default: the GPUs used) model i runs on GPU i mod LANES, the lanes side by side. One PARITY_<model>
#      check per model.
#   2. (a benchmark: only with RUN_TPS=1 and >= TPS_MIN_LEFT s left) benchmarks/throughput/families.sh on the
#      models of step 0: tokens/s K=4 vs K=1, Qwen3-1.7B and the Qwen3-30B-A3B cut, A B A B (needs both in FAMILIES).
# Budget: BUDGET seconds in all (default 470 for the default group on one GPU: models ~1 min, overlapped, parity
# ~1 min a dense model and ~1.5-2.5 min a MoE one; other runs 120 + 150 s per model of the longest lane, + 270 s
# and a cap of 420 s a model when a hybrid is among them: a cold Triton cache); a model past its cap is killed and
# counted as failed. Disk: the bf16 dirs of one run, at most (default 21 GB, more 49 GB, new 43 GB).
# env: OUT, BUDGET, FAMILIES (comma list of make_family_configs.py names or groups; default `default`), LANES,
# PARITY_CAP (s per model, 240; 420 with hybrids), K1_PRECISIONS (bf16), PRECISIONS (bf16,fp32), PARITY_EXTRA (JSON
# of extra MegatronArguments fields for parity.py, e.g. '{"moe_grouped_gemm": false}'), PARITY_FLAGS (more parity.py
# flags, split at spaces, e.g. '--hf-gdn torch': the hybrids' HF reference on transformers' torch Gated DeltaNet, no
# Triton compile; or '--hf-device cpu'), FAMILY_WORK (scratch dir, emptied),
# KEEP_MODELS=1, RUN_TPS=1, TPS_MIN_LEFT (s, 240), SWIFT_PLT_GPU_ENV, NGPU, SWIFT_PLT_GPU_DRY_RUN (lib.sh: toy
# widths, S=64, gloo; 4x the budget and caps; LANES > 1 runs lanes of CPU processes).
set -o pipefail
set -m # background jobs get their own process group (killed whole at their deadline)

BUDGET_ENV=${BUDGET:-}
# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_init families summary.txt "${FAMILY_WORK:-/tmp/swift_plt_gpu/families}" 470 1 megatron,swift
DRY=${SWIFT_PLT_GPU_DRY_RUN:-0}
FAMILIES=${FAMILIES:-default}
LIST=$(python3 tests/gpu/make_family_configs.py --list --only "$FAMILIES") || {
  say "FAMILIES=$FAMILIES: unknown names (make_family_configs.py --list)"
  check families-list 1
  finish
}
IFS=, read -r -a NAMES <<<"$LIST"
LANES=${LANES:-$NGPU}
[ "$LANES" -gt "${#NAMES[@]}" ] && LANES=${#NAMES[@]}
[ "$LANES" -gt "$NGPU" ] && [ "$DRY" != 1 ] && LANES=$NGPU
if [ -z "$BUDGET_ENV" ] && { [ "$FAMILIES" != default ] || [ "$LANES" != 1 ]; }; then
  BUDGET=$((120 + 150 * ((${#NAMES[@]} + LANES - 1) / LANES)))
fi
PCAP=${PARITY_CAP:-240}
# the hybrids: on a cold Triton cache the first one compiles and autotunes fla's Gated DeltaNet kernels (~3 min on an
# H100 in its first HF forward, ~1 min more for bf16); later ones reuse the cache (seconds)
HYBRIDS=,$(python3 tests/gpu/make_family_configs.py --list --only hybrid),
for name in "${NAMES[@]}"; do
  if [[ $HYBRIDS == *",$name,"* ]]; then
    PCAP=${PARITY_CAP:-420}
    [ -z "$BUDGET_ENV" ] && BUDGET=$((BUDGET + 270))
    break
  fi
done
if [ "$DRY" = 1 ]; then # the CPU rehearsal: toy widths, but slow CPUs
  [ -z "$BUDGET_ENV" ] && BUDGET=$((BUDGET * 4))
  PCAP=${PARITY_CAP:-960}
fi
M=$W/models
MAKE_ARGS=()
PARITY_ARGS=(--random-ids --hf64-device cuda --precisions "${PRECISIONS:-bf16,fp32}"
  --k1-precisions "${K1_PRECISIONS:-bf16}")
if [ "$DRY" = 1 ]; then
  MAKE_ARGS=(--tiny --device cpu)
  PARITY_ARGS=(--random-ids --hf64-device cpu --S 64 --precisions fp32 --k1-precisions fp32 --backend gloo
    --mg-kwargs '{"use_cpu_initialization": true, "ddp_backend": "gloo"}')
fi
read -r -a PARITY_FLAGS_A <<<"${PARITY_FLAGS:-}"
PARITY_ARGS+=("${PARITY_FLAGS_A[@]}")
say "== ${#NAMES[@]} models (${NAMES[*]}) on $LANES GPU lane(s), budget ${BUDGET} s, $(now)"

lane_models() { # lane_models LANE: the names lane LANE runs, in order
  local i
  for ((i = $1; i < ${#NAMES[@]}; i += LANES)); do echo "${NAMES[$i]}"; done
}
keep_model() { # keep_model NAME: whether NAME's dir stays after its parity
  [ "${KEEP_MODELS:-0}" = 1 ] && return 0
  [ "${RUN_TPS:-0}" = 1 ] && { [ "$1" = qwen3-1.7b ] || [ "$1" = qwen3-30b-a3b-cut ]; }
}
model_ready() { # model_ready LANE NAME: wait until the lane's maker reports NAME written (or has exited)
  local log=$OUT/make_models_$1.log pid
  pid=$(cat "$OUT/make_models_$1.pid")
  while ! grep -q "^model: $2 " "$log" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || { grep -q "^model: $2 " "$log"; return; }
    [ "$(left)" -le 5 ] && return 1
    sleep 1
  done
}
run_lane() { # run_lane LANE: make the lane's models (background) and run their parity one after another
  local lane=$1 names name t rc port=$((29751 + 20 * $1)) gpu
  mapfile -t names < <(lane_models "$lane")
  gpu=$(dev "$lane")
  CUDA_VISIBLE_DEVICES=$gpu python3 tests/gpu/make_family_configs.py --out "$M" --only "$(IFS=,; echo "${names[*]}")" \
    --json "$OUT/models_$lane.json" "${MAKE_ARGS[@]}" >"$OUT/make_models_$lane.log" 2>&1 &
  echo $! >"$OUT/make_models_$lane.pid"
  for name in "${names[@]}"; do
    if ! model_ready "$lane" "$name"; then
      echo "-- $name: model not written ($(tail -2 "$OUT/make_models_$lane.log" | tr '\n' ' '))" >"$OUT/note_$name"
      echo "1 0 $lane" >"$OUT/rc_$name"
      continue
    fi
    echo "-- $name: parity on GPU lane $lane (CUDA_VISIBLE_DEVICES=$gpu), $(now)"
    t=$SECONDS
    CUDA_VISIBLE_DEVICES=$gpu timeout -k 10 "$(cap "$PCAP")" python3 tests/gpu/parity.py \
      --model "$M/$name" --port "$port" --json "$OUT/parity_$name.json" "${PARITY_ARGS[@]}" \
      ${PARITY_EXTRA:+--mg-kwargs "$PARITY_EXTRA"} >"$OUT/parity_$name.log" 2>&1
    echo "$? $((SECONDS - t)) $lane" >"$OUT/rc_$name"
    port=$((port + 1))
    keep_model "$name" || rm -rf "${M:?}/$name"
  done
  kill "$(cat "$OUT/make_models_$lane.pid")" 2>/dev/null # done with its models or out of time
  wait
}

# -------------------------------------------------------------------------------------- 0./1. models and parity
for ((lane = 0; lane < LANES; lane++)); do
  say "   lane $lane: $(lane_models "$lane" | tr '\n' ' ')"
  run_lane "$lane" &
done
wait
for name in "${NAMES[@]}"; do # the lanes' results, in FAMILIES order
  rc=1 secs=0 lane=?
  [ -f "$OUT/rc_$name" ] && read -r rc secs lane <"$OUT/rc_$name"
  [ -f "$OUT/note_$name" ] && say "$(cat "$OUT/note_$name")"
  say "-- $name (lane $lane): $(grep -hE "^$name: " "$OUT"/make_models_*.log 2>/dev/null | head -1 | cut -d';' -f1)"
  grep -E '^PARITY' "$OUT/parity_$name.log" 2>/dev/null | tee -a "$SUM"
  grep -qE '^PARITY summary' "$OUT/parity_$name.log" 2>/dev/null ||
    say "   parity did not finish (rc=$rc, $secs s); last lines:" \
      "$(tail -3 "$OUT/parity_$name.log" 2>/dev/null | tr '\n' ' ')"
  say "   $name: rc=$rc in $secs s"
  check "PARITY_$name" "$rc"
done

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
