#!/usr/bin/env bash
# Critic training on GPU, ~4-6 min (from anywhere; every log and $OUT/critic_train_summary.txt, appended as each
# step ends, in $OUT, default ./gpu_results/critic_train):
#     bash tests/gpu/critic_train.sh
#   0. tiny Llama (tests/gpu/make_tiny.py), critic rows (tests/harness/critic_rows.py), a tiny critic with a random
#      value head N(0, 0.05) (so the step-1 values depend on the forward, not only on the targets)
#   1-GPU part:
#     1. (at once; on GPUs 0 and 1, or both on GPU 0) `megatron sft --model_type llama3_2_critic` 60 iters bf16 on
#        scalar rewards, saving the mcore checkpoint (with optimizer) at 30 and 60 -> CURVE (value_loss first/last,
#        explained variance, value_mean); the clipped value loss (--value_clip_range 0.2) on per-token returns + old
#        values, 20 iters -> CURVE; then MegatronCritic on 1 GPU (tests/gpu/critic_checks.py): its loss falls
#     2. resume from checkpoint-30 (--mcore_model ... --finetune false), iterations 31..60 -> RESUME (same losses
#        as the uninterrupted run within bf16 tolerance, head loaded)
#   2-GPU part: 3. MegatronCritic TP=2 (2 micro-batches), then PP=2 (4 micro-batches) -> ENGINE lines vs 1 GPU.
#     One GPU: SKIP.
# Last line "CRITIC_TRAIN: OK|FAIL (n/m)". Budget: BUDGET seconds (default 540; each run is capped by what is left).
# env: OUT, BUDGET, CRITIC_WORK (scratch dir), EXTRA_SFT_ARGS (appended to every `megatron sft`), ENGINE_DTYPE (bf16)
# and ENGINE_MG_KWARGS (JSON, extra MegatronArguments) of the engine runs, SWIFT_PLT_GPU_ENV, SWIFT_PLT_GPU_DRY_RUN
# (lib.sh: sets the last three for a CPU rehearsal).
set -o pipefail
set -m

# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_init critic_train critic_train_summary.txt "${CRITIC_WORK:-/tmp/swift_plt_gpu/critic_train}" 540 1
G1=$([ "$NGPU" -ge 2 ] && echo 1 || echo 0)
CHECK="python3 tests/gpu/critic_checks.py"
bounded() { # bounded CAP_S CMD...: run CMD for at most min(CAP_S, budget left) seconds
  local t
  t=$(cap "$1")
  shift
  timeout -k 10 "$t" "$@"
}

# ------------------------------------------------------------------------------------------------------ 0. setup
critic_setup || { check setup 1; finish; } # -> $W/tiny/model, $W/{reward,returns}.jsonl, $W/critic
TINY=$W/tiny/model

COMMON=(--model "$TINY" --model_type llama3_2_critic --custom_register_path custom_model/llama.py
  --template chatml --max_length 256 --micro_batch_size 4 --global_batch_size 16 --seed 42 --attention_backend fused
  --lr 2e-3 --min_lr 1e-4 --lr_warmup_iters 2 --bf16 true --logging_steps 1 --save_safetensors false
  --dataloader_num_workers 2 --dataset_num_proc 4)
sft() { # sft NAME GPUS PORT -- args...
  local name=$1 gpus=$2 port=$3
  shift 4
  mkdir -p "$W/runs/$name" "$W/cache/$name"
  CUDA_VISIBLE_DEVICES=$(dev "$gpus") NPROC_PER_NODE=1 MASTER_PORT=$port HF_DATASETS_CACHE="$W/cache/$name/hf" \
    MODELSCOPE_CACHE="$W/cache/$name/ms" bounded 300 megatron sft "${COMMON[@]}" --output_dir "$W/runs/$name" \
    "$@" ${EXTRA_SFT_ARGS:-} >"$OUT/$name.log" 2>&1
  echo "rc=$?"
}
engine() { # engine NAME GPUS NPROC -- args...
  local name=$1 gpus=$2 nproc=$3
  shift 4
  CUDA_VISIBLE_DEVICES=$(dev "$gpus") bounded 240 torchrun --nproc_per_node "$nproc" --master_port $((29700 + RANDOM % 200)) \
    tests/gpu/critic_checks.py --model "$W/critic" --json "$OUT/engine_$name.json" --dtype "${ENGINE_DTYPE:-bf16}" \
    --mg-kwargs "${ENGINE_MG_KWARGS:-{\}}" "$@" >"$OUT/engine_$name.log" 2>&1
  echo "rc=$?"
}

