#!/usr/bin/env bash
# `megatron pt` tokens/s of PLT on two families, 1 GPU, random init: a dense Qwen3-1.7B (published config.json) and
# the Qwen3-30B-A3B cut to 4 layers (128 experts, top-8; tests/gpu/make_family_configs.py); with HYBRID=NAME also a
# Gated-DeltaNet hybrid (qwen3-next-80b-a3b-cut: 4 layers, 3 Gated DeltaNet + 1 gated attention, 128 experts,
# top-10; label `hybrid`). Per model two runs:
#   LABEL_stock: --model_type <family> with the plugin off (SWIFT_PLT_DISABLE=1), --max_length 2048
#   LABEL_plt4 : --model_type <family> --patch_size 4, --max_length 8192 (the same 2048 positions per sequence)
# in ROUNDS rounds, interleaved in one launcher: dense_stock dense_plt4 moe_stock moe_plt4, then again (A B A B per
# model). bf16, fused attention, --packing true, MBS 1, GBS 8, --template default; the text is the tiny tokenizer's
# (only token counts matter here). Pipelined like throughput_1b.sh (tput_launch.py: start-ups overlap, one run at a
# time on the GPU; step_probe/ times every step after a torch.cuda.synchronize()).
# Figures (families_summary.py): tokens/s = GBS * max_length / median step time of steps WARM+1..ITERS, also from
# ms-swift's logged train_speed(s/it); the plt4/stock ratio per round and its median; the noise floor = the spread
# of each run over the rounds. TPUT lines, $OUT/families_throughput.json.
#
#   bash benchmarks/throughput/families.sh           (repo root or anywhere; a GPU machine)
#   DENSE= MOE= HYBRID=qwen3-next-80b-a3b-cut bash benchmarks/throughput/families.sh    (the hybrid alone)
#   DENSE= MOE= FAMILIES=glm-4-9b-0414-cut,olmoe-1b-7b-cut bash benchmarks/throughput/families.sh  (any cuts, by name)
# ~4 min on an H100 (8 runs of ~20-35 s on the GPU after ~40 s of start-up; models made first if missing, ~30 s).
# env: MODELS_DIR (make_family_configs.py's --out; the two models are made there if missing; default $TPUT_WORK/models),
#      DENSE (qwen3-1.7b; or qwen2.5-1.5b; empty: skip), MOE (qwen3-30b-a3b-cut; empty: skip), HYBRID (empty: skip;
#      qwen3-next-80b-a3b-cut), FAMILIES (comma list of further make_family_configs.py names, each its own label),
#      ROUNDS (2), ITERS (8), WARM (3), MBS (1), GBS (8), RUN_TIMEOUT (150 s a run may hold
#      the GPU), BUDGET (290 s from the start; the launcher gives no turn with less than TURN_SECS (40) left and kills
#      everything at BUDGET - 10 s), LOOKAHEAD (3), OUT (/tmp/plt_tput_families_out), TPUT_WORK
#      (/tmp/plt_tput_families), EXTRA_ARGS (appended to every megatron pt), NPROC (GPUs of every run, 1; the
#      layout's flags in EXTRA_ARGS), SWIFT_PLT_GPU_ENV (sourced first),
#      RUNS (run names, default LABEL_stock LABEL_plt4 per model; LABEL_plt1 adds the plugin at K=1), PROFILE_STEP
#      (n: step n of the first round's runs under torch.profiler; the summary prints K=4 against plt1, else stock),
#      WARMUP (1: one unmeasured run of the first name before round 1, e.g. to fill a cold Triton cache).
set -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 1
T0=$(date +%s.%N)
OUT=${OUT:-/tmp/plt_tput_families_out}
W=${TPUT_WORK:-/tmp/plt_tput_families}
mkdir -p "$OUT" "$W/runs" "$W/probes"
ROUNDS=${ROUNDS:-2} ITERS=${ITERS:-8} WARM=${WARM:-3} MBS=${MBS:-1} GBS=${GBS:-8} BUDGET=${BUDGET:-290}
LOOKAHEAD=${LOOKAHEAD:-3} TURN_SECS=${TURN_SECS:-40}
DENSE=${DENSE-qwen3-1.7b} MOE=${MOE-qwen3-30b-a3b-cut} HYBRID=${HYBRID:-}
MODELS_DIR=${MODELS_DIR:-$W/models}
export SWIFT_PLT_REPORT_DOCS=${SWIFT_PLT_REPORT_DOCS:-200} # the plugin's K>1 data report: 200 documents, not all

