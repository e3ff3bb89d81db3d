#!/usr/bin/env bash
# `megatron pt` throughput the way users train: a random-init model with the exact Llama-3.2-1B config.json (llama3
# RoPE scaling, tied embeddings), the real Llama-3 tokenizer, English text, --packing true, MBS 4 / GBS 16, fused
# attention, bf16, 1 GPU. Three runs, interleaved ROUNDS times (A B C A B C ...):
#   A stock : --model_type llama, SWIFT_PLT_DISABLE=1 (the plugin off), --max_length 2048
#   B plt1  : --model_type llama3_2_plt --patch_size 1, --max_length 2048
#   C plt4  : --model_type llama3_2_plt --patch_size 4, --max_length 8192 (the same 2048 positions per sequence)
# Timing: benchmarks/step_probe (sitecustomize, first on PYTHONPATH) records the end of every train_step after a
# torch.cuda.synchronize(); step time = median of the intervals over steps WARM+1..ITERS; the process exits after
# step ITERS (no final save). tokens/s = GBS * max_length / step time (sequence slots; packed rows are full up to
# the last document that fits). Probes in $TPUT_WORK/probes; figures in $OUT/throughput.json and TPUT lines.
# The first round of B and C runs step PROFILE_STEP under torch.profiler (default: the last step, after the timed ones).
#
#   bash benchmarks/throughput_1b.sh     (device machine, repo root)
# env: OUT, TPUT_WORK (/tmp/plt_tput), TOKENIZER_DIR (dir with tokenizer.json of Llama-3; required), TEXT (a .txt;
#      default /work/shared/data/pd_extract_2mb.txt), ROUNDS (2), ITERS (18), WARM (8), MBS (4), GBS (16),
#      PROFILE_STEP (ITERS: the last step, after the timed ones; a profiled step and the steps after it run slower,
#      seen on H100), RUNS ("stock plt1 plt4"), FIRST_ROUND (1: round numbers in the probe names, to add rounds from
#      another device call to the same probe dir), BUDGET (seconds; a run is not started with less than RUN_SECS (75) left and is stopped when
#      it runs out), MODEL_DIR (reuse), REPEAT (8: copies of the text)
set -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 1
OUT=${OUT:-/tmp/plt_tput_out}
mkdir -p "$OUT"
W=${TPUT_WORK:-/tmp/plt_tput}
mkdir -p "$W/runs" "$W/probes"
ROUNDS=${ROUNDS:-2} ITERS=${ITERS:-18} WARM=${WARM:-8} MBS=${MBS:-4} GBS=${GBS:-16} PROFILE_STEP=${PROFILE_STEP:-$ITERS}
FIRST_ROUND=${FIRST_ROUND:-1} RUNS=${RUNS:-stock plt1 plt4}
BUDGET=${BUDGET:-100000} RUN_SECS=${RUN_SECS:-75}
T0=$SECONDS
TEXT=${TEXT:-/work/shared/data/pd_extract_2mb.txt}
[ -f "$TOKENIZER_DIR/tokenizer.json" ] || { echo "TPUT: TOKENIZER_DIR with the Llama-3 tokenizer.json is required"; exit 1; }

if ! command -v megatron >/dev/null 2>&1; then
  # shellcheck disable=SC1091
  source .gpu_kit/setup_device.sh >"$OUT/tput_setup_kit.log" 2>&1 || { echo "TPUT setup failed"; exit 1; }
fi
if ! (cd /tmp && python3 -c "import swift_plt.activation as a; assert a._finder is not None") 2>/dev/null; then
  python3 -m pip install --no-deps --no-build-isolation --no-index . >"$OUT/tput_pip.log" 2>&1 ||
    python3 -m pip install --no-deps --no-build-isolation --no-index --break-system-packages . >>"$OUT/tput_pip.log" 2>&1
fi

# ---- model (exact Llama-3.2-1B config.json, random init, bf16) and data
MODEL=${MODEL_DIR:-$W/llama32_1b}
if [ ! -f "$MODEL/model.safetensors" ]; then
  CUDA_VISIBLE_DEVICES='' python3 benchmarks/make_llama32_1b.py "$MODEL" "$TOKENIZER_DIR" || { echo "TPUT model creation failed"; exit 1; }
fi
python3 benchmarks/make_text_jsonl.py "$TEXT" "$W/text.jsonl" --repeat "${REPEAT:-8}" | sed 's/^/data: /'

run() { # run NAME ROUND
  local name=$1 round=$2 od=$W/runs/$1_r$2 probe=$W/probes/$1_r$2.jsonl prof=0 t=$SECONDS
  local -a common=(--model "$MODEL" --template llama3_2 --dataset "$W/text.jsonl" --packing true
    --micro_batch_size "$MBS" --global_batch_size "$GBS" --train_iters "$ITERS" --lr 1e-4 --min_lr 1e-5
    --lr_warmup_iters 2 --attention_backend fused --bf16 true --seed 42 --logging_steps 1 --save_steps 1000000
    --no_save_optim true --no_save_rng true --save_safetensors false --split_dataset_ratio 0 --output_dir "$od"
    --dataloader_num_workers 2 --dataset_num_proc 8 --report_to tensorboard)
  local -a cmd env=(SWIFT_PLT_DISABLE=0)
  case $name in
    stock) cmd=(--model_type llama --max_length 2048); env=(SWIFT_PLT_DISABLE=1) ;;
    plt1) cmd=(--model_type llama3_2_plt --custom_register_path custom_model/llama.py --patch_size 1 --max_length 2048) ;;
    plt4) cmd=(--model_type llama3_2_plt --custom_register_path custom_model/llama.py --patch_size 4 --max_length 8192) ;;
  esac
  [ "$round" = "$FIRST_ROUND" ] && [ "$name" != stock ] && prof=$PROFILE_STEP
  rm -rf "$od" "$probe"
  mkdir -p "$od"
  env "${env[@]}" NPROC_PER_NODE=1 MASTER_PORT=$((29700 + RANDOM % 200)) HF_DATASETS_CACHE="$W/cache" \
    PYTHONPATH="$REPO/benchmarks/step_probe${PYTHONPATH:+:$PYTHONPATH}" STEP_PROBE_OUT="$probe" STEP_PROBE_STOP="$ITERS" \
    STEP_PROBE_PROFILE_STEP="$prof" timeout "$((BUDGET - (SECONDS - T0) - 5))" \
    megatron pt "${cmd[@]}" "${common[@]}" >"$W/runs/$1_r$2.log" 2>&1
  local rc=$?
  echo "TPUT run $name round $round: rc=$rc $((SECONDS - t)) s, $(wc -l <"$probe" 2>/dev/null || echo 0) steps probed"
  [ "$rc" = 0 ] || tail -20 "$W/runs/$1_r$2.log" | sed 's/^/  | /'
}
for r in $(seq "$FIRST_ROUND" $((FIRST_ROUND + ROUNDS - 1))); do
  for name in $RUNS; do
    if [ $((BUDGET - (SECONDS - T0))) -lt "$RUN_SECS" ]; then
      echo "TPUT skip $name round $r: budget ($((BUDGET - (SECONDS - T0))) s left)"
      continue
    fi
    run "$name" "$r"
  done
done
python3 benchmarks/throughput_summary.py "$W/probes" --warm "$WARM" --gbs "$GBS" --json "$OUT/throughput.json"
