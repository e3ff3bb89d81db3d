#!/usr/bin/env bash
# llama3_2_critic model checks, one command, on an `nvidia-h200-x2` device machine, from the repo root:
#     bash tests/gpu/critic_model.sh        (device tool: kind='nvidia-h200-x2', carry=['.gpu_kit'], $OUT set by it)
# Results: $OUT/critic_summary.txt (one line per check, appended as each ends), every log in $OUT/critic_*.log.
#   0. setup: source .gpu_kit/setup_device.sh; pip-install this repo; tiny Llama (.gpu_kit/make_tiny_llama.py, bf16)
#      and an HF critic from it (critic_model.py make-critic: LlamaForTokenClassification, num_labels=1, head N(0,.5))
#   1. Megatron critic values (ms-swift MegatronArguments + get_mcore_model + CriticBridge, TE, bf16, fused attention)
#      on a fixed batch [2, 256]: 1 GPU, TP=2, PP=2, TP=2 + sequence parallel; each vs 1 GPU (bf16 tolerance 2e-2,
#      relative to max|v|); the line also says which ranks own the head and that it is equal on every TP rank.
#      HF transformers LlamaForTokenClassification (bf16, cuda) on the critic dir vs Megatron 1 GPU (tolerance 3e-2).
#   2. save -> export -> plain transformers: `swift export --to_mcore` (the mcore distributed checkpoint, with
#      --test_convert_precision) then `swift export --mcore_model ... --to_hf` (with --test_convert_precision; if that
#      fails, again without it, and the summary says so), then transformers loads the exported dir: values identical
#      to the original critic dir (same weights, bit-identical expected: tol 0) and loading info empty.
# Budget: about 3-4 minutes.
set -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 1
OUT=${OUT:-/tmp/critic_gpu_out}
mkdir -p "$OUT"
SUM=$OUT/critic_summary.txt
: >"$SUM"
W=${CRITIC_WORK:-/tmp/critic_gpu}
rm -rf "$W"
mkdir -p "$W"
T0=$SECONDS
say() { echo "$*" | tee -a "$SUM"; }
now() { echo "t=$((SECONDS - T0))s"; }
last_err() { grep -E 'Error|error:' "$1" 2>/dev/null | tail -1 | cut -c1-300; }
PY=tests/gpu/critic_model.py
CM=(--model_type llama3_2_critic --custom_register_path custom_model/llama.py)

say "== swift-plt critic model GPU checks, $(date -u +%FT%TZ), repo $(git rev-parse --short HEAD 2>/dev/null)"
say "machine: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | xargs)"
# shellcheck disable=SC1091
source .gpu_kit/setup_device.sh >"$OUT/critic_setup_kit.log" 2>&1 || { say "0 setup: kit FAILED"; exit 1; }
{ python3 -m pip install --no-deps --no-build-isolation --no-index . ||
  python3 -m pip install --no-deps --no-build-isolation --no-index --break-system-packages .; } >"$OUT/critic_pip.log" 2>&1
say "0 setup: pip install rc=$?; $(now)"
python3 .gpu_kit/make_tiny_llama.py --out "$W/tiny" --max-pos 2048 >"$OUT/critic_make_tiny.log" 2>&1
python3 $PY make-critic --lm "$W/tiny/model" --out "$W/critic" >>"$OUT/critic_make_tiny.log" 2>&1
say "0 models: rc=$? $(grep -E '^(model|critic):' "$OUT/critic_make_tiny.log" | xargs); $(now)"

