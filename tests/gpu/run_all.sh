#!/usr/bin/env bash
# The core PLT checks on GPU, one command (from anywhere; logs and $OUT/summary.txt in $OUT, default
# ./gpu_results/run_all under the current directory):
#     bash tests/gpu/run_all.sh
# 1 GPU runs the 1-GPU part; 2 GPUs or more add the 2-GPU part. The summary is appended as each step ends, so a run
# cut short still leaves its partial summary; one failed step does not stop the rest. Last line:
# "GPU CHECKS: OK (n/n)" or "GPU CHECKS: FAIL (p/n; failed: ...)" (exit 0 / 1; 2: prerequisites missing).
#   0. prerequisites (lib.sh); tiny Llama + tokenizer + jsonl (tests/gpu/make_tiny.py)
#   1-GPU part (the megatron pt runs all at once, spread over GPUs 0 and 1 when there are two):
#     a. PLT K=4, THD (padding_free default), 60 iters; 10-iter variants --padding_free false and --packing true:
#        each loss curve must fall
#     c. K=1 identity: llama3_2_plt --patch_size 1 vs stock --model_type llama with the plugin disabled
#        (SWIFT_PLT_DISABLE=1, i.e. upstream ms-swift), all on GPU 0, deterministic algorithms: printed loss and
#        grad_norm strings identical on every step where stock = its repeat, within 1e-3 after (k1_identity.sh)
#     d. parity.py: the Megatron PLT model (llama3_2_plt) vs PatchTrain's formula on HF LlamaForCausalLM, K=1 vs
#        stock GPT (random init and after a.'s 60 steps); the other families: families.sh
#     e. benchmarks/loss/plt_loss_bench.py (time and memory of the PLT loss vs megatron's cross entropy)
#     f. (a benchmark: only with RUN_TPS=1 and >= TPS_MIN_LEFT s left) benchmarks/throughput/tokens_per_s.sh
#        (1B-shaped model, K=4 vs K=1)
#   2-GPU part: b. TP=2 and PP=2 against a 1-GPU reference run (same data/seed/global batch, 10 iters): step-1 loss
#     within 5e-3 and falling curves. With one GPU: a SKIP line.
# Budget: BUDGET seconds in all (default 560: the sequence takes ~5 min on an H100/H200; a step past its cap is
# killed whole, not waited for). env: OUT, BUDGET, NGPU (use only the first n GPUs), PHASE1_CAP/PHASE2_CAP/PHASE3_CAP
# (s), RUN_TPS=1, TPS_MIN_LEFT (s), PLT_WORK (scratch dir, emptied), EXTRA_PT_ARGS (appended to every `megatron pt`;
# the last flag wins), K1_MUTATION (appended to c.'s PLT run only: c. must then fail), SWIFT_PLT_GPU_ENV,
# SWIFT_PLT_GPU_DRY_RUN (lib.sh).
set -o pipefail
set -m # every background job gets its own process group, so a job past its deadline can be killed whole

# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
GPU_TAG="GPU CHECKS"
gpu_init run_all summary.txt "${PLT_WORK:-/tmp/swift_plt_gpu/run_all}" 560 1
SUMPY="env LOGDIR=$OUT python3 $REPO/tests/gpu/summarize.py"
DRY=${SWIFT_PLT_GPU_DRY_RUN:-0}
G1=$([ "$NGPU" -ge 2 ] && echo 1 || echo 0) # the second GPU, or the first again

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
make_tiny "$W/tiny"
rc=$?
say "0 tiny model: rc=$rc $(grep -E '^model:' "$OUT/make_tiny.log" | head -1); $(now)"
[ $rc = 0 ] || { tail -3 "$OUT/make_tiny.log" | sed 's/^/   | /' | tee -a "$SUM"; check "0.tiny-model" 1; finish; }
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
  [ "$nproc" = 1 ] && gpu_id "$gpus" >"$od/gpu"
  # own dataset caches: concurrent runs must not race on the same datasets cache files
  # shellcheck disable=SC2086
  env "${envs[@]}" CUDA_VISIBLE_DEVICES="$(dev "$gpus")" NPROC_PER_NODE="$nproc" MASTER_PORT="$port" \
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

