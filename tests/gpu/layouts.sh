#!/usr/bin/env bash
# PLT (llama3_2_plt, K=4) and the critic in Megatron's parallel layouts, one command (from anywhere; logs and
# $OUT/layouts_summary.txt in $OUT, default ./gpu_results/layouts):
#     bash tests/gpu/layouts.sh
# What runs depends on the GPUs visible (NGPU=n uses only the first n); the parts that need more GPUs than visible
# get a SKIP line:
#   1 GPU  : the 1B-shape model (Llama-3.2-1B shape, random init, real Llama-3 tokenizer if given) at K=4,
#            max_length 8192, --packing true with --streaming true vs the same without streaming (both at once on
#            GPU 0): step-1 loss (same range; the two data paths pack different rows, see below), falling curves,
#            tokens/s and peak memory side by side.
#   2 GPUs : the 1B shape with the reference command's flags (--packing --streaming, max_length 8192, K=4) at TP2+SP
#            against 1 GPU, and the tiny-model matrix, each layout against its 1-GPU reference on the same
#            data/seed/global batch (PAR, default 4, 2-GPU runs at a time on the same GPUs: start-up dominates):
#            TP2+SP, CP2 zigzag packed, CP2 zigzag THD, CP2 contiguous (must be refused), PP2+VPP2, DP2 (PLT K=4, megatron pt); critic DP2
#            (megatron sft --model_type llama3_2_critic); critic engine CP2 (MegatronCritic, critic_checks.py);
#            the family part (K=4, toy widths, the family's own --model_type): qwen3_moe EP2, TP2+SP, PP2 and
#            TP2+SP x EP2; deepseek_v3 (MLA) TP2+SP and EP2; qwen3 CP2 THD (only these: LAYOUTS="moe_ep2
#            moe_tp2_sp moe_pp2 moe_tp2_ep2 mla_tp2_sp mla_ep2 qwen3_cp2"); when named in LAYOUTS, qwen3_next
#            (Gated-DeltaNet hybrid, mcore qwen3_next_plt) TP2+SP and EP2, qwen3_5 TP2+SP and qwen3_5_moe EP2
#            (mcore qwen3_5_plt): LAYOUTS="next_tp2_sp next_ep2 q35_tp2_sp q35moe_ep2"; context parallel of the
#            hybrids (megatron-core >= 0.18), also only when named: qwen3_5 and qwen3_5_moe CP2 (q35_cp2, q35moe_cp2;
#            on 4 GPUs also TP2 x CP2: q35_tp2_cp2, and TP2+SP x CP2: q35moe_tp2_cp2, each against the same
#            1-GPU reference; with a hybrid CP layout named, the toy hybrids get 4 linear key heads, TP x CP); a long
#            document (q35long_cp2: the Qwen3.5-27B cut at its published widths, make_family_configs.py without
#            --tiny, LONG_LEN=32768 tokens a sample = 8192 patches at K=4, GBS 2, LONG_ITERS steps) at CP2 against
#            1 GPU, with peak memory (a 1-GPU OOM is reported as such); and a probe, not a check
#            (q35_stock_cp2_thd): stock Qwen3.5 (K=1, plugin active) padding-free (THD) on fla at CP2 for 2 steps,
#            its outcome or error line in the summary. The hybrids' Gated DeltaNet (HYBRID_GDN=auto|fla|torch,
#            default auto): where fla refuses its backward on this GPU and Triton (Hopper with Triton 3.4.0 to
#            3.7.0, no tilelang: swift_plt.plugin.arguments.fla_hopper_problem) megatron-core's torch path, padded
#            batches: --padding_free false --megatron_extra_kwargs '{"deterministic_mode": true}' with
#            NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 on every hybrid run (references alike; the summary says which);
#            else fla's kernels. LAYOUTS="q35_cp2 q35moe_cp2 q35_tp2_cp2 q35moe_tp2_cp2 q35long_cp2
#            q35_stock_cp2_thd" (the long run: 1 GPU on GPU 3 and CP2 on GPUs 1,2 at once on 4 GPUs, one after
#            the other on 2). In a CPU dry run CP needs the harness's CP attention (SWIFT_PLT_CPU_CP_ATTENTION=zigzag)
#            and the long run takes the toy widths and LONG_LEN=256 (Qwen3.5's processor needs qwen_vl_utils and
#            torchvision there too).
#   4 GPUs : also the reference command (TP=4 + SP, --packing true --streaming true --max_length 8192
#            --patch_size 4, 1B shape) against the same command on 1 GPU, and tiny TP2+CP2, TP2+PP2+SP (these four
#            runs at once, after the tiny 1-GPU reference); in the
#            matrix above (same waves, 4-GPU runs on GPUs 0-3), each against the 1-GPU reference of its 2-GPU
#            kin: qwen3_moe EP4, TP2+SP x EP2 (DP2), PP2 x EP2, EP2 x DP2 with the distributed optimizer;
#            deepseek_v3 (MLA + MoE) TP2+SP x EP2, PP2 x EP2; the critic (megatron sft) TP2 x PP2 and, for a MoE
#            critic (qwen3_moe_critic, toy widths, critic_families.py make), EP4; MegatronCritic TP2 x DP2
#            (critic_checks.py): LAYOUTS="moe_ep4 moe_tp2_ep2_dp2 moe_pp2_ep2 moe_ep2_dp2_dopt mla_tp2_ep2
#            mla_pp2_ep2 critic_tp2_pp2 critic_moe_ep4 critic_engine_tp2_dp2". ms-swift 4.6 defaults to
#            --use_distributed_optimizer true (every run here has it; moe_ep2_dp2_dopt names it); a CPU dry run
#            turns it off (lib.sh), and there mla_tp2_ep2 fails at load (the harness's MLA under TP) and tp2_cp2 at
#            build (context parallelism needs TE's attention), not on GPUs.
# Pass per layout: step-1 loss within LTOL (default 1e-2, bf16) of its 1-GPU reference and a falling curve. Every
# run also reports tokens/s (GBS x max_length slots per step, after WARM steps) and peak memory (ms-swift's
# memory(GiB)). Logs in $OUT, the summary in $OUT/layouts_summary.txt (appended as it goes), last line
# "LAYOUTS: OK|FAIL (n/m)".
# env: OUT, BUDGET (s, default 580), NGPU, LTOL, ITERS (tiny runs, 30), ITERS_1B (30), PAR (4), WARM (3), LAYOUTS (space-separated
#      subset of the names below; default all that fit the GPUs), HYBRID_CAP (600 s: a hybrid run's cap),
#      HYBRID_GDN, LONG_LEN (32768), LONG_ITERS (8), LONG_TINY (1: toy widths for the long run),
#      LLAMA3_TOK (dir with the real Llama-3
#      tokenizer.json; or LLAMA3_TIKTOKEN=tokenizer.model + LLAMA3_CONVERT=convert_llama3_tokenizer.py to build it;
#      else the tiny tokenizer is used and the summary says so), LAYOUTS_TEXT (a text file for the 1B data; else
#      synthetic word rows), EXTRA_PT_ARGS (appended to every megatron command; the last flag wins, e.g. for a CPU
#      dry run), LAYOUTS_WORK (scratch dir), SWIFT_PLT_GPU_ENV, SWIFT_PLT_GPU_DRY_RUN (lib.sh); for a CPU dry run of
#      this script only: SHAPE_1B=tiny, MAXLEN_1B, DOCS_1B.
# --dataset_num_proc 2 for the 1B runs: under --streaming --packing each of them is a packing worker that ms-swift
# starts with the 'spawn' context once torch.distributed is up (swift/dataset/packing.py), one after another, each
# importing ms-swift and unpickling the template before the next starts; with 8 the streaming run had not reached
# step 1 after 168 s on an H100 (on CPU the workers came up ~35 s apart).
# Streaming note: ms-swift packs a streaming dataset in windows of 128 rows (IterablePackingDataset), the
# non-streaming one over the whole shuffled dataset (PackingDataset), so their step-1 batches differ: on 1 GPU the
# comparison shows both paths train at K=4 (every packed row is checked patch-aligned by the plugin before the model)
# with losses in the same range, not equality. Equality of layouts is on the same data path.
set -o pipefail
set -m

# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_init layouts layouts_summary.txt "${LAYOUTS_WORK:-/tmp/swift_plt_gpu/layouts}" 580 1
SUMPY="env LOGDIR=$OUT python3 $REPO/tests/gpu/summarize.py"
CHECK="python3 $REPO/tests/gpu/critic_checks.py"
LTOL=${LTOL:-1e-2}
ITERS=${ITERS:-30}
ITERS_1B=${ITERS_1B:-30}
WARM=${WARM:-3}
R=$W/runs

TINY=$W/tiny
if [ "$NGPU" -ge 2 ]; then
  critic_setup || { check setup 1; finish; } # $W/tiny/model (+data), critic rows, $W/critic
else # 1 GPU: only the 1B runs (no critic, no tiny matrix)
  make_tiny "$TINY"
  rc=$?
  say "0 setup: tiny rc=$rc; $(now)"
  [ $rc = 0 ] || { check setup 1; finish; }
fi

FAMILY_LAYOUTS="moe_ep2 moe_tp2_sp moe_pp2 moe_tp2_ep2 mla_tp2_sp mla_ep2 qwen3_cp2"
# the hybrids' layouts run only when named in LAYOUTS: fla 0.6's Gated DeltaNet backward refuses Triton < 3.7.1 on
# Hopper GPUs (H100 / H200), and torch 2.11 comes with Triton 3.6 (tests/gpu/README.md, Last results)
HYBRID_LAYOUTS="next_tp2_sp next_ep2 q35_tp2_sp q35moe_ep2 q35_cp2 q35moe_cp2 q35long_cp2 q35_stock_cp2_thd"
# the hybrids' 4-GPU layouts (GPUs 0-3), also only when named
HYBRID_FOUR="q35_tp2_cp2 q35moe_tp2_cp2"
# the 4-GPU runs of the matrix (GPUs 0-3)
FOUR_LAYOUTS="moe_ep4 moe_tp2_ep2_dp2 moe_pp2_ep2 moe_ep2_dp2_dopt mla_tp2_ep2 mla_pp2_ep2 critic_tp2_pp2 critic_moe_ep4
  critic_engine_tp2_dp2"
FOUR_LAYOUTS=$(echo $FOUR_LAYOUTS)
if [ -z "${LAYOUTS:-}" ]; then
  case $NGPU in
  0) LAYOUTS="" ;;
  1) LAYOUTS="stream1b" ;;
  2 | 3) LAYOUTS="tp2_sp_1b tp2_sp cp2_zigzag_packed cp2_thd cp2_contiguous pp2_vpp2 dp2 critic_dp2 critic_engine_cp2 $FAMILY_LAYOUTS" ;;
  *) LAYOUTS="tp2_sp cp2_zigzag_packed cp2_thd cp2_contiguous pp2_vpp2 dp2 critic_dp2 critic_engine_cp2 $FAMILY_LAYOUTS tp4_sp_1b tp2_cp2 tp2_pp2_sp $FOUR_LAYOUTS" ;;
  esac
fi
want() { [[ " $LAYOUTS " == *" $1 "* ]]; }
# the most a run may take: 200 s; a hybrid's HYBRID_CAP (600 s: its first step compiles fla's kernels on a cold
# Triton cache, minutes when several runs compile at once)
cap_of() { case ${1%%_*} in next | q35 | q35moe | q35long) echo "${HYBRID_CAP:-600}" ;; *) echo 200 ;; esac; }
say "layouts: ${LAYOUTS:-(none)}"
[ "$NGPU" -lt 2 ] && skip "tp2_sp_1b tp2_sp cp2_zigzag_packed cp2_thd cp2_contiguous pp2_vpp2 dp2 critic_dp2 critic_engine_cp2 $FAMILY_LAYOUTS $HYBRID_LAYOUTS" \
  "2-GPU part: needs 2 GPUs, $NGPU visible"
[ "$NGPU" -lt 4 ] && skip "tp4_sp_1b tp2_cp2 tp2_pp2_sp $FOUR_LAYOUTS $HYBRID_FOUR" "4-GPU part: needs 4 GPUs, $NGPU visible"

