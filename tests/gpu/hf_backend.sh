#!/usr/bin/env bash
# HF-backend checks on one GPU, ~3 min (from anywhere; summary $OUT/hf_summary.txt, $OUT default
# ./gpu_results/hf_backend):
#     bash tests/gpu/hf_backend.sh
#   1. tests/gpu/backend_parity.py: HF PLT model == Megatron PLT model == PatchTrain brute force (bf16 and fp32),
#      on a tiny bf16 Llama with untied and with tied embeddings -> $OUT/backend_parity.{log,json}
#   2. `swift pt --patch_size 4` (ms-swift's HF trainer, bf16) on the tiny Llama, 40 steps: exit 0, falling losses
#   3. the same with --padding_free true --attn_impl flash_attn (ms-swift's HF backend needs flash-attn for
#      padding-free; without flash-attn installed: a SKIP line)
# Last line "HF_BACKEND: OK|FAIL (n/m)". env: OUT, PLT_WORK (scratch dir), SWIFT_PLT_GPU_ENV, SWIFT_PLT_GPU_DRY_RUN.
set -o pipefail
# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_init hf_backend hf_summary.txt "${PLT_WORK:-/tmp/swift_plt_gpu/hf_backend}" 600 1
export CUDA_VISIBLE_DEVICES=$(dev 0)
(cd / && python3 - "$W" >"$OUT/hf_setup.log" 2>&1) <<'PY'
import sys
from swift_plt.tools.tiny import make_jsonl, make_tiny_llama
w = sys.argv[1]
kw = dict(vocab_size=1024, hidden=128, layers=4, heads=4, kv_heads=2, ffn=344, max_position_embeddings=1024,
          dtype='bfloat16')
make_tiny_llama(f'{w}/untied', **kw)
make_tiny_llama(f'{w}/tied', tie_word_embeddings=True, **kw)
make_jsonl(f'{w}/train.jsonl', rows=2000, max_sentences=12)
PY
rc=$?
say "0 setup: tiny Llamas (untied, tied) rc=$rc; $(now)"
[ $rc = 0 ] || { tail -3 "$OUT/hf_setup.log" | sed 's/^/   | /' | tee -a "$SUM"; check setup 1; finish; }

BP_ARGS=()
[ "${SWIFT_PLT_GPU_DRY_RUN:-0}" = 1 ] && BP_ARGS=(--backend gloo --mg-kwargs '{"use_cpu_initialization": true, "ddp_backend": "gloo"}')
python3 tests/gpu/backend_parity.py --model "$W/untied" --model "$W/tied" --data "$W/train.jsonl" \
  --json "$OUT/backend_parity.json" "${BP_ARGS[@]}" >"$OUT/backend_parity.log" 2>&1
rc=$?
say "-- 1. backend parity (rc=$rc)"
grep -E '^BACKEND_PARITY' "$OUT/backend_parity.log" | tee -a "$SUM"
grep -q '^BACKEND_PARITY' "$OUT/backend_parity.log" || tail -3 "$OUT/backend_parity.log" | sed 's/^/   | /' | tee -a "$SUM"
check backend-parity $rc

hf_pt() { # hf_pt NAME extra-args...
  local name=$1 rc
  shift
  timeout -k 10 "$(cap 300)" swift pt --model "$W/untied" --model_type llama3_2_plt \
    --custom_register_path custom_model/llama.py --patch_size 4 --template llama --dataset "$W/train.jsonl" \
    --max_length 256 --tuner_type full --torch_dtype bfloat16 --per_device_train_batch_size 8 --learning_rate 1e-3 \
    --max_steps 40 --logging_steps 5 --save_steps 40 --split_dataset_ratio 0 --dataset_num_proc 4 --report_to none \
    --output_dir "$W/$name" "$@" >"$OUT/hf_$name.log" 2>&1
  rc=$?
  local summary falling
  summary=$(python3 - "$W/$name" <<'PY' 2>&1
import glob, json, sys
f = glob.glob(sys.argv[1] + '/*/logging.jsonl')
losses = [float(r['loss']) for r in map(json.loads, open(f[0])) if 'loss' in r] if f else []
falling = len(losses) >= 2 and losses[-1] < losses[0]
print(f'losses {[round(x, 3) for x in losses]}, falling={"yes" if falling else "NO"}' if f else
      'no logging.jsonl')
sys.exit(0 if falling else 1)
PY
  )
  falling=$?
  say "-- swift pt $name (rc=$rc): $summary"
  say "   PLTLlamaForCausalLM in the log: $(grep -c PLTLlamaForCausalLM "$OUT/hf_$name.log") lines"
  [ $rc = 0 ] || say "   last error: $(grep -E 'Error|error:' "$OUT/hf_$name.log" | tail -1 | cut -c1-300)"
  cp "$W/$name"/*/checkpoint-40/config.json "$OUT/hf_${name}_config.json" 2>/dev/null
  [ $rc = 0 ] && [ $falling = 0 ]
}
hf_pt k4
check swift-pt-k4 $?
if (cd / && python3 -c "import flash_attn") >/dev/null 2>&1; then
  hf_pt k4_padding_free --padding_free true --attn_impl flash_attn
  check swift-pt-k4-padding-free $?
else
  skip swift-pt-k4-padding-free "flash-attn is not installed; ms-swift's HF backend needs it for padding-free"
fi
finish
