#!/usr/bin/env bash
# `megatron pt` throughput of PLT: a random-init Llama-3.2-1B-shaped model (hidden 2048, 16 layers, 32 heads, 8 kv
# heads, ffn 8192, vocab 128256, tied embeddings) at K=4 with S=8192 tokens per sequence (2048 patches) vs K=1
# (llama3_2_plt --patch_size 1) with S=2048: the same number of positions through the transformer, the same
# micro/global batch in sequences (MBS=1, GBS=8). Every row of the synthetic jsonl is longer than S and truncated to
# S (--truncation_strategy right), so every sequence is exactly S tokens. tokens/s = GBS*S per step, timed over the
# steps after the warm-up from ms-swift's logged train_speed(s/it) (elapsed_N = speed_N * N).
#
#   bash benchmarks/throughput/tokens_per_s.sh      (repo root, a GPU machine)
# env: OUT (logs + TPS lines), TPS_WORK (/tmp/plt_tps), TINY_MODEL (a dir with a tokenizer; default: one made by
#      swift-plt-make-tiny), WARM (5), MEAS (20), GBS (8), MBS (1), GPU_K4 (0), GPU_K1 (1 on a 2-GPU machine, else 0:
#      then sequential), SWIFT_PLT_GPU_ENV (optional script sourced first: the machine's environment)
set -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 1
OUT=${OUT:-/tmp/plt_tps_out}
mkdir -p "$OUT"
W=${TPS_WORK:-/tmp/plt_tps}
mkdir -p "$W"
WARM=${WARM:-5} MEAS=${MEAS:-20} GBS=${GBS:-8} MBS=${MBS:-1}
ITERS=$((WARM + MEAS))

# shellcheck disable=SC1090
[ -n "${SWIFT_PLT_GPU_ENV:-}" ] && source "$SWIFT_PLT_GPU_ENV"
command -v megatron >/dev/null 2>&1 || { echo "TPS: megatron (ms-swift[megatron]) not found"; exit 1; }
if ! (cd /tmp && python3 -c "import swift_plt.plugin.import_hook as a; assert a._finder is not None") 2>/dev/null; then
  python3 -m pip install --no-deps --no-build-isolation --no-index . >"$OUT/tps_pip.log" 2>&1 ||
    python3 -m pip install --no-deps --no-build-isolation --no-index --break-system-packages . >>"$OUT/tps_pip.log" 2>&1
fi
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
GPU_K4=${GPU_K4:-0}
GPU_K1=${GPU_K1:-$([ "$NGPU" -ge 2 ] && echo 1 || echo 0)}

# ---- tokenizer, model, data
TOK=${TINY_MODEL:-}
if [ -z "$TOK" ] || [ ! -f "$TOK/tokenizer.json" ]; then
  swift-plt-make-tiny "$W/tiny" >"$OUT/tps_make_tiny.log" 2>&1
  TOK=$W/tiny/model
fi
t=$SECONDS
python3 - "$TOK" "$W" "$ITERS" "$GBS" <<'EOF' >"$OUT/tps_make_model.log" 2>&1 || { echo "TPS model/data creation failed"; tail -5 "$OUT/tps_make_model.log"; exit 1; }
import json, os, random, shutil, sys
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
tok_dir, w, iters, gbs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
mdir, data = os.path.join(w, 'model1b'), os.path.join(w, 'long.jsonl')
tok = AutoTokenizer.from_pretrained(tok_dir)
if not os.path.exists(os.path.join(mdir, 'config.json')):
    os.makedirs(mdir, exist_ok=True)
    cfg = LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=8192,
                      rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    with torch.device('cuda'):
        model = LlamaForCausalLM(cfg)
    model.to(torch.bfloat16).save_pretrained(mdir, safe_serialization=True)
    for f in os.listdir(tok_dir):
        if f.startswith(('tokenizer', 'special_tokens')):
            shutil.copy(os.path.join(tok_dir, f), mdir)
    print(f'model: {sum(p.numel() for p in model.parameters()) / 1e9:.3f} B params -> {mdir}')
words = ('the of and to in is that for it as with was on be by this are or from an at which not but have all can '
         'one more other were has when there their will if so no into its than them these some may would what '
         'time only new used two first been any each value list file data object return function class module '
         'string number default name type error path method set call argument system line result same given '
         'instance attribute python code example use format mode size read write open close text buffer').split()
rng = random.Random(0)
sample = ' '.join(rng.choice(words) for _ in range(3000))
per_word = len(tok(sample)['input_ids']) / 3000
n_words = int(8192 * 1.25 / per_word) + 64  # every row longer than S=8192 tokens
rows = gbs * (iters + 2)
with open(data, 'w') as f:
    for _ in range(rows):
        f.write(json.dumps({'messages': [{'role': 'assistant', 'content': ' '.join(rng.choice(words) for _ in range(n_words))}]}) + '\n')
print(f'data: {rows} rows of ~{int(n_words * per_word)} tokens -> {data}')
EOF
echo "TPS setup: $(grep -E '^(model|data):' "$OUT/tps_make_model.log" | tr '\n' ' ') in $((SECONDS - t)) s"

run() { # run NAME GPU K S PORT
  local name=$1 gpu=$2 k=$3 s=$4 port=$5 od=$W/runs/$1 t=$SECONDS
  rm -rf "$od"
  mkdir -p "$od"
  CUDA_VISIBLE_DEVICES=$gpu NPROC_PER_NODE=1 MASTER_PORT=$port HF_DATASETS_CACHE="$W/cache/$name" \
    megatron pt --model "$W/model1b" --model_type llama3_2_plt --custom_register_path custom_model/llama.py \
    --patch_size "$k" --template llama --dataset "$W/long.jsonl" --max_length "$s" --truncation_strategy right \
    --micro_batch_size "$MBS" --global_batch_size "$GBS" --train_iters "$ITERS" \
    --lr 1e-4 --min_lr 1e-5 --lr_warmup_iters 2 --attention_backend fused --bf16 true --seed 42 \
    --logging_steps 1 --save_steps 1000000 --no_save_optim true --no_save_rng true --save_safetensors false \
    --output_dir "$od" --dataloader_num_workers 2 --dataset_num_proc 8 --report_to tensorboard \
    >"$OUT/tps_$name.log" 2>&1
  echo $? >"$od/rc"
  echo $((SECONDS - t)) >"$od/secs"
  local f
  f=$(ls "$od"/*/logging.jsonl 2>/dev/null | head -1)
  [ -n "$f" ] && cp "$f" "$OUT/tps_$name.logging.jsonl"
}
if [ "$GPU_K4" != "$GPU_K1" ]; then
  run k4_s8192 "$GPU_K4" 4 8192 29641 &
  run k1_s2048 "$GPU_K1" 1 2048 29642 &
  wait
else
  run k4_s8192 "$GPU_K4" 4 8192 29641
  run k1_s2048 "$GPU_K1" 1 2048 29642
fi
python3 tests/gpu/summarize.py tps "K4_S8192=$W/runs/k4_s8192:$((GBS * 8192))" \
  "K1_S2048=$W/runs/k1_s2048:$((GBS * 2048))" --warm "$WARM"