# the hybrids' Gated DeltaNet: fla's kernels, or megatron-core's torch path where fla refuses its backward here
HYBRID_GDN=${HYBRID_GDN:-auto}
if [[ " $LAYOUTS " == *" next_"* || " $LAYOUTS " == *" q35"* ]]; then
  if [ "$HYBRID_GDN" = auto ]; then
    gdn_why=$(python3 - 2>&1 <<'EOF' | tail -1
import importlib.util
import torch
if not torch.cuda.is_available():
    print('fla (no CUDA)')
elif importlib.util.find_spec('tilelang') is not None:
    print('fla (tilelang installed)')
else:
    import triton
    from swift_plt.plugin.arguments import fla_hopper_problem
    cap = torch.cuda.get_device_capability(0)
    bad = fla_hopper_problem(cap, triton.__version__)
    print(f'{"torch" if bad else "fla"} (Triton {triton.__version__}, compute capability {cap[0]}.{cap[1]}'
          f'{": fla refuses its backward here" if bad else ""})')
EOF
    )
    HYBRID_GDN=${gdn_why%% *}
    case $HYBRID_GDN in torch | fla) ;; *) gdn_why="fla (could not tell: $gdn_why)" HYBRID_GDN=fla ;; esac
  else
    gdn_why="$HYBRID_GDN (HYBRID_GDN given)"
  fi
  if [ "$HYBRID_GDN" = torch ]; then
    say "hybrids' Gated DeltaNet: megatron-core's torch path, padded batches (${TORCH_GDN[*]}, NVTE_ALLOW_NONDETERMINISTIC_ALGO=0) ${gdn_why#* }"
  else
    say "hybrids' Gated DeltaNet: fla's kernels, padding-free (THD) rows ${gdn_why#* }"
  fi
fi
# is_hybrid NAME: a hybrid's run (gets the torch path's flags when chosen); the stock THD probe keeps fla
is_hybrid() { case ${1%%_*} in next | q35 | q35moe | q35long) [ "$1" != q35_stock_cp2_thd ] ;; *) return 1 ;; esac; }

# ------------------------------------------------------------------------------------------------ runs
TINY_COMMON=(--patch_size 4 --dataset "$TINY/data/train.jsonl" --max_length 512 --attention_backend fused
  --micro_batch_size 2 --global_batch_size 8 --seed 42 --lr 1e-3 --min_lr 1e-4 --lr_warmup_iters 2 --bf16 true
  --torch_dtype bfloat16 --logging_steps 1 --train_iters "$ITERS" --save_steps 1000000 --no_save_optim true
  --no_save_rng true --save_safetensors false --dataloader_num_workers 2 --dataset_num_proc 4 --report_to tensorboard)
TINY_ARGS=(--model "$TINY/model" --model_type llama3_2_plt --custom_register_path custom_model/llama.py
  --template llama "${TINY_COMMON[@]}")
# the family part: toy-width models of three structures (tests/gpu/make_family_configs.py --tiny), K=4, the stock
# `--model_type` of each family (mcore gpt_plt): qwen3_moe (8 experts, top-2), deepseek_v3 (MLA, shared expert,
# group-limited sigmoid routing, a dense first layer), qwen3 (QK-norm), qwen3_next (3 Gated DeltaNet layers + 1 gated
# attention, 8 experts top-2 and a shared expert; mcore qwen3_next_plt; no CP: megatron-core 0.16's GDN has none)
FAM=$W/families
declare -A FAM_DIR=([moe]=qwen3-30b-a3b-cut [mla]=deepseek-v3-cut [qwen3]=qwen3-1.7b [next]=qwen3-next-80b-a3b-cut
  [q35]=qwen3.5-27b-cut [q35moe]=qwen3.5-35b-a3b-cut)
declare -A FAM_TYPE=([moe]=qwen3_moe [mla]=deepseek_v3 [qwen3]=qwen3 [next]=qwen3_next [q35]=qwen3_5 [q35moe]=qwen3_5_moe)
base_args() { # base_args NAME: BASE=(the run's model and data flags): NAME's prefix moe_/mla_/qwen3_ = a family
  local fam=${1%%_*}
  if [ -n "${FAM_TYPE[$fam]:-}" ]; then
    BASE=(--model "$FAM/${FAM_DIR[$fam]}" --model_type "${FAM_TYPE[$fam]}"
      --template "$(family_template "${FAM_TYPE[$fam]}")" "${TINY_COMMON[@]}")
  else
    BASE=("${TINY_ARGS[@]}")
  fi
}
CRITIC_ARGS=(--model "$W/critic" --model_type llama3_2_critic --custom_register_path custom_model/llama.py
  --template chatml --dataset "$W/reward.jsonl" --max_length 256 --micro_batch_size 4 --global_batch_size 16 --seed 42
  --attention_backend fused --lr 2e-3 --min_lr 1e-4 --lr_warmup_iters 2 --torch_dtype bfloat16 --logging_steps 1
  --train_iters "$ITERS" --save_steps 100000 --no_save_optim true --no_save_rng true --save_safetensors false
  --dataloader_num_workers 2 --dataset_num_proc 4)
# the MoE critic (critic_moe_*): the tiny qwen3_moe structure as a critic, $W/moe_critic (made when named)
MOE_CRITIC_ARGS=(--model "$W/moe_critic" --model_type qwen3_moe_critic "${CRITIC_ARGS[@]:4}")

