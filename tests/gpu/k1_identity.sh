#!/usr/bin/env bash
# K=1 identity with run-to-run controls: llama3_2_plt --patch_size 1 vs stock `--model_type llama` with the plugin
# disabled (SWIFT_PLT_DISABLE=1 = upstream ms-swift), each twice, with Transformer Engine's default (possibly
# non-deterministic) algorithms and with deterministic ones (NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 + megatron
# deterministic_mode). 8 runs of 10 steps at once, over GPUs 0 and 1 (all on GPU 0 with one GPU), ~1.5 min:
#     bash tests/gpu/k1_identity.sh      (summary: $OUT/k1_summary.txt; $OUT default ./gpu_results/k1_identity)
# Pass: the deterministic pairs (PLT vs stock, and each against its repeat) exit 0 and print identical loss and
# grad_norm strings at every step. The default-algorithm pairs are reported, not counted: they show whether upstream itself is
# run-to-run identical here. Last line "K1_IDENTITY: OK|FAIL (n/m)". env: OUT, K1_WORK (scratch dir), EXTRA_PT_ARGS,
# SWIFT_PLT_GPU_ENV, SWIFT_PLT_GPU_DRY_RUN (lib.sh).
set -o pipefail
# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_init k1_identity k1_summary.txt "${K1_WORK:-/tmp/swift_plt_gpu/k1_identity}" 600 1
G1=$([ "$NGPU" -ge 2 ] && echo 1 || echo 0)
make_tiny "$W/tiny" || { say "0 setup: tiny model FAILED (make_tiny.log)"; check setup 1; finish; }
COMMON=(--model "$W/tiny/model" --template llama --dataset "$W/tiny/data/train.jsonl" --max_length 256
  --attention_backend fused --micro_batch_size 2 --global_batch_size 4 --seed 42 --train_iters 10
  --lr 1e-3 --min_lr 1e-4 --lr_warmup_iters 2 --bf16 true --logging_steps 1
  --save_steps 1000000 --no_save_optim true --no_save_rng true --dataloader_num_workers 2 --dataset_num_proc 4)
PLT=(--model_type llama3_2_plt --custom_register_path custom_model/llama.py --patch_size 1)
STOCK=(--model_type llama)
DET=(--megatron_extra_kwargs '{"deterministic_mode": true}')
pt() { # pt NAME GPU PORT ENV... -- ARGS...
  local name=$1 gpu=$2 port=$3 envs=() t=$SECONDS
  shift 3
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  mkdir -p "$W/runs/$name"
  # shellcheck disable=SC2086
  env "${envs[@]}" CUDA_VISIBLE_DEVICES="$(dev "$gpu")" NPROC_PER_NODE=1 MASTER_PORT="$port" \
    HF_DATASETS_CACHE="$W/cache/$name" MODELSCOPE_CACHE="$W/cache/$name/ms" timeout -k 10 "$(cap 400)" \
    megatron pt "${COMMON[@]}" --output_dir "$W/runs/$name" "$@" ${EXTRA_PT_ARGS:-} >"$OUT/$name.log" 2>&1
  echo $? >"$W/runs/$name/rc"
  echo $((SECONDS - t)) >"$W/runs/$name/secs"
}
say "== 8 runs of 10 steps at once on GPU(s) 0$([ "$G1" = 1 ] && echo ' and 1'), $(now)"
D=(NVTE_ALLOW_NONDETERMINISTIC_ALGO=0)
pt plt1 0 29701 X=1 -- "${PLT[@]}" &
pt stock 0 29702 SWIFT_PLT_DISABLE=1 -- "${STOCK[@]}" &
pt plt1_rep "$G1" 29703 X=1 -- "${PLT[@]}" &
pt stock_rep "$G1" 29704 SWIFT_PLT_DISABLE=1 -- "${STOCK[@]}" &
pt det_plt1 0 29705 "${D[@]}" -- "${PLT[@]}" "${DET[@]}" &
pt det_stock 0 29706 "${D[@]}" SWIFT_PLT_DISABLE=1 -- "${STOCK[@]}" "${DET[@]}" &
pt det_plt1_rep "$G1" 29707 "${D[@]}" -- "${PLT[@]}" "${DET[@]}" &
pt det_stock_rep "$G1" 29708 "${D[@]}" SWIFT_PLT_DISABLE=1 -- "${STOCK[@]}" "${DET[@]}" &
wait
say "-- runs done, $(now)"
S="env LOGDIR=$OUT python3 tests/gpu/summarize.py same"
R=$W/runs
say "-- default algorithms (information: is upstream run-to-run identical here?)"
for pair in "plt1 stock" "plt1_rep stock_rep" "plt1 plt1_rep" "stock stock_rep"; do
  set -- $pair
  $S "$1=$R/$1" "$2=$R/$2" 2>&1 | tee -a "$SUM"
done
say "-- deterministic algorithms (the checks)"
for pair in "det_plt1 det_stock" "det_plt1_rep det_stock_rep" "det_plt1 det_plt1_rep" "det_stock det_stock_rep"; do
  set -- $pair
  $S "$1=$R/$1" "$2=$R/$2" 2>&1 | tee -a "$SUM"
  rc=$?
  [ "$(cat "$R/$1/rc")" = 0 ] && [ "$(cat "$R/$2/rc")" = 0 ] || rc=1 # a run cut short proves nothing
  check "$1~$2" $rc
done
for n in plt1 stock det_plt1 det_stock; do cp "$R/$n"/*/logging.jsonl "$OUT/$n.logging.jsonl" 2>/dev/null; done
finish