# shellcheck disable=SC1090
[ -n "${SWIFT_PLT_GPU_ENV:-}" ] && source "$SWIFT_PLT_GPU_ENV"
command -v megatron >/dev/null 2>&1 || { echo "TPUT: megatron (ms-swift[megatron]) not found"; exit 1; }
if ! (cd /tmp && python3 -c "import swift_plt.plugin.import_hook as a; assert a._finder is not None") 2>/dev/null; then
  python3 -m pip install --no-deps --no-build-isolation --no-index . >"$OUT/tput_pip.log" 2>&1 ||
    python3 -m pip install --no-deps --no-build-isolation --no-index --break-system-packages . >>"$OUT/tput_pip.log" 2>&1
fi

# ---- the two models (unless MODELS_DIR has them), then the text: the tiny tokenizer's sentences, as jsonl rows
missing=() FAMILY_ARGS=()
[ -n "$DENSE" ] && FAMILY_ARGS+=(--family "dense=$MODELS_DIR/$DENSE")
[ -n "$MOE" ] && FAMILY_ARGS+=(--family "moe=$MODELS_DIR/$MOE")
[ -n "$HYBRID" ] && FAMILY_ARGS+=(--family "hybrid=$MODELS_DIR/$HYBRID")
FURTHER=${FAMILIES//,/ }
for n in $FURTHER; do FAMILY_ARGS+=(--family "$n=$MODELS_DIR/$n"); done
for n in $DENSE $MOE $HYBRID $FURTHER; do
  ls "$MODELS_DIR/$n"/*.safetensors >/dev/null 2>&1 && [ -f "$MODELS_DIR/$n/tokenizer.json" ] || missing+=("$n")
done
if [ ${#missing[@]} -gt 0 ]; then
  t=$SECONDS
  python3 tests/gpu/make_family_configs.py --out "$MODELS_DIR" --only "$(IFS=,; echo "${missing[*]}")" \
    >"$OUT/make_models.log" 2>&1 || { echo "TPUT model creation failed"; tail -5 "$OUT/make_models.log"; exit 1; }
  echo "TPUT models ${missing[*]} made in $((SECONDS - t)) s:" \
    "$(grep -E ' B params ' "$OUT/make_models.log" | cut -d';' -f1 | tr '\n' ' ')"
fi
python3 - "$W/text.txt" <<'EOF' || { echo "TPUT text creation failed"; exit 1; }
import sys
from swift_plt.tools.tiny import sentences
s = sentences(40000, seed=1)
with open(sys.argv[1], 'w', encoding='utf-8') as f:
    f.write('\n\n'.join(' '.join(s[i:i + 8]) for i in range(0, len(s), 8)))
EOF
python3 benchmarks/throughput/make_text_jsonl.py "$W/text.txt" "$W/text.jsonl" --repeat 1 | sed 's/^/TPUT data: /'

ELAPSED=$(python3 -c "import time; print(time.time() - $T0)")
echo "TPUT setup done after ${ELAPSED%.*} s"
python3 benchmarks/throughput/tput_launch.py --work "$W" "${FAMILY_ARGS[@]}" --template default --data-k1 "$W/text.jsonl" --data-k4 "$W/text.jsonl" \
  --rounds "$ROUNDS" --rounds-m8 0 --mbs "$MBS" --gbs "$GBS" --iters "$ITERS" --lookahead "$LOOKAHEAD" \
  --profile-step "${PROFILE_STEP:-0}" ${RUNS:+--names "$RUNS"} ${WARMUP:+--warmup} \
  --turn-secs "$TURN_SECS" --run-timeout "${RUN_TIMEOUT:-150}" --deadline "$(python3 -c "print($T0 + $BUDGET - 10)")" \
  --nproc "${NPROC:-1}" --extra-args="${EXTRA_ARGS:-}" ${MEGATRON:+--megatron "$MEGATRON"}
python3 benchmarks/throughput/families_summary.py "$W" --warm "$WARM" --json "$OUT/families_throughput.json"