run() { # run NAME GPUS CAP_S CMD -- args...: megatron CMD (pt|sft) on GPUS, logs $OUT/NAME.log, rc/secs in $R/NAME
  local name=$1 gpus=$2 capped=$3 cmd=$4 n od f t=$SECONDS rc det=${NVTE_ALLOW_NONDETERMINISTIC_ALGO:-1}
  shift 5
  if is_hybrid "$name" && [ "$HYBRID_GDN" = torch ]; then # megatron-core's torch Gated DeltaNet: its flags last
    set -- "$@" "${TORCH_GDN[@]}"
    det=0 # megatron's TEDotProductAttention refuses deterministic_mode otherwise
  fi
  n=$(($(echo "$gpus" | tr -cd , | wc -c) + 1))
  od=$R/$name
  rm -rf "$od"
  mkdir -p "$od" "$W/cache/$name"
  if [ "$(left)" -lt 30 ]; then
    echo "budget" >"$od/rc"
    echo "skipped (budget)"
    return 1
  fi
  # own dataset caches: concurrent runs must not race on the same cache files
  CUDA_VISIBLE_DEVICES=$(dev "$gpus") NPROC_PER_NODE=$n MASTER_PORT=${RUN_PORT:-$((29800 + RANDOM % 150))} \
    NVTE_ALLOW_NONDETERMINISTIC_ALGO=$det HF_DATASETS_CACHE="$W/cache/$name/hf" MODELSCOPE_CACHE="$W/cache/$name/ms" \
    timeout -k 10 "$(cap "$capped")" megatron "$cmd" "$@" --output_dir "$od" ${EXTRA_PT_ARGS:-} >"$OUT/$name.log" 2>&1
  rc=$?
  echo $rc >"$od/rc"
  echo $((SECONDS - t)) >"$od/secs"
  f=$(ls "$od"/*/logging.jsonl 2>/dev/null | head -1)
  [ -n "$f" ] && cp "$f" "$OUT/$name.logging.jsonl"
  echo "rc=$rc $((SECONDS - t))s"
}
# compare LABEL REF NAME TOKENS_PER_STEP: step-1 loss vs REF (LTOL), curve, tokens/s + memory; counts one check
compare() {
  local label=$1 ref=$2 name=$3 tok=$4 rc=0
  say "-- $label"
  $SUMPY compare "$LTOL" "1GPU=$R/$ref" "$name=$R/$name" 2>&1 | tee -a "$SUM" || rc=1
  $SUMPY curve "   $name curve" "$R/$name" "$OUT/$name.log" 2>&1 | tee -a "$SUM" || rc=1
  $SUMPY tps "$name=$R/$name:$tok" "1GPU=$R/$ref:$tok" --warm "$WARM" 2>&1 | tee -a "$SUM"
  [ "$(cat "$R/$name/rc" 2>/dev/null)" = 0 ] && [ "$(cat "$R/$ref/rc" 2>/dev/null)" = 0 ] || rc=1
  check "$name" $rc
}
TINY_TOK=$((8 * 512))

# ------------------------------------------------------------------------------- 1B shape (1 GPU / 4 GPUs)
make_1b() { # -> $W/model1b, $W/docs.jsonl (documents of 1/40 to 1/2 max_length words: packing joins several per row)
  local tok=${LLAMA3_TOK:-}
  if [ -z "$tok" ] && [ -n "${LLAMA3_TIKTOKEN:-}" ] && [ -n "${LLAMA3_CONVERT:-}" ]; then
    python3 "$LLAMA3_CONVERT" "$W/llama3_tok" "$LLAMA3_TIKTOKEN" >"$OUT/llama3_tok.log" 2>&1 && tok=$W/llama3_tok
  fi
  if [ -n "$tok" ] && [ -f "$tok/tokenizer.json" ]; then
    say "1B: real Llama-3 tokenizer from $tok"
  else
    say "1B: NO Llama-3 tokenizer given (LLAMA3_TOK / LLAMA3_TIKTOKEN+LLAMA3_CONVERT): using the tiny tokenizer"
    tok=$TINY/model
  fi
  python3 - "$tok" "$W" "${LAYOUTS_TEXT:-}" <<'EOF' >"$OUT/make_1b.log" 2>&1
import json, os, random, shutil, sys
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
tok_dir, w, text = sys.argv[1], sys.argv[2], sys.argv[3]
mdir = os.path.join(w, 'model1b')
tok = AutoTokenizer.from_pretrained(tok_dir)
os.makedirs(mdir, exist_ok=True)
shape = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
             num_key_value_heads=8, head_dim=64)  # Llama-3.2-1B
if os.environ.get('SHAPE_1B') == 'tiny':  # CPU dry run of this script only
    shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16)
cfg = LlamaConfig(vocab_size=max(len(tok), 128256) if len(tok) > 100000 else len(tok), max_position_embeddings=8192,
                  rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **shape)
torch.manual_seed(0)
with torch.device('cuda' if torch.cuda.is_available() else 'cpu'):
    model = LlamaForCausalLM(cfg)
model.to(torch.bfloat16).save_pretrained(mdir, safe_serialization=True)
for f in os.listdir(tok_dir):
    if f.startswith(('tokenizer', 'special_tokens')):
        shutil.copy(os.path.join(tok_dir, f), mdir)
print(f'model: {sum(p.numel() for p in model.parameters()) / 1e9:.3f} B params, vocab {cfg.vocab_size} -> {mdir}')
rng = random.Random(0)
maxlen = int(os.environ.get('MAXLEN_1B', 8192))
if text and os.path.exists(text):
    words = open(text, encoding='utf-8', errors='replace').read().split()
    src = 'text ' + os.path.basename(text)
else:
    words = ('the of and to in is that for it as with was on be by this are or from an at which not but have all '
             'can one more other were has when there their will if so no into its than them these some may would '
             'what time only new used two first been any each value list file data object return').split() * 50
    rng.shuffle(words)
    src = 'synthetic words'
docs, i = [], 0
while len(docs) < int(os.environ.get('DOCS_1B', 1000)):  # ~3 M words: enough rows for 30 steps of 8 x 8192 tokens with packing
    n = rng.randint(maxlen // 40, maxlen // 2)  # words; ~1.3 Llama-3 tokens per word: documents fit max_length
    if i + n > len(words):
        i = 0
    docs.append(' '.join(words[i:i + n]))
    i += n
with open(os.path.join(w, 'docs.jsonl'), 'w') as f:
    for d in docs:
        f.write(json.dumps({'messages': [{'role': 'assistant', 'content': d}]}) + '\n')
print(f'data: {len(docs)} documents of {maxlen // 40}-{maxlen // 2} words from {src}')
EOF
  say "1B setup: rc=$? $(grep -E '^(model|data):' "$OUT/make_1b.log" | tr '\n' ' '); $(now)"
}
ARGS_1B() { # ARGS_1B: the reference command's flags (besides parallelism)
  echo --model "$W/model1b" --model_type llama3_2_plt --custom_register_path custom_model/llama.py --patch_size 4 \
    --template llama --dataset "$W/docs.jsonl" --max_length "${MAXLEN_1B:-8192}" --packing true --micro_batch_size 1 \
    --global_batch_size 8 --train_iters "$ITERS_1B" --lr 3e-4 --min_lr 3e-5 --lr_warmup_iters 2 --bf16 true \
    --torch_dtype bfloat16 --attention_backend fused --seed 42 --logging_steps 1 --save_steps 1000000 \
    --no_save_optim true --no_save_rng true --save_safetensors false --dataloader_num_workers 2 --dataset_num_proc 2 \
    --report_to tensorboard
}
TOK_1B=$((8 * ${MAXLEN_1B:-8192}))

if want stream1b; then
  make_1b
  say "== 1B shape, K=4, max_length ${MAXLEN_1B:-8192}, --packing true: streaming vs not (both at once on GPU 0), $(now)"
  # shellcheck disable=SC2046
  (run stream1b 0 200 pt -- $(ARGS_1B) --streaming true >"$W/stream1b.rc") &
  P1=$!
  # shellcheck disable=SC2046
  (run nostream1b 0 200 pt -- $(ARGS_1B) >"$W/nostream1b.rc") &
  P2=$!
  wait $P1 $P2
  say "-- streaming $(cat "$W/stream1b.rc"), not streaming $(cat "$W/nostream1b.rc"); $(now)"
  rc=0
  # 'same range': LTOL on step 1 is loose enough for two different first batches of a random-init model
  $SUMPY compare "$LTOL" "nostream=$R/nostream1b" "stream=$R/stream1b" 2>&1 | tee -a "$SUM" || rc=1
  for n in stream1b nostream1b; do $SUMPY curve "   $n curve" "$R/$n" "$OUT/$n.log" 2>&1 | tee -a "$SUM" || rc=1; done
  $SUMPY tps "stream=$R/stream1b:$TOK_1B" "nostream=$R/nostream1b:$TOK_1B" --warm "$WARM" 2>&1 | tee -a "$SUM"
  say "   (tokens/s: both runs share GPU 0; slots = GBS x max_length per step)"
  [ "$(cat "$R/stream1b/rc" 2>/dev/null)" = 0 ] && [ "$(cat "$R/nostream1b/rc" 2>/dev/null)" = 0 ] || rc=1
  check stream1b $rc
fi

# ------------------------------------------------------------------------------- 2 GPUs: the tiny matrix
# Every run of the matrix is independent until the comparisons, and a tiny-model run is ~55 s of start-up for a few
# seconds of GPU work, so they run PAR at a time on the same 2 GPUs (all 1-GPU references first, with the first
# wave). Correctness checks are unaffected; tokens/s of these runs is with PAR runs sharing the GPUs (the summary
# says so), memory is per process.
if [ "$NGPU" -ge 2 ] && [ -n "$LAYOUTS" ] && ! [ "$LAYOUTS" = stream1b ]; then
  PAR=${PAR:-4}
  say "== 2-GPU matrix: references and layouts, $PAR 2-GPU runs at a time on GPUs 0,1 (4-GPU layouts on GPUs 0-3; tokens/s: shared GPUs), $(now)"
  PIDS=()
  spawn() { # spawn NAME GPUS CAP CMD -- args: `run` in the background on its own port; rc line in $W/NAME.rc
    local name=$1
    PORT_N=$((${PORT_N:-0} + 1))
    (RUN_PORT=$((29600 + 7 * PORT_N)) run "$@" >"$W/$name.rc") &
    PIDS+=($!)
  }
  engine() { # engine NAME GPUS NPROC [mg-kwargs]: tests/gpu/critic_checks.py (MegatronCritic) -> $OUT/NAME.json
    local name=$1 gpus=$2 np=$3 kw=${4:-'{}'}
    PORT_N=$((${PORT_N:-0} + 1))
    if [ "${SWIFT_PLT_GPU_DRY_RUN:-0}" = 1 ]; then # the harness's CPU kwargs (lib.sh), the layout's on top
      kw=$(python3 -c 'import json, sys; print(json.dumps({**json.loads(sys.argv[1]), **json.loads(sys.argv[2])}))' \
        "${ENGINE_MG_KWARGS:-{\}}" "$kw")
    fi
    (
      CUDA_VISIBLE_DEVICES=$(dev "$gpus") timeout -k 10 "$(cap 200)" torchrun --nproc_per_node "$np" \
        --master_port $((29600 + 7 * PORT_N)) tests/gpu/critic_checks.py --model "$W/critic" --json "$OUT/$name.json" \
        --mg-kwargs "$kw" --dtype "${ENGINE_DTYPE:-bf16}" >"$OUT/$name.log" 2>&1
      echo "rc=$?" >"$W/$name.rc"
    ) &
    PIDS+=($!)
  }
  # the 1B shape with the reference command's flags at TP2+SP against 1 GPU (both --streaming): a chain of its own
  # (model and data first, then both runs at once), waited for at the end
  P1B=
  if want tp2_sp_1b; then
    (
      make_1b
      # shellcheck disable=SC2046
      (RUN_PORT=29590 run ref_1b 1 300 pt -- $(ARGS_1B) --streaming true >"$W/ref_1b.rc") &
      # shellcheck disable=SC2046
      (RUN_PORT=29595 run tp2_sp_1b 0,1 300 pt -- $(ARGS_1B) --streaming true --tensor_model_parallel_size 2 \
        --sequence_parallel true >"$W/tp2_sp_1b.rc") &
      wait
    ) &
    P1B=$!
  fi
  # the 1-GPU references (THD default on GPU 0; --packing and the critic on GPU 1)
  if want tp2_sp || want cp2_thd || want pp2_vpp2 || want dp2 || want tp2_cp2 || want tp2_pp2_sp; then
    spawn ref 0 200 pt -- "${TINY_ARGS[@]}"
  fi
  # the --packing reference pads documents as the CP2 run does, so it packs the same rows (tests/gpu/pack_as_cp)
  want cp2_zigzag_packed && PYTHONPATH=$REPO/tests/gpu/pack_as_cp${PYTHONPATH:+:$PYTHONPATH} SWIFT_PLT_CPU_PACK_AS_CP=2 \
    spawn ref_packed 1 200 pt -- "${TINY_ARGS[@]}" --packing true
  if want critic_dp2 || want critic_tp2_pp2; then spawn critic_ref 1 200 sft -- "${CRITIC_ARGS[@]}"; fi
  if want critic_moe_ep4; then
    python3 tests/gpu/critic_families.py make --spec qwen3-30b-a3b-cut --tiny --layers 2 --out "$W/moe_critic" \
      >"$OUT/make_moe_critic.log" 2>&1
    say "moe critic: rc=$? $(sed -n 's/^critic: \(.*\) -> .*/\1/p' "$OUT/make_moe_critic.log"); $(now)"
    spawn critic_moe_ref 0 200 sft -- "${MOE_CRITIC_ARGS[@]}"
  fi
  fam_refs=()
  for f in moe mla qwen3 next q35 q35moe; do [[ " $LAYOUTS " == *" ${f}_"* ]] && fam_refs+=("$f"); done
  if [ ${#fam_refs[@]} -gt 0 ]; then
    dirs=$(for f in "${fam_refs[@]}"; do echo "${FAM_DIR[$f]}"; done | paste -sd,)
    # a hybrid under TP2 x CP2 splits its linear key heads over TP x CP (megatron-core's Gated DeltaNet: heads per
    # rank = heads // TP // CP): where a hybrid's CP layout is named, the toy widths get 4 key / 8 value heads
    # (else 2 / 4), the rest unchanged, for every layout of that family
    heads=
    for l in $LAYOUTS; do case $l in next_*cp2* | q35*cp2*) heads=4 ;; esac; done
    python3 - --tiny --out "$FAM" --only "$dirs" "$heads" >"$OUT/make_families.log" 2>&1 <<'EOF'
import sys
sys.path.insert(0, 'tests/gpu')
import make_family_configs as mfc
heads = sys.argv.pop()
if heads:
    for name in mfc.HYBRID:
        toy = mfc.FAMILIES[name][2]
        (toy['text_config'] if 'text_config' in toy else toy).update(linear_num_key_heads=int(heads),
                                                                     linear_num_value_heads=2 * int(heads))
sys.exit(mfc.main(sys.argv[1:]))
EOF
    say "families: rc=$? $dirs (toy widths${heads:+; hybrids with $heads linear key heads}) -> $FAM; $(now)"
    g=0
    for f in "${fam_refs[@]}"; do
      base_args "${f}_"
      spawn "${f}_ref" $g "$(cap_of "$f")" pt -- "${BASE[@]}"
      g=$((1 - g))
    done
  fi
  if want critic_engine_cp2 || want critic_engine_tp2_dp2; then engine engine_1gpu 0 1; fi
  # the 2-GPU layouts: NAME|REF|LABEL|flags (REF '-' = checked on its own below)
  MATRIX=(
    "tp2_sp|ref|TP2+SP|--tensor_model_parallel_size 2 --sequence_parallel true"
    "cp2_zigzag_packed|ref_packed|CP2 zigzag, --packing true|--context_parallel_size 2 --packing true"
    "cp2_thd|ref|CP2 zigzag, padding-free (THD)|--context_parallel_size 2"
    "cp2_contiguous|-|CP2 contiguous (must be refused)|--context_parallel_size 2 --cp_partition_mode contiguous"
    "pp2_vpp2|ref|PP2+VPP2 (4 layers: 1 per virtual stage)|--pipeline_model_parallel_size 2 --virtual_pipeline_model_parallel_size 2"
    "dp2|ref|DP2 (same global batch 8)|"
    "critic_dp2|critic_ref|critic DP2 (scalar rewards)|"
    "critic_engine_cp2|engine_1gpu|critic engine CP2 (MegatronCritic)|"
    "moe_ep2|moe_ref|qwen3_moe EP2|--expert_model_parallel_size 2"
    "moe_tp2_sp|moe_ref|qwen3_moe TP2+SP|--tensor_model_parallel_size 2 --sequence_parallel true"
    "moe_pp2|moe_ref|qwen3_moe PP2|--pipeline_model_parallel_size 2"
    "moe_tp2_ep2|moe_ref|qwen3_moe TP2+SP x EP2 (expert TP 1)|--tensor_model_parallel_size 2 --sequence_parallel true --expert_model_parallel_size 2 --expert_tensor_parallel_size 1"
    "mla_tp2_sp|mla_ref|deepseek_v3 (MLA) TP2+SP|--tensor_model_parallel_size 2 --sequence_parallel true"
    "mla_ep2|mla_ref|deepseek_v3 (MLA) EP2|--expert_model_parallel_size 2"
    "qwen3_cp2|qwen3_ref|qwen3 CP2 zigzag, padding-free (THD)|--context_parallel_size 2"
    "next_tp2_sp|next_ref|qwen3_next (Gated DeltaNet) TP2+SP|--tensor_model_parallel_size 2 --sequence_parallel true"
    "next_ep2|next_ref|qwen3_next (Gated DeltaNet) EP2|--expert_model_parallel_size 2"
    "q35_tp2_sp|q35_ref|qwen3_5 (Gated DeltaNet, multimodal checkpoint, text rows) TP2+SP|--tensor_model_parallel_size 2 --sequence_parallel true"
    "q35moe_ep2|q35moe_ref|qwen3_5_moe (Gated DeltaNet + MoE, multimodal checkpoint) EP2|--expert_model_parallel_size 2"
    "q35_cp2|q35_ref|qwen3_5 (Gated DeltaNet, multimodal checkpoint, text rows) CP2 zigzag|--context_parallel_size 2"
    "q35moe_cp2|q35moe_ref|qwen3_5_moe (Gated DeltaNet + MoE, multimodal checkpoint) CP2 zigzag|--context_parallel_size 2"
    "q35_stock_cp2_thd|-|stock qwen3_5 (K=1, plugin active), padding-free (THD) on fla, CP2, 2 steps (probe)|--context_parallel_size 2 --patch_size 1 --padding_free true --train_iters 2 --lr_warmup_iters 0"
  )
  # the 4-GPU layouts (GPUs 0-3), the same way; the data-parallel size is what the other sizes leave of 4
  [ "$NGPU" -ge 4 ] && MATRIX+=(
    "moe_ep4|moe_ref|qwen3_moe EP4 (DP4)|--expert_model_parallel_size 4"
    "moe_tp2_ep2_dp2|moe_ref|qwen3_moe TP2+SP x EP2 (expert TP 1), DP2|--tensor_model_parallel_size 2 --sequence_parallel true --expert_model_parallel_size 2 --expert_tensor_parallel_size 1"
    "moe_pp2_ep2|moe_ref|qwen3_moe PP2 x EP2 (DP2)|--pipeline_model_parallel_size 2 --expert_model_parallel_size 2"
    "moe_ep2_dp2_dopt|moe_ref|qwen3_moe EP2 x DP2 (DP4, expert DP2), distributed optimizer|--expert_model_parallel_size 2 --use_distributed_optimizer true"
    "mla_tp2_ep2|mla_ref|deepseek_v3 (MLA + MoE) TP2+SP x EP2 (expert TP 1)|--tensor_model_parallel_size 2 --sequence_parallel true --expert_model_parallel_size 2 --expert_tensor_parallel_size 1"
    "mla_pp2_ep2|mla_ref|deepseek_v3 (MLA + MoE) PP2 x EP2 (DP2)|--pipeline_model_parallel_size 2 --expert_model_parallel_size 2"
    "critic_tp2_pp2|critic_ref|critic TP2 x PP2 (scalar rewards)|--tensor_model_parallel_size 2 --pipeline_model_parallel_size 2"
    "critic_moe_ep4|critic_moe_ref|MoE critic (qwen3_moe_critic) EP4 (scalar rewards)|--expert_model_parallel_size 4"
    "critic_engine_tp2_dp2|engine_1gpu|critic engine TP2 x DP2 (MegatronCritic)|"
    "q35_tp2_cp2|q35_ref|qwen3_5 (Gated DeltaNet, multimodal checkpoint) TP2 x CP2 zigzag|--tensor_model_parallel_size 2 --context_parallel_size 2"
    "q35moe_tp2_cp2|q35moe_ref|qwen3_5_moe (Gated DeltaNet + MoE, multimodal checkpoint) TP2+SP x CP2 zigzag (megatron-core refuses MoE with TP without SP)|--tensor_model_parallel_size 2 --sequence_parallel true --context_parallel_size 2"
  )
  gpus_of() { [[ " $FOUR_LAYOUTS $HYBRID_FOUR " == *" $1 "* ]] && echo 0,1,2,3 || echo 0,1; }
  # the long document (q35long_cp2): the Qwen3.5-27B cut at its published widths (4.1 B; the toy widths in a dry
  # run or with LONG_TINY=1), LONG_LEN tokens a sample, K=4, GBS 2, at CP2 against 1 GPU: a chain of its own (model
  # and data, then both runs: at once on GPUs 3 and 1,2 with 4 GPUs, else one after the other), waited for at the end
  PLONG=
  if want q35long_cp2; then
    if [ "${SWIFT_PLT_GPU_DRY_RUN:-0}" = 1 ]; then LONG_TINY=${LONG_TINY:-1} LONG_LEN=${LONG_LEN:-256}; fi
    LONG_LEN=${LONG_LEN:-32768}
    LONG_ITERS=${LONG_ITERS:-8}
    (
      g1=0 gcp=0,1
      [ "$NGPU" -ge 4 ] && g1=3 gcp=1,2
      CUDA_VISIBLE_DEVICES=$(dev $g1) python3 tests/gpu/make_family_configs.py ${LONG_TINY:+--tiny} --out "$W/long" \
        --only qwen3.5-27b-cut >"$OUT/make_long.log" 2>&1 &&
        python3 - "$W/long/qwen3.5-27b-cut" "$W/long_docs.jsonl" "$LONG_LEN" >>"$OUT/make_long.log" 2>&1 <<'EOF'
import json, random, sys
from transformers import AutoTokenizer
mdir, out, n_tok = sys.argv[1], sys.argv[2], int(sys.argv[3])
tok = AutoTokenizer.from_pretrained(mdir)
words = ('the of and to in is that for it as with was on be by this are or from an at which not but have all can one '
         'more other were has when there their will if so no into its than them these some may would what time only '
         'new used two first been any each value list file data object return').split()
rng = random.Random(0)
with open(out, 'w') as f:
    for i in range(16):  # 16 documents, each longer than max_length: --truncation_strategy right cuts them to it
        doc = []
        while len(tok(' '.join(doc))['input_ids']) < n_tok + 64:
            doc += [rng.choice(words) for _ in range(max(64, n_tok // 4))]
        f.write(json.dumps({'messages': [{'role': 'assistant', 'content': ' '.join(doc)}]}) + '\n')
print(f'data: 16 documents of > {n_tok} tokens -> {out}')
EOF
      echo "rc=$?" >"$W/make_long.rc"
      LONG_ARGS=(--model "$W/long/qwen3.5-27b-cut" --model_type qwen3_5 --template qwen3_5 --patch_size 4
        --dataset "$W/long_docs.jsonl" --max_length "$LONG_LEN" --truncation_strategy right --attention_backend fused
        --micro_batch_size 1 --global_batch_size 2 --seed 42 --lr 3e-4 --min_lr 3e-5 --lr_warmup_iters 2 --bf16 true
        --torch_dtype bfloat16 --logging_steps 1 --train_iters "$LONG_ITERS" --save_steps 1000000 --no_save_optim true
        --no_save_rng true --save_safetensors false --dataloader_num_workers 1 --dataset_num_proc 2
        --report_to tensorboard)
      if [ "$NGPU" -ge 4 ]; then
        (RUN_PORT=29570 run q35long_ref $g1 "$(cap_of q35long)" pt -- "${LONG_ARGS[@]}" >"$W/q35long_ref.rc") &
        (RUN_PORT=29580 run q35long_cp2 $gcp "$(cap_of q35long)" pt -- "${LONG_ARGS[@]}" --context_parallel_size 2 \
          >"$W/q35long_cp2.rc") &
        wait
      else
        RUN_PORT=29570 run q35long_ref $g1 "$(cap_of q35long)" pt -- "${LONG_ARGS[@]}" >"$W/q35long_ref.rc"
        RUN_PORT=29580 run q35long_cp2 $gcp "$(cap_of q35long)" pt -- "${LONG_ARGS[@]}" --context_parallel_size 2 \
          >"$W/q35long_cp2.rc"
      fi
    ) &
    PLONG=$!
  fi
  n_wave=0 # 2-GPU runs in this wave (the first wave also has the references)
  for entry in "${MATRIX[@]}"; do
    IFS='|' read -r name ref label flags <<<"$entry"
    want "$name" || continue
    if [ "$n_wave" -ge "$PAR" ]; then
      wait "${PIDS[@]}"
      PIDS=()
      n_wave=0
      say "-- wave done, $(now)"
    fi
    # shellcheck disable=SC2086
    case $name in
    critic_dp2 | critic_tp2_pp2) spawn "$name" "$(gpus_of "$name")" 200 sft -- "${CRITIC_ARGS[@]}" $flags ;;
    critic_moe_ep4) spawn critic_moe_ep4 0,1,2,3 200 sft -- "${MOE_CRITIC_ARGS[@]}" $flags ;;
    critic_engine_cp2) engine engine_cp2 0,1 2 '{"context_parallel_size": 2}' ;;
    critic_engine_tp2_dp2) engine engine_tp2_dp2 0,1,2,3 4 '{"tensor_model_parallel_size": 2, "global_batch_size": 2}' ;;
    *)
      base_args "$name"
      spawn "$name" "$(gpus_of "$name")" "$(cap_of "$name")" pt -- "${BASE[@]}" $flags
      ;;
    esac
    n_wave=$((n_wave + 1))
  done
  wait "${PIDS[@]}" $P1B $PLONG
  say "-- all runs done, $(now)"
  for f in "$W"/*.rc; do say "   $(basename "$f" .rc): $(cat "$f")"; done
  [ -d "$R/ref" ] && $SUMPY curve "   ref curve" "$R/ref" "$OUT/ref.log" 2>&1 | tee -a "$SUM"

  for entry in "${MATRIX[@]}"; do
    IFS='|' read -r name ref label flags <<<"$entry"
    want "$name" || continue
    case $name in
    cp2_contiguous) # refused at K>1 (README, Context parallel): must fail before step 1 with the message
      if [ "$(cat "$R/cp2_contiguous/rc")" != 0 ] &&
        grep -q -F -- '--cp_partition_mode contiguous with --context_parallel_size > 1' "$OUT/cp2_contiguous.log" &&
        ! grep -q "'loss'" "$OUT/cp2_contiguous.log"; then
        say "-- CP2 contiguous: refused before step 1 with the message (expected)"
        check cp2_contiguous 0
      else
        say "-- CP2 contiguous: NOT refused as expected (see cp2_contiguous.log)"
        check cp2_contiguous 1
      fi
      ;;
    q35_stock_cp2_thd) # a probe (upstream's behaviour at K=1), not a check: its outcome and first error line
      say "-- probe: $label: $(cat "$W/$name.rc" 2>/dev/null); steps logged: $(grep -c "'iteration'" "$OUT/$name.log")"
      say "   first AssertionError: $(grep -m1 -E 'AssertionError' "$OUT/$name.log" | cut -c1-300 || echo none)"
      # the first exception a rank raised (the launcher's ChildFailedError comes last)
      say "   first rank error: $(grep -m1 -E '^\[rank[0-9]+\]: [A-Za-z_.]*(Error|Exception)\b' "$OUT/$name.log" |
        cut -c1-300 || echo none)"
      say "   last error: $(env LOGDIR=$OUT python3 -c 'import sys; sys.path.insert(0, "tests/gpu"); import summarize
print(summarize.last_error(sys.argv[1]))' "$OUT/$name.log")"
      ;;
    critic_dp2 | critic_tp2_pp2 | critic_moe_ep4)
      # critic_checks --cp is the generic "n-GPU run vs 1 GPU" check (step-1 value_loss, curve, steps)
      say "-- $label vs 1 GPU"
      tag=$(echo "${name#critic_}" | sed 's/^moe_//; s/_/x/g' | tr a-z A-Z) # DP2, TP2xPP2, EP4
      $CHECK --cp "$label" "$OUT/$ref.log" "$OUT/$name.log" --ltol "$LTOL" \
        --min-drop 0.7 2>&1 | sed "s/^CP /$tag /; s/(CP=2)/($tag)/; s/ CP=2 / $tag /" | tee -a "$SUM"
      check "$name" $?
      ;;
    critic_engine_cp2 | critic_engine_tp2_dp2)
      say "-- $label vs 1 GPU: $(cat "$W/engine_1gpu.rc" 2>/dev/null) / $(cat "$W/engine_${name#critic_engine_}.rc" 2>/dev/null)"
      $CHECK --compare "$OUT/engine_1gpu.json" "$OUT/engine_${name#critic_engine_}.json" 2>&1 | tee -a "$SUM"
      check "$name" $?
      ;;
    *) compare "$label vs 1 GPU" "$ref" "$name" "$TINY_TOK" ;;
    esac
  done
  if want q35long_cp2; then
    say "== long document: qwen3_5 ${LONG_TINY:+toy }cut, $LONG_LEN tokens a sample ($((LONG_LEN / 4)) patches), K=4, GBS 2: $(cat "$W/make_long.rc" 2>/dev/null) $(grep -E '^(model|data):' "$OUT/make_long.log" | tr '\n' ' ')"
    if [ "$(cat "$R/q35long_ref/rc" 2>/dev/null)" != 0 ] &&
      grep -q -E 'OutOfMemoryError|CUDA out of memory' "$OUT/q35long_ref.log" 2>/dev/null; then
      say "-- long document: 1 GPU ran OUT OF MEMORY: $(grep -m1 -o -E '(torch\.OutOfMemoryError|CUDA out of memory)[^|]{0,160}' "$OUT/q35long_ref.log")"
      rc=0
      $SUMPY curve "   q35long_cp2 curve" "$R/q35long_cp2" "$OUT/q35long_cp2.log" 2>&1 | tee -a "$SUM" || rc=1
      $SUMPY tps "q35long_cp2=$R/q35long_cp2:$((2 * LONG_LEN))" --warm "$WARM" 2>&1 | tee -a "$SUM"
      [ "$(cat "$R/q35long_cp2/rc" 2>/dev/null)" = 0 ] || rc=1
      check q35long_cp2 $rc
    else
      compare "long document, K=4: CP2 vs 1 GPU (peak memory: the TPS lines)" q35long_ref q35long_cp2 $((2 * LONG_LEN))
    fi
  fi
  if want tp2_sp_1b; then
    compare "1B shape, --packing --streaming --max_length ${MAXLEN_1B:-8192} K=4: TP2+SP vs 1 GPU" ref_1b tp2_sp_1b \
      "$TOK_1B"
  fi
fi

# ------------------------------------------------------------------------------- 4 GPUs
if [ "$NGPU" -ge 4 ]; then
  # all at once through the matrix's spawn (the 1B pair shares GPU 0; a tiny run is mostly start-up): equality does
  # not depend on it, tokens/s of these runs is with the GPUs shared
  PIDS=()
  if want tp4_sp_1b; then
    make_1b
    say "== reference command (TP=4 + SP, --packing --streaming, 8192, K=4) and the tiny 4-GPU layouts, $(now)"
    # shellcheck disable=SC2046
    spawn ref_1b 0 300 pt -- $(ARGS_1B) --streaming true
    # shellcheck disable=SC2046
    spawn tp4_sp_1b 0,1,2,3 300 pt -- $(ARGS_1B) --streaming true --tensor_model_parallel_size 4 \
      --sequence_parallel true
  fi
  FOUR_TINY=()
  four() { # four NAME REF LABEL -- args: a tiny 4-GPU layout on GPUs 0-3, compared after the wait
    local name=$1 ref=$2 label=$3
    shift 4
    if want "$name"; then
      spawn "$name" 0,1,2,3 200 pt -- "${TINY_ARGS[@]}" "$@"
      FOUR_TINY+=("$name|$ref|$label")
    fi
  }
  four tp2_cp2 ref "TP2+CP2" -- --tensor_model_parallel_size 2 --context_parallel_size 2
  four tp2_pp2_sp ref "TP2+PP2+SP" -- --tensor_model_parallel_size 2 --pipeline_model_parallel_size 2 \
    --sequence_parallel true
  [ ${#PIDS[@]} -gt 0 ] && wait "${PIDS[@]}"
  if want tp4_sp_1b; then
    say "-- 1 GPU: $(cat "$W/ref_1b.rc"); TP4+SP: $(cat "$W/tp4_sp_1b.rc")"
    compare "reference command TP4+SP vs 1 GPU" ref_1b tp4_sp_1b "$TOK_1B"
  fi
  for entry in "${FOUR_TINY[@]}"; do
    IFS='|' read -r name ref label <<<"$entry"
    say "== $label: $(cat "$W/$name.rc")"
    compare "$label vs 1 GPU" "$ref" "$name" "$TINY_TOK"
  done
fi

finish
