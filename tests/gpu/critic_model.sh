#!/usr/bin/env bash
# llama3_2_critic model checks, ~3-4 min (from anywhere; summary $OUT/critic_summary.txt, every log in
# $OUT/critic_*.log; $OUT default ./gpu_results/critic_model):
#     bash tests/gpu/critic_model.sh
#   0. tiny Llama (tests/gpu/make_tiny.py, bf16) and an HF critic from it (critic_model.py make-critic:
#      LlamaForTokenClassification, num_labels=1, head N(0, 0.5))
#   1-GPU part:
#     Megatron critic values (ms-swift MegatronArguments + get_mcore_model + CriticBridge, TE, bf16, fused attention)
#     on a fixed batch [2, 256] (compared with itself: the comparison's own check), and HF transformers LlamaForTokenClassification (bf16, cuda)
#     on the critic dir against it (tolerance 3e-2, relative to max|v|).
#     save -> export -> plain transformers: `swift export --to_mcore` (the mcore distributed checkpoint, with
#     --test_convert_precision) then `swift export --mcore_model ... --to_hf` (with --test_convert_precision; if that
#     fails, again without it, and the summary says so), then transformers loads the exported dir: values identical
#     to the original critic dir (same weights, bit-identical expected: tol 0) and loading info empty.
#   2-GPU part: the Megatron values at TP=2, PP=2, TP=2 + sequence parallel, each against 1 GPU (bf16 tolerance
#     2e-2); the line also says which ranks own the head and that it is equal on every TP rank. One GPU: SKIP.
# Last line "CRITIC_MODEL: OK|FAIL (n/m)". env: OUT, CRITIC_WORK (scratch dir), SWIFT_PLT_GPU_ENV.
set -o pipefail
# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
GPU_CUDA_ONLY="its transformers values run on CUDA"
gpu_init critic_model critic_summary.txt "${CRITIC_WORK:-/tmp/swift_plt_gpu/critic_model}" 600 1
last_err() { grep -E 'Error|error:' "$1" 2>/dev/null | tail -1 | cut -c1-300; }
PY=tests/gpu/critic_model.py
CM=(--model_type llama3_2_critic --custom_register_path custom_model/llama.py)
G1=$([ "$NGPU" -ge 2 ] && echo 1 || echo 0)

make_tiny "$W/tiny" && python3 $PY make-critic --lm "$W/tiny/model" --out "$W/critic" >>"$OUT/make_tiny.log" 2>&1
rc=$?
say "0 models: rc=$rc $(grep -E '^(model|critic):' "$OUT/make_tiny.log" | xargs); $(now)"
[ $rc = 0 ] || { tail -3 "$OUT/make_tiny.log" | sed 's/^/   | /' | tee -a "$SUM"; check setup 1; finish; }

mg() { # mg NAME GPUS NPROC PORT args...
  local name=$1 gpus=$2 nproc=$3 port=$4
  shift 4
  CUDA_VISIBLE_DEVICES=$(dev "$gpus") torchrun --nproc_per_node "$nproc" --master_port "$port" $PY mg-values \
    --model "$W/critic" --out "$W/$name.pt" "$@" >"$OUT/critic_$name.log" 2>&1
  local rc=$?
  [ $rc = 0 ] || say "   $name: rc=$rc $(last_err "$OUT/critic_$name.log")"
}
compare() { # compare LABEL A B TOL
  python3 $PY compare "$1" "$2" "$3" --tol "$4" 2>&1 | tail -1 | tee -a "$SUM"
  check "$1" $?
}

# ----------------------------------------------------------------------------------------------- 1-GPU part
say "== 1-GPU part: Megatron critic values (twice) and transformers, $(now)"
mg one 0 1 29811 &
CUDA_VISIBLE_DEVICES=$(dev "$G1") python3 $PY hf-values --model "$W/critic" --out "$W/hf.pt" >"$OUT/critic_hf.log" 2>&1 &
wait
compare "1GPU vs 1GPU" "$W/one.pt" "$W/one.pt" 0
compare "HF LlamaForTokenClassification vs Megatron 1GPU" "$W/hf.pt" "$W/one.pt" 3e-2

say "-- swift export --to_mcore / --to_hf, transformers load, $(now)"
D0=$(dev 0)
CUDA_VISIBLE_DEVICES=$D0 swift export --model "$W/critic" "${CM[@]}" --to_mcore true --test_convert_precision true \
  --torch_dtype bfloat16 --output_dir "$W/mcore" >"$OUT/critic_to_mcore.log" 2>&1
rc=$?
say "to_mcore: rc=$rc $(grep -E 'mean_diff \(with loss\)' "$OUT/critic_to_mcore.log" | tail -1 | cut -c1-120) $([ $rc = 0 ] || last_err "$OUT/critic_to_mcore.log")"
check to_mcore $rc
CUDA_VISIBLE_DEVICES=$D0 swift export --mcore_model "$W/mcore" "${CM[@]}" --to_hf true --test_convert_precision true \
  --torch_dtype bfloat16 --output_dir "$W/hf_export" >"$OUT/critic_to_hf.log" 2>&1
rc=$?
say "to_hf (--test_convert_precision true): rc=$rc $(grep -E 'mean_diff \(with loss\)' "$OUT/critic_to_hf.log" | tail -1 | cut -c1-120) $([ $rc = 0 ] || last_err "$OUT/critic_to_hf.log")"
if [ ! -f "$W/hf_export/model.safetensors" ]; then
  # --test_convert_precision builds an HF Llama after mcore-bridge's RoPE code ran in the process, which fails on
  # some transformers versions; the export itself does not need it
  rm -rf "$W/hf_export"
  CUDA_VISIBLE_DEVICES=$D0 swift export --mcore_model "$W/mcore" "${CM[@]}" --to_hf true --torch_dtype bfloat16 \
    --output_dir "$W/hf_export" >"$OUT/critic_to_hf_noprec.log" 2>&1
  rc=$?
  say "to_hf (without --test_convert_precision): rc=$rc $([ $rc = 0 ] || last_err "$OUT/critic_to_hf_noprec.log")"
fi
check to_hf $rc
say "exported config: $(python3 -c "import json; c = json.load(open('$W/hf_export/config.json')); print({k: c.get(k) for k in ('architectures', 'id2label', 'token_classification_bias', 'tie_word_embeddings')})" 2>&1 | tail -1)"
CUDA_VISIBLE_DEVICES=$D0 python3 $PY hf-values --model "$W/hf_export" --out "$W/hf_export.pt" >"$OUT/critic_hf_export.log" 2>&1
compare "exported dir (transformers) vs original critic dir (transformers)" "$W/hf_export.pt" "$W/hf.pt" 0
compare "exported dir (transformers) vs Megatron 1GPU" "$W/hf_export.pt" "$W/one.pt" 3e-2

# ----------------------------------------------------------------------------------------------- 2-GPU part
if [ "$NGPU" -ge 2 ]; then
  say "== 2-GPU part: Megatron critic values at TP=2, PP=2, TP=2+SP vs 1 GPU (bf16), $(now)"
  mg tp2 0,1 2 29812 --tp 2
  mg pp2 0,1 2 29813 --pp 2
  mg tp2sp 0,1 2 29814 --tp 2 --sp
  for n in tp2 pp2 tp2sp; do compare "$n vs 1GPU" "$W/$n.pt" "$W/one.pt" 2e-2; done
else
  skip "tp2 pp2 tp2sp" "2-GPU part: needs 2 GPUs, $NGPU visible"
fi
finish
