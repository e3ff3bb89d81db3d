#!/usr/bin/env bash
# HF-backend checks on one GPU (device kind nvidia-h200, ~3 min), from the repo root:
#     bash tests/gpu/hf_backend.sh          (device tool: carry=['.gpu_kit']; summary: $OUT/hf_summary.txt)
#   1. tests/gpu/backend_parity.py: HF PLT model == Megatron PLT model == PatchTrain brute force (bf16 and fp32),
#      on a tiny bf16 Llama with untied and with tied embeddings -> $OUT/backend_parity.{log,json}
#   2. `swift pt --patch_size 4` (ms-swift's HF trainer, bf16) on the tiny Llama, 40 steps -> loss curve
#   3. the same with --padding_free true --attn_impl flash_attn (needs flash-attn on the device; reported, not fatal)
set -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd); cd "$REPO" || exit 1
OUT=${OUT:-/tmp/plt_gpu_out}; mkdir -p "$OUT"; SUM=$OUT/hf_summary.txt; : >"$SUM"
W=${PLT_WORK:-/tmp/plt_hf}; rm -rf "$W"; mkdir -p "$W"
say() { echo "$*" | tee -a "$SUM"; }
source .gpu_kit/setup_device.sh >"$OUT/hf_setup.log" 2>&1 || { say "setup: FAILED (hf_setup.log)"; exit 1; }
python3 -m pip install --no-deps --no-build-isolation --no-index . >>"$OUT/hf_setup.log" 2>&1 ||
  python3 -m pip install --no-deps --no-build-isolation --no-index --break-system-packages . >>"$OUT/hf_setup.log" 2>&1
python3 - >>"$OUT/hf_setup.log" 2>&1 <<PY
import sys; sys.path.insert(0, 'tests')
from harness.tiny import make_jsonl, make_tiny_llama
kw = dict(vocab_size=1024, hidden=128, layers=4, heads=4, kv_heads=2, ffn=344, max_position_embeddings=1024,
          dtype='bfloat16')
make_tiny_llama('$W/untied', **kw); make_tiny_llama('$W/tied', tie_word_embeddings=True, **kw)
make_jsonl('$W/train.jsonl', rows=2000, max_sentences=12)
PY
say "== swift-plt HF backend, $(date -u +%FT%TZ), $(git rev-parse --short HEAD 2>/dev/null), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"

python3 tests/gpu/backend_parity.py --model "$W/untied" --model "$W/tied" --data "$W/train.jsonl" \
  --json "$OUT/backend_parity.json" >"$OUT/backend_parity.log" 2>&1
say "-- 1. backend parity (rc=$?)"; grep -E '^BACKEND_PARITY' "$OUT/backend_parity.log" | tee -a "$SUM"

hf_pt() { # hf_pt NAME extra-args...
  local name=$1; shift
  swift pt --model "$W/untied" --model_type llama3_2_plt --custom_register_path custom_model/llama.py \
    --patch_size 4 --template llama --dataset "$W/train.jsonl" --max_length 256 --tuner_type full \
    --torch_dtype bfloat16 --per_device_train_batch_size 8 --learning_rate 1e-3 --max_steps 40 --logging_steps 5 \
    --save_steps 40 --split_dataset_ratio 0 --dataset_num_proc 4 --report_to none --output_dir "$W/$name" "$@" \
    >"$OUT/hf_$name.log" 2>&1
  local rc=$?
  say "-- swift pt $name (rc=$rc): losses $(python3 - "$W/$name" <<'PY' 2>&1
import glob, json, sys
f = glob.glob(sys.argv[1] + '/*/logging.jsonl')
rows = [json.loads(l) for l in open(f[0])] if f else []
print([round(float(r['loss']), 3) for r in rows if 'loss' in r] if f else 'none (no logging.jsonl)')
PY
)"
  say "   PLTLlamaForCausalLM in the log: $(grep -c PLTLlamaForCausalLM "$OUT/hf_$name.log") lines"
  cp "$W/$name"/*/checkpoint-40/config.json "$OUT/hf_${name}_config.json" 2>/dev/null
}
hf_pt k4
hf_pt k4_padding_free --padding_free true --attn_impl flash_attn
say "== done $(date -u +%FT%TZ)"
