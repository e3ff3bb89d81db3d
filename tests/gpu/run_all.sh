#!/usr/bin/env bash
# swift-plt GPU checks, one command, on an `nvidia-h200-x2` device machine, from the repo root:
#     bash tests/gpu/run_all.sh          (device tool: carry=['.gpu_kit'], $OUT set by it)
# Writes every log to $OUT and the results to $OUT/summary.txt (appended as each step finishes, so a run cut short
# still leaves its partial summary). Every step is guarded: one failure does not stop the rest.
#   0. setup: source .gpu_kit/setup_device.sh; pip-install this repo into the interpreter's site-packages (the .pth
#      startup hook needs a real site dir); tiny Llama (+ tokenizer + jsonl) with .gpu_kit/make_tiny_llama.py
#   1. (1-GPU runs, all at once on GPU 0/1)
#      a. PLT K=4, THD (padding_free default), 60 iters; 10-iter variants --padding_free false and --packing true
#      b. 1-GPU reference for (2): PLT K=4, 10 iters
#      c. K=1 identity: llama3_2_plt --patch_size 1 vs stock --model_type llama with the plugin disabled
#         (SWIFT_PLT_DISABLE=1, i.e. upstream ms-swift), plus a repeat of the stock run (run-to-run determinism)
#   2. (2 GPUs) b. TP=2 and PP=2, same data/seed/global batch as the 1-GPU reference; plus d. parity.py (GPU 0/1)
#   3. e. benchmarks/plt_loss_bench.py on an idle GPU
#   4. (if >= TPS_MIN_LEFT s remain and SKIP_TPS != 1) benchmarks/tokens_per_s.sh (1B-shaped model, K=4 vs K=1)
# Budget: BUDGET seconds in all (default 560, under the device tool's 600 s per command).
# env: BUDGET, PHASE1_CAP/PHASE2_CAP/PHASE3_CAP (s), SKIP_TPS=1, TPS_MIN_LEFT (s), PLT_WORK (scratch dir),
#      EXTRA_PT_ARGS (appended to every `megatron pt` command line; the last flag wins, e.g. for a CPU dry run).
set -o pipefail
set -m # every background job gets its own process group, so a job past its deadline can be killed whole

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 1
# shellcheck disable=SC1091
source tests/gpu/lib.sh # gpu_init, left, cap, say, now, install_plugin
gpu_init /tmp/plt_gpu_out summary.txt "${PLT_WORK:-/tmp/plt_gpu}" 560
SUMPY="env LOGDIR=$OUT python3 $REPO/tests/gpu/summarize.py"

JOBS=()
launch() { "$@" & JOBS+=($!); }
wait_jobs() { # wait_jobs CAP_S: wait for the launched jobs; kill (whole process groups) what runs past CAP_S
  local deadline=$((SECONDS + $(cap "$1"))) p alive
  while :; do
    alive=0
    for p in "${JOBS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    if [ $SECONDS -ge $deadline ]; then
      say "   !! deadline ($1 s cap, $(now)): killing the jobs still running"
      for p in "${JOBS[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done
      sleep 10
      for p in "${JOBS[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done
      break
    fi
    sleep 2
  done
  wait "${JOBS[@]}" 2>/dev/null
  JOBS=()
}

# ------------------------------------------------------------------------------------------------------ 0. setup
rev=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null) && { git -C "$REPO" diff --quiet HEAD 2>/dev/null || rev="$rev+dirty"; }
say "== swift-plt GPU checks, $(date -u +%FT%TZ), repo ${rev:-(no git)}, swift_plt $(grep -o "__version__ = '[^']*'" swift_plt/__init__.py)"
say "machine: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | xargs), $(nproc) CPUs"
# shellcheck disable=SC1091
if ! source .gpu_kit/setup_device.sh >"$OUT/setup_kit.log" 2>&1; then
  say "0 setup: FAILED to source .gpu_kit/setup_device.sh (see setup_kit.log); stopping"
  exit 1
fi
install_plugin >"$OUT/pip_install.log" 2>&1
how=$(grep -o 'INSTALLED_BY=.*' "$OUT/pip_install.log" | tail -1)
hook=$(cd /tmp && python3 -c "
import swift_plt, swift_plt.plugin.import_hook as a
print(('startup hook ACTIVE' if a._finder is not None else 'startup hook INACTIVE'), 'from', swift_plt.__file__)" 2>&1 |
  tail -1)
