#!/usr/bin/env bash
# K=1 identity on the GPU, with run-to-run controls: llama3_2_plt --patch_size 1 vs stock `--model_type llama`
# with the plugin disabled (SWIFT_PLT_DISABLE=1 = upstream ms-swift), each twice, with TE's default (possibly
# non-deterministic) algorithms and with deterministic ones (NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 +
# megatron deterministic_mode). 8 runs of 10 steps, 4 per GPU at once. Device kind nvidia-h200-x2:
#     bash tests/gpu/k1_identity.sh      (summary: $OUT/k1_summary.txt)
set -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd); cd "$REPO" || exit 1
OUT=${OUT:-/tmp/plt_gpu_out}; mkdir -p "$OUT"; SUM=$OUT/k1_summary.txt; : >"$SUM"
W=/tmp/plt_k1; rm -rf "$W"; mkdir -p "$W/runs"
source .gpu_kit/setup_device.sh >"$OUT/k1_setup.log" 2>&1
python3 -m pip install --no-deps --no-build-isolation --no-index . >>"$OUT/k1_setup.log" 2>&1
python3 .gpu_kit/make_tiny_llama.py --out "$W/tiny" --max-pos 2048 >>"$OUT/k1_setup.log" 2>&1
COMMON=(--model "$W/tiny/model" --template llama --dataset "$W/tiny/data/train.jsonl" --max_length 256
  --attention_backend fused --micro_batch_size 2 --global_batch_size 4 --seed 42 --train_iters 10
  --lr 1e-3 --min_lr 1e-4 --lr_warmup_iters 2 --bf16 true --logging_steps 1
  --save_steps 1000000 --no_save_optim true --no_save_rng true --dataloader_num_workers 2 --dataset_num_proc 4)
PLT=(--model_type llama3_2_plt --custom_register_path custom_model/llama.py --patch_size 1)
STOCK=(--model_type llama)
DET=(--megatron_extra_kwargs '{"deterministic_mode": true}')
pt() { # pt NAME GPU PORT ENV... -- ARGS...
  local name=$1 gpu=$2 port=$3 envs=(); shift 3
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" CUDA_VISIBLE_DEVICES=$gpu NPROC_PER_NODE=1 MASTER_PORT=$port HF_DATASETS_CACHE=$W/cache/$name \
    megatron pt "${COMMON[@]}" --output_dir "$W/runs/$name" "$@" >"$W/$name.log" 2>&1
  echo $? >"$W/runs/$name/rc"
}
pt plt1 0 29701 X=1 -- "${PLT[@]}" & pt stock 0 29702 SWIFT_PLT_DISABLE=1 -- "${STOCK[@]}" &
pt plt1_rep 1 29703 X=1 -- "${PLT[@]}" & pt stock_rep 1 29704 SWIFT_PLT_DISABLE=1 -- "${STOCK[@]}" &
D=(NVTE_ALLOW_NONDETERMINISTIC_ALGO=0)
pt det_plt1 0 29705 "${D[@]}" -- "${PLT[@]}" "${DET[@]}" & pt det_stock 0 29706 "${D[@]}" SWIFT_PLT_DISABLE=1 -- "${STOCK[@]}" "${DET[@]}" &
pt det_plt1_rep 1 29707 "${D[@]}" -- "${PLT[@]}" "${DET[@]}" & pt det_stock_rep 1 29708 "${D[@]}" SWIFT_PLT_DISABLE=1 -- "${STOCK[@]}" "${DET[@]}" &
wait
S="python3 tests/gpu/summarize.py same"
R=$W/runs
for pair in "plt1 stock" "plt1_rep stock_rep" "plt1 plt1_rep" "stock stock_rep" "det_plt1 det_stock" "det_plt1_rep det_stock_rep" "det_plt1 det_plt1_rep" "det_stock det_stock_rep"; do
  set -- $pair
  $S "$1=$R/$1" "$2=$R/$2" 2>&1 | tee -a "$SUM"
done
for n in plt1 stock det_plt1 det_stock; do cp "$R/$n"/*/logging.jsonl "$OUT/k1_$n.logging.jsonl" 2>/dev/null; done
for n in det_plt1 det_stock; do tail -5 "$W/$n.log" > "$OUT/k1_$n.tail.log"; done