# ------------------------------------------------------------------------------------------ 1. values vs 1 GPU
mg() { # mg NAME GPUS NPROC PORT args...
  local name=$1 gpus=$2 nproc=$3 port=$4
  shift 4
  CUDA_VISIBLE_DEVICES=$gpus torchrun --nproc_per_node "$nproc" --master_port "$port" $PY mg-values \
    --model "$W/critic" --out "$W/$name.pt" "$@" >"$OUT/critic_$name.log" 2>&1
  local rc=$?
  [ $rc = 0 ] || say "   $name: rc=$rc $(last_err "$OUT/critic_$name.log")"
}
mg one 0 1 29811 &
python3 $PY hf-values --model "$W/critic" --out "$W/hf.pt" >"$OUT/critic_hf.log" 2>&1 &
wait
mg tp2 0,1 2 29812 --tp 2
mg pp2 0,1 2 29813 --pp 2
mg tp2sp 0,1 2 29814 --tp 2 --sp
say "-- 1. Megatron critic values vs 1 GPU (bf16), $(now)"
for n in tp2 pp2 tp2sp; do python3 $PY compare "$n vs 1GPU" "$W/$n.pt" "$W/one.pt" --tol 2e-2 2>&1 | tail -1 | tee -a "$SUM"; done
python3 $PY compare "1GPU vs 1GPU" "$W/one.pt" "$W/one.pt" --tol 0 2>&1 | tail -1 | tee -a "$SUM"
python3 $PY compare "HF LlamaForTokenClassification vs Megatron 1GPU" "$W/hf.pt" "$W/one.pt" --tol 3e-2 2>&1 | tail -1 |
  tee -a "$SUM"

# ----------------------------------------------------------------------------- 2. save -> export -> transformers
say "-- 2. swift export --to_mcore / --to_hf, transformers load, $(now)"
CUDA_VISIBLE_DEVICES=0 swift export --model "$W/critic" "${CM[@]}" --to_mcore true --test_convert_precision true \
  --torch_dtype bfloat16 --output_dir "$W/mcore" >"$OUT/critic_to_mcore.log" 2>&1
rc=$?
say "to_mcore: rc=$rc $(grep -E 'mean_diff \(with loss\)' "$OUT/critic_to_mcore.log" | tail -1 | cut -c1-120) $([ $rc = 0 ] || last_err "$OUT/critic_to_mcore.log")"
CUDA_VISIBLE_DEVICES=0 swift export --mcore_model "$W/mcore" "${CM[@]}" --to_hf true --test_convert_precision true \
  --torch_dtype bfloat16 --output_dir "$W/hf_export" >"$OUT/critic_to_hf.log" 2>&1
rc=$?
say "to_hf (--test_convert_precision true): rc=$rc $(grep -E 'mean_diff \(with loss\)' "$OUT/critic_to_hf.log" | tail -1 | cut -c1-120) $([ $rc = 0 ] || last_err "$OUT/critic_to_hf.log")"
if [ ! -f "$W/hf_export/model.safetensors" ]; then
  rm -rf "$W/hf_export"
  CUDA_VISIBLE_DEVICES=0 swift export --mcore_model "$W/mcore" "${CM[@]}" --to_hf true --torch_dtype bfloat16 \
    --output_dir "$W/hf_export" >"$OUT/critic_to_hf_noprec.log" 2>&1
  rc=$?
  say "to_hf (without --test_convert_precision): rc=$rc $([ $rc = 0 ] || last_err "$OUT/critic_to_hf_noprec.log")"
fi
say "exported config: $(python3 -c "import json; c = json.load(open('$W/hf_export/config.json')); print({k: c.get(k) for k in ('architectures', 'id2label', 'token_classification_bias', 'tie_word_embeddings')})" 2>&1 | tail -1)"
python3 $PY hf-values --model "$W/hf_export" --out "$W/hf_export.pt" >"$OUT/critic_hf_export.log" 2>&1
python3 $PY compare "exported dir (transformers) vs original critic dir (transformers)" "$W/hf_export.pt" "$W/hf.pt" \
  --tol 0 2>&1 | tail -1 | tee -a "$SUM"
python3 $PY compare "exported dir (transformers) vs Megatron 1GPU" "$W/hf_export.pt" "$W/one.pt" --tol 3e-2 2>&1 |
  tail -1 | tee -a "$SUM"
say "== done, $(now); $(grep -c -- '-> OK' "$SUM") OK, $(grep -c -- '-> FAIL' "$SUM") FAIL"