# ------------------------------------------------------------------------------------------- 1. CLI training
say "== 1-GPU part: 1. megatron sft critic runs (GPU 0: 60 it; GPU $G1: clipped 20 it, then the engine), $(now)"
(sft main 0 29661 -- --dataset "$W/reward.jsonl" --train_iters 60 --save_steps 30 >"$W/main.rc") &
P_MAIN=$!
(
  sft clip "$G1" 29662 -- --dataset "$W/returns.jsonl" --train_iters 20 --value_clip_range 0.2 --save_steps 100000 \
    --no_save_optim true --no_save_rng true >"$W/clip.rc"
  engine 1gpu "$G1" 1 -- >"$W/engine_1gpu.rc"
) &
P_CLIP=$!
wait $P_MAIN $P_CLIP
say "-- main $(cat "$W/main.rc"), clipped $(cat "$W/clip.rc"), engine 1 GPU $(cat "$W/engine_1gpu.rc"); $(now)"
$CHECK --curve "main (scalar rewards 0.5/1.5, 60 it, bf16)" "$OUT/main.log" 2>&1 | tee -a "$SUM"
check curve-main $?
$CHECK --curve "clipped (per-token returns, --value_clip_range 0.2, 20 it)" "$OUT/clip.log" --min-drop 0.9 2>&1 |
  tee -a "$SUM"
check curve-clipped $?
grep -h '^ENGINE_RUN' "$OUT/engine_1gpu.log" | tee -a "$SUM"
$CHECK --compare "$OUT/engine_1gpu.json" 2>&1 | tee -a "$SUM"
check engine-1gpu $?

# ----------------------------------------------------------------------------------------------------- 2. resume
CKPT=$(ls -d "$W"/runs/main/*/checkpoint-30 2>/dev/null | head -1)
say "== 1-GPU part: 2. resume from ${CKPT:-(no checkpoint-30)}, $(now)"
if [ -z "$CKPT" ]; then
  check resume 1
else
  # (not --no_save_optim here: with it ms-swift 4.6 fails to load the saved optimizer state, KeyError 'params')
  say "-- resumed $(sft resumed 0 29663 -- --dataset "$W/reward.jsonl" --train_iters 60 --save_steps 100000 \
    --mcore_model "$CKPT" --finetune false); $(now)"
  $CHECK --resume "main from checkpoint-30" "$OUT/main.log" "$OUT/resumed.log" 2>&1 | tee -a "$SUM"
  check resume $?
fi

# ------------------------------------------------------------------------------------------- 3. engine TP=2, PP=2
if [ "$NGPU" -ge 2 ]; then
  say "== 2-GPU part: 3. MegatronCritic TP=2 and PP=2 vs 1 GPU (${ENGINE_DTYPE:-bf16}), $(now)"
  say "-- tp2 $(engine tp2 0,1 2 -- --tp 2 --micro-batch-size 2); $(now)"
  say "-- pp2 $(engine pp2 0,1 2 -- --pp 2 --micro-batch-size 1); $(now)"
  grep -h '^ENGINE_RUN' "$OUT/engine_tp2.log" "$OUT/engine_pp2.log" | tee -a "$SUM"
  for n in tp2 pp2; do
    $CHECK --compare "$OUT/engine_1gpu.json" "$OUT/engine_$n.json" 2>&1 | grep -v '^ENGINE 1-GPU' | tee -a "$SUM"
    check "engine-$n" $?
  done
else
  skip "engine-tp2 engine-pp2" "2-GPU part: needs 2 GPUs, $NGPU visible"
fi
finish