# ------------------------------------------------------------------- 1. the 1-GPU runs at once (+ b's reference)
say "== 1-GPU part: megatron pt runs at once on GPU(s) 0$([ "$G1" = 1 ] && echo ' and 1'), $(now)"
launch pt a_main 0 1 29601 -- "${PLT[@]}" --patch_size 4 --train_iters 60
launch pt a_nopf 0 1 29602 -- "${PLT[@]}" --patch_size 4 --train_iters 10 --padding_free false
launch pt a_pack "$G1" 1 29603 -- "${PLT[@]}" --patch_size 4 --train_iters 10 --packing true
[ "$NGPU" -ge 2 ] && launch pt b_ref 1 1 29604 -- "${PLT[@]}" --patch_size 4 --train_iters 10
# c.: all three on GPU 0 (bit for bit holds on one card; across cards: k1_identity.sh)
# shellcheck disable=SC2086
# deterministic algorithms; upstream's own repeat is the control (it can differ from step ~9: k1_identity.sh)
C=(NVTE_ALLOW_NONDETERMINISTIC_ALGO=0)
CD=(--train_iters 10 --megatron_extra_kwargs '{"deterministic_mode": true}')
launch pt c_plt1 0 1 29605 "${C[@]}" -- "${PLT[@]}" --patch_size 1 "${CD[@]}" ${K1_MUTATION:-}
launch pt c_stock 0 1 29606 "${C[@]}" SWIFT_PLT_DISABLE=1 -- --model_type llama "${CD[@]}"
launch pt c_stock_rep 0 1 29607 "${C[@]}" SWIFT_PLT_DISABLE=1 -- --model_type llama "${CD[@]}"
wait_jobs "${PHASE1_CAP:-300}"
ran_ok() { for n in "$@"; do [ "$(cat "$R/$n/rc" 2>/dev/null)" = 0 ] || return 1; done; } # exit 0, not cut short
say "-- a. PLT K=4 training curves ($(now))"
$SUMPY curve "a.main    K=4 THD (padding_free default), 60 it" "$R/a_main" "$OUT/a_main.log" 2>&1 | tee -a "$SUM" &&
  ran_ok a_main
check a.main $?
$SUMPY curve "a.nopf    K=4 --padding_free false, 10 it" "$R/a_nopf" "$OUT/a_nopf.log" 2>&1 | tee -a "$SUM" &&
  ran_ok a_nopf
check a.nopf $?
$SUMPY curve "a.packing K=4 --packing true, 10 it" "$R/a_pack" "$OUT/a_pack.log" 2>&1 | tee -a "$SUM" &&
  ran_ok a_pack
check a.packing $?
say "-- c. K=1 identity (exact printed loss/grad_norm strings, 10 steps)"
$SUMPY agree 1e-3 5 "llama3_2_plt --patch_size 1=$R/c_plt1" "stock llama (SWIFT_PLT_DISABLE)=$R/c_stock" \
  "stock repeat=$R/c_stock_rep" 2>&1 | tee -a "$SUM" && ran_ok c_plt1 c_stock c_stock_rep
check c.k1-identity $?

