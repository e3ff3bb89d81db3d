#!/usr/bin/env bash
# Critic training with context parallel, 2 GPUs, ~3-4 min (from anywhere; every log and
# $OUT/critic_cp_summary.txt in $OUT, default ./gpu_results/critic_cp):
#     bash tests/gpu/critic_cp.sh
#   0. tiny Llama (tests/gpu/make_tiny.py), critic rows (tests/harness/critic_rows.py), a tiny critic with a random
#      value head N(0, 0.05) (so the step-1 values depend on the forward, not only on the targets)
#   1. (at once) GPU 0: `megatron sft --model_type llama3_2_critic` on per-token returns with the clipped value loss,
#      GPU 1: on scalar rewards (plain MSE); 20 iterations each, bf16, --attention_backend fused, seed 42
#   2. GPUs 0,1: the same two runs with --context_parallel_size 2 (one after the other; DP stays 1, so the batches
#      are the same)
#   Pass: for each pair, step-1 value_loss of the CP run within 2e-2 (relative) of the 1-GPU run, the CP run's value
#   loss falling (mean of the last 5 steps < 0.9 x / 0.7 x the first 5), the same number of steps.
# With one GPU the whole script is a SKIP (CP needs 2). Not rehearsed on CPU: CP attention is Transformer Engine's.
# Last line "CRITIC_CP: OK|FAIL|SKIP ...". Budget: BUDGET seconds (default 300). env: OUT, BUDGET, CRITIC_WORK
# (scratch dir), SWIFT_PLT_GPU_ENV.
set -o pipefail
set -m

# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
GPU_CUDA_ONLY="context-parallel attention is Transformer Engine's"
gpu_init critic_cp critic_cp_summary.txt "${CRITIC_WORK:-/tmp/swift_plt_gpu/critic_cp}" 300 2
CHECK="python3 tests/gpu/critic_checks.py"

critic_setup || { check setup 1; finish; } # -> $W/tiny/model, $W/{reward,returns}.jsonl, $W/critic

COMMON=(--model "$W/critic" --model_type llama3_2_critic --custom_register_path custom_model/llama.py
  --template chatml --max_length 256 --micro_batch_size 4 --global_batch_size 16 --seed 42 --attention_backend fused
  --lr 2e-3 --min_lr 1e-4 --lr_warmup_iters 2 --torch_dtype bfloat16 --logging_steps 1 --train_iters 20 --save_steps 100000
  --no_save_optim true --no_save_rng true --save_safetensors false --dataloader_num_workers 2 --dataset_num_proc 4)
RETURNS=(--dataset "$W/returns.jsonl" --value_clip_range 0.2)
REWARD=(--dataset "$W/reward.jsonl")
sft() { # sft NAME GPUS PORT -- args...
  local name=$1 gpus=$2 port=$3 n
  shift 4
  n=$(($(echo "$gpus" | tr -cd , | wc -c) + 1))
  mkdir -p "$W/runs/$name" "$W/cache/$name"
  CUDA_VISIBLE_DEVICES=$(dev "$gpus") NPROC_PER_NODE=$n MASTER_PORT=$port HF_DATASETS_CACHE="$W/cache/$name/hf" \
    MODELSCOPE_CACHE="$W/cache/$name/ms" timeout -k 10 "$(cap 200)" megatron sft "${COMMON[@]}" \
    --output_dir "$W/runs/$name" "$@" >"$OUT/$name.log" 2>&1
  echo "rc=$?"
}

say "== 1: 1-GPU references (GPU0: per-token returns, clipped; GPU1: scalar rewards), $(now)"
(sft ref_returns 0 29671 -- "${RETURNS[@]}" >"$W/ref_returns.rc") &
P1=$!
(sft ref_reward 1 29672 -- "${REWARD[@]}" >"$W/ref_reward.rc") &
P2=$!
wait $P1 $P2
say "-- ref_returns $(cat "$W/ref_returns.rc"), ref_reward $(cat "$W/ref_reward.rc"); $(now)"
say "== 2: --context_parallel_size 2 on GPUs 0,1, $(now)"
say "-- cp_returns $(sft cp_returns 0,1 29673 -- "${RETURNS[@]}" --context_parallel_size 2); $(now)"
say "-- cp_reward $(sft cp_reward 0,1 29674 -- "${REWARD[@]}" --context_parallel_size 2); $(now)"

$CHECK --cp "per-token returns, --value_clip_range 0.2, 20 it" "$OUT/ref_returns.log" "$OUT/cp_returns.log" \
  --ltol 2e-2 --min-drop 0.9 2>&1 | tee -a "$SUM"
check cp-returns $?
$CHECK --cp "scalar rewards, 20 it" "$OUT/ref_reward.log" "$OUT/cp_reward.log" --ltol 2e-2 --min-drop 0.7 2>&1 |
  tee -a "$SUM"
check cp-reward $?
for name in cp_returns cp_reward; do # evidence that CP was on
  say "-- $name: $(grep -o -m1 "context_parallel_size=[0-9]*" "$OUT/$name.log" || echo 'context_parallel_size not found in log')"
done
finish