say "0 setup: kit ok ($(grep -o 'ready in [0-9]* s' "$OUT/setup_kit.log" || echo 'already installed')); plugin ${how:-NOT INSTALLED (see pip_install.log)}; $hook; $(now)"
python3 .gpu_kit/make_tiny_llama.py --out "$W/tiny" --max-pos 2048 >"$OUT/make_tiny.log" 2>&1
say "0 tiny model: rc=$? $(grep -E '^model:' "$OUT/make_tiny.log" | head -1); $(now)"
TINY=$W/tiny

# ------------------------------------------------------------------------------------------------ megatron pt runs
COMMON=(--model "$TINY/model" --template llama --dataset "$TINY/data/train.jsonl" --max_length 256
  --attention_backend fused --micro_batch_size 2 --global_batch_size 4 --seed 42
  --lr 1e-3 --min_lr 1e-4 --lr_warmup_iters 2 --bf16 true --logging_steps 1
  --save_steps 1000000 --no_save_optim true --no_save_rng true
  --dataloader_num_workers 2 --dataset_num_proc 4 --report_to tensorboard)
PLT=(--model_type llama3_2_plt --custom_register_path custom_model/llama.py)

pt() { # pt NAME GPUS NPROC PORT [VAR=VALUE ...] -- megatron-pt-args...
  local name=$1 gpus=$2 nproc=$3 port=$4 envs=() od f t=$SECONDS rc
  shift 4
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  od=$W/runs/$name
  mkdir -p "$od" "$W/cache/$name"
  # own dataset caches: concurrent runs must not race on the same datasets cache files
  env "${envs[@]}" CUDA_VISIBLE_DEVICES="$gpus" NPROC_PER_NODE="$nproc" MASTER_PORT="$port" \
    HF_DATASETS_CACHE="$W/cache/$name/hf" MODELSCOPE_CACHE="$W/cache/$name/ms" \
    megatron pt "${COMMON[@]}" --output_dir "$od" "$@" ${EXTRA_PT_ARGS:-} >"$OUT/$name.log" 2>&1
  rc=$?
  echo $rc >"$od/rc"
  echo $((SECONDS - t)) >"$od/secs"
  f=$(ls "$od"/*/logging.jsonl 2>/dev/null | head -1)
  [ -n "$f" ] && cp "$f" "$OUT/$name.logging.jsonl"
  return $rc
}
R=$W/runs

# ------------------------------------------------------------------------------------- 1. all 1-GPU runs at once
say "== 1: 1-GPU megatron pt runs (7 at once on GPUs 0/1), $(now)"
launch pt a_main 0 1 29601 -- "${PLT[@]}" --patch_size 4 --train_iters 60
launch pt a_nopf 0 1 29602 -- "${PLT[@]}" --patch_size 4 --train_iters 10 --padding_free false
launch pt a_pack 1 1 29603 -- "${PLT[@]}" --patch_size 4 --train_iters 10 --packing true
launch pt b_ref 1 1 29604 -- "${PLT[@]}" --patch_size 4 --train_iters 10
launch pt c_plt1 0 1 29605 -- "${PLT[@]}" --patch_size 1 --train_iters 10
launch pt c_stock 1 1 29606 SWIFT_PLT_DISABLE=1 -- --model_type llama --train_iters 10
launch pt c_stock_rep 0 1 29607 SWIFT_PLT_DISABLE=1 -- --model_type llama --train_iters 10
wait_jobs "${PHASE1_CAP:-300}"
say "-- a. PLT K=4 training curves ($(now))"
$SUMPY curve "a.main    K=4 THD (padding_free default), 60 it" "$R/a_main" "$OUT/a_main.log" 2>&1 | tee -a "$SUM"
$SUMPY curve "a.nopf    K=4 --padding_free false, 10 it" "$R/a_nopf" "$OUT/a_nopf.log" 2>&1 | tee -a "$SUM"
$SUMPY curve "a.packing K=4 --packing true, 10 it" "$R/a_pack" "$OUT/a_pack.log" 2>&1 | tee -a "$SUM"
say "-- c. K=1 identity (exact printed loss/grad_norm strings, 10 steps)"
$SUMPY same "llama3_2_plt --patch_size 1=$R/c_plt1" "stock llama (SWIFT_PLT_DISABLE)=$R/c_stock" 2>&1 | tee -a "$SUM"
$SUMPY same "control: stock llama=$R/c_stock" "stock llama repeat=$R/c_stock_rep" 2>&1 | tee -a "$SUM"

# -------------------------------------------------------------------------------- 2. TP=2 / PP=2 and parity.py
say "== 2: TP=2, PP=2 (2 GPUs each, both at once) and parity.py, $(now)"
launch pt b_tp2 0,1 2 29611 -- "${PLT[@]}" --patch_size 4 --train_iters 10 --tensor_model_parallel_size 2
launch pt b_pp2 0,1 2 29612 -- "${PLT[@]}" --patch_size 4 --train_iters 10 --pipeline_model_parallel_size 2
TRAINED=$(ls -d "$R"/a_main/*/checkpoint-60 2>/dev/null | head -1)
PARITY_MODELS=(--model "$TINY/model" --tag tiny-random-init)
if [ -n "$TRAINED" ] && [ -f "$TRAINED/config.json" ] && ls "$TRAINED"/*.safetensors >/dev/null 2>&1; then
  PARITY_MODELS+=(--model "$TRAINED" --tag tiny-after-60-PLT-steps)
fi
run_parity() {
  CUDA_VISIBLE_DEVICES=1 python3 tests/gpu/parity.py "${PARITY_MODELS[@]}" --data "$TINY/data/train.jsonl" \
    --patch-size 4 --port 29621 --json "$OUT/parity.json" >"$OUT/parity.log" 2>&1
  echo $? >"$W/parity.rc"
}
launch run_parity
wait_jobs "${PHASE2_CAP:-200}"
say "-- b. TP/PP vs 1 GPU (PLT K=4, same data/seed/GBS 4, 10 it; bf16 tolerance on step-1 loss)"
$SUMPY compare 5e-3 "1GPU=$R/b_ref" "TP2=$R/b_tp2" "PP2=$R/b_pp2" 2>&1 | tee -a "$SUM"
for n in b_tp2 b_pp2; do $SUMPY curve "   $n curve" "$R/$n" "$OUT/$n.log" 2>&1 | tee -a "$SUM"; done
say "-- d. parity (rc=$(cat "$W/parity.rc" 2>/dev/null || echo killed); models: ${PARITY_MODELS[*]})"
grep -E '^PARITY' "$OUT/parity.log" | tee -a "$SUM"
grep -qE '^PARITY summary' "$OUT/parity.log" || say "   parity did not finish; last lines: $(tail -3 "$OUT/parity.log" | tr '\n' ' ')"

# ----------------------------------------------------------------------------------------------- 3. loss bench
say "== 3: e. PLT loss benchmark (1 idle GPU), $(now)"
run_bench() {
  CUDA_VISIBLE_DEVICES=0 python3 benchmarks/plt_loss_bench.py >"$OUT/plt_loss_bench.log" 2>&1
  echo $? >"$W/bench.rc"
}
launch run_bench
wait_jobs "${PHASE3_CAP:-150}"
say "   rc=$(cat "$W/bench.rc" 2>/dev/null || echo killed)"
[ "$(cat "$W/bench.rc" 2>/dev/null)" = 0 ] || say "   bench log tail: $(grep -v -i warn "$OUT/plt_loss_bench.log" | tail -3 | tr '\n' ' ')"
sed -n '/^PLT loss benchmark/,$p' "$OUT/plt_loss_bench.log" | grep -v '^\[bench\] wrote' | tee -a "$SUM"

# ------------------------------------------------------------------------------------- 4. tokens/s (optional)
if [ "${SKIP_TPS:-0}" != 1 ] && [ "$(left)" -ge "${TPS_MIN_LEFT:-180}" ]; then
  say "== 4: tokens/s, 1B-shaped Llama, K=4 S=8192 vs K=1 S=2048 (benchmarks/tokens_per_s.sh), $(now)"
  run_tps() {
    TPS_WORK=$W/tps TINY_MODEL=$TINY/model bash benchmarks/tokens_per_s.sh >"$OUT/tokens_per_s.log" 2>&1
    echo $? >"$W/tps.rc"
  }
  launch run_tps
  wait_jobs $(($(left) - 5))
  say "   rc=$(cat "$W/tps.rc" 2>/dev/null || echo killed)"
  [ "$(cat "$W/tps.rc" 2>/dev/null)" = 0 ] || say "   tokens_per_s log tail: $(tail -3 "$OUT/tokens_per_s.log" | tr '\n' ' ')"
  grep -E '^TPS' "$OUT/tokens_per_s.log" | tee -a "$SUM"
else
  say "== 4: tokens/s skipped (SKIP_TPS=${SKIP_TPS:-0}; $(left) s of the budget left, needs ${TPS_MIN_LEFT:-180})"
fi

say "== done, $(now), logs in \$OUT: $(ls "$OUT" | wc -l) files"
exit 0