# ------------------------------------------------------------ 2. parity.py (1 GPU) beside TP=2 / PP=2 (2 GPUs)
PARITY_MODELS=(--model-type llama3_2_plt --model "$TINY/model" --tag tiny-random-init)
TRAINED=$(ls -d "$R"/a_main/*/checkpoint-60 2>/dev/null | head -1)
if [ -n "$TRAINED" ] && [ -f "$TRAINED/config.json" ] && ls "$TRAINED"/*.safetensors >/dev/null 2>&1; then
  PARITY_MODELS+=(--model "$TRAINED" --tag tiny-after-60-PLT-steps)
fi
PARITY_ARGS=()
[ "$DRY" = 1 ] && PARITY_ARGS=(--backend gloo --mg-kwargs '{"use_cpu_initialization": true, "ddp_backend": "gloo"}')
run_parity() {
  CUDA_VISIBLE_DEVICES=$(dev "$G1") python3 tests/gpu/parity.py "${PARITY_MODELS[@]}" --data "$TINY/data/train.jsonl" \
    --patch-size 4 --port 29621 --json "$OUT/parity.json" "${PARITY_ARGS[@]}" >"$OUT/parity.log" 2>&1
  echo $? >"$W/parity.rc"
}
if [ "$NGPU" -ge 2 ]; then
  say "== 1-GPU part: d. parity.py (GPU 1), beside the 2-GPU part: b. TP=2, PP=2 (GPUs 0,1), $(now)"
  launch pt b_tp2 0,1 2 29611 -- "${PLT[@]}" --patch_size 4 --train_iters 10 --tensor_model_parallel_size 2
  launch pt b_pp2 0,1 2 29612 -- "${PLT[@]}" --patch_size 4 --train_iters 10 --pipeline_model_parallel_size 2
else
  say "== 1-GPU part: d. parity.py, $(now)"
fi
launch run_parity
wait_jobs "${PHASE2_CAP:-200}"
say "-- d. parity (rc=$(cat "$W/parity.rc" 2>/dev/null || echo killed); models: ${PARITY_MODELS[*]})"
grep -E '^PARITY' "$OUT/parity.log" | tee -a "$SUM"
grep -qE '^PARITY summary' "$OUT/parity.log" || say "   parity did not finish; last lines: $(tail -3 "$OUT/parity.log" | tr '\n' ' ')"
check d.parity "$(cat "$W/parity.rc" 2>/dev/null || echo killed)"
if [ "$NGPU" -ge 2 ]; then
  say "-- 2-GPU part: b. TP/PP vs 1 GPU (PLT K=4, same data/seed/GBS 4, 10 it; bf16 tolerance on step-1 loss)"
  for n in tp2 pp2; do
    N=$(echo $n | tr a-z A-Z)
    $SUMPY compare 5e-3 "1GPU=$R/b_ref" "$N=$R/b_$n" 2>&1 | tee -a "$SUM"
    rc=$?
    $SUMPY curve "   b_$n curve" "$R/b_$n" "$OUT/b_$n.log" 2>&1 | tee -a "$SUM" || rc=1
    ran_ok b_ref "b_$n" || rc=1
    check "b.$n" $rc
  done
else
  skip "b.tp2 b.pp2" "2-GPU part: needs 2 GPUs, $NGPU visible"
fi

# ----------------------------------------------------------------------------------------------- 3. loss bench
if [ "$DRY" = 1 ]; then
  skip e.loss-bench "dry run: CUDA only"
else
  say "== 1-GPU part: e. PLT loss benchmark (1 idle GPU), $(now)"
  run_bench() {
    CUDA_VISIBLE_DEVICES=$(dev 0) python3 benchmarks/loss/plt_loss_bench.py >"$OUT/plt_loss_bench.log" 2>&1
    echo $? >"$W/bench.rc"
  }
  launch run_bench
  wait_jobs "${PHASE3_CAP:-150}"
  say "   rc=$(cat "$W/bench.rc" 2>/dev/null || echo killed)"
  [ "$(cat "$W/bench.rc" 2>/dev/null)" = 0 ] || say "   bench log tail: $(grep -v -i warn "$OUT/plt_loss_bench.log" | tail -3 | tr '\n' ' ')"
  sed -n '/^PLT loss benchmark/,$p' "$OUT/plt_loss_bench.log" | grep -v '^\[bench\] wrote' | tee -a "$SUM"
  check e.loss-bench "$(cat "$W/bench.rc" 2>/dev/null || echo killed)"
fi

# ------------------------------------------------------------------------------------- 4. tokens/s (optional)
if [ "$DRY" = 1 ]; then
  skip f.tokens-per-s "dry run: CUDA only"
elif [ "${RUN_TPS:-0}" = 1 ] && [ "$(left)" -ge "${TPS_MIN_LEFT:-180}" ]; then
  say "== 1-GPU part: f. tokens/s, 1B-shaped Llama, K=4 S=8192 vs K=1 S=2048 (benchmarks/throughput/tokens_per_s.sh), $(now)"
  run_tps() {
    TPS_WORK=$W/tps TINY_MODEL=$TINY/model GPU_K4=$(dev 0) GPU_K1=$(dev "$G1") \
      bash benchmarks/throughput/tokens_per_s.sh >"$OUT/tokens_per_s.log" 2>&1
    echo $? >"$W/tps.rc"
  }
  launch run_tps
  wait_jobs $(($(left) - 5))
  say "   rc=$(cat "$W/tps.rc" 2>/dev/null || echo killed)"
  [ "$(cat "$W/tps.rc" 2>/dev/null)" = 0 ] || say "   tokens_per_s log tail: $(tail -3 "$OUT/tokens_per_s.log" | tr '\n' ' ')"
  grep -E '^TPS' "$OUT/tokens_per_s.log" | tee -a "$SUM"
  check f.tokens-per-s "$(cat "$W/tps.rc" 2>/dev/null || echo killed)"
else
  skip f.tokens-per-s "a benchmark: RUN_TPS=1 runs it (${TPS_MIN_LEFT:-180} s needed, $(left) s left)"
fi

say "== done, $(now), logs in $OUT: $(ls "$OUT" | wc -l) files"
finish
