#!/usr/bin/env bash
# The critic of each model family on GPU, ~5-6 min on 2 GPUs (from anywhere; summary $OUT/critic_families_summary.txt,
# every log in $OUT, default ./gpu_results/critic_families):
#     bash tests/gpu/critic_families.sh
# Per family (FAMILIES: make_family_configs.py names, published config.json, layers cut to LAYERS; `tiny:<family>`:
# swift_plt.tools.tiny_families at toy widths), one lane per family, the lanes side by side (family i on GPU i mod
# NGPU; on one GPU one lane after another, ~15 min: BUDGET 1200 there):
#   0. a random-init critic dir, the family's *ForTokenClassification, bf16, value head N(0, 1/H)
#      (tests/gpu/critic_families.py make: `critic_type` from config.json, swift_plt.critic.families)
#   then at once:
#   1. values: Megatron (`--model_type <family>_critic`, ms-swift + mcore-bridge + TE) in fp32 (unfused attention,
#      no TF32) and bf16 (fused) against transformers' *ForTokenClassification in fp32, on a fixed batch [2, 256]:
#      fp32 every token within 1e-4 max|v| (MoE: up to 1 % of the tokens over it, route ties); bf16 mean|d| <= 3e-2
#      mean|v| (dense also every token within 1e-1 max|v|) -> `CRITIC <tag> values fp32|bf16` lines
#      bf16 of a MoE or hybrid family (its record's moe / linear_attention): against the yardstick, HF's own bf16 vs
#      HF fp32: mean|d| <= max(3e-2, 1.5 x the yardstick's) mean|v| (critic_families.py: YARD_FACTOR; both printed)
#   (no --custom_register_path anywhere: the plugin registers the critic types when it activates)
#   2. export: `swift export --to_mcore`, then `--mcore_model ... --to_hf`: every tensor bit for bit as the original
#      dir, transformers loads it (no missing / unexpected key) with the original's values -> `CRITIC <tag> export`
#   3. `megatron sft --model_type <family>_critic` ITERS iterations bf16 on scalar rewards (critic_rows.py) from the
#      critic dir: value loss falling (critic_checks.py --curve: mean of the last 5 < 0.7 x the first 5) -> CURVE
#      (models over 2 B parameters train after steps 1 and 2, to share the GPU's memory)
#   4. EP2_OF (default the Qwen3-30B-A3B cut): the same run with --expert_model_parallel_size 2 on 2 GPUs against
#      the 1-GPU run of step 3: step-1 value loss within LTOL (relative), falling curve, same steps -> EP2 line.
#      One GPU: SKIP.
# Default FAMILIES: deepseek-v3-cut (MLA, yarn, 1 dense + 1 MoE layer of 16 experts), qwen3-30b-a3b-cut (128
# experts, top-8), qwen3-1.7b (QK-norm), qwen2.5-1.5b (qkv bias), tiny:qwen2_moe (shared expert; no published
# config here); the Llama critic is critic_model.sh's. Last line "CRITIC_FAMILIES: OK|FAIL (n/m[; skipped: ...])".
# The Gated-DeltaNet hybrids: FAMILIES=qwen3-next-80b-a3b-cut,qwen3.5-27b-cut,qwen3.5-35b-a3b-cut (or tiny:qwen3_next,
# tiny:qwen3_5): cut to whole full_attention_interval groups (LAYERS 2 -> 4 layers, one full-attention layer), a
# Qwen3.5 cut on its text_config; Qwen3.5-MoE has no critic (its record's no_critic): a SKIP line with the reason,
# counted as skipped. Their Megatron runs (values, sft) on HYBRID_GDN (auto: megatron-core's torch Gated DeltaNet,
# --padding_free false --megatron_extra_kwargs '{"deterministic_mode": true}', NVTE_ALLOW_NONDETERMINISTIC_ALGO=0,
# where fla refuses its backward on this GPU and Triton, else fla), their HF side on CRITIC_HF_GDN (torch:
# transformers' own torch Gated DeltaNet, no cold fla compile; auto: what transformers picks). The sft template:
# chatml (the tiny tokenizer), a multimodal checkpoint its record's (qwen3_5); CRITIC_TEMPLATE overrides it.
# Budget: BUDGET seconds (default 540, 1200 on one GPU; each process is capped by what is left).
# env: OUT, BUDGET, FAMILIES (comma list), LAYERS (2), ITERS (40), LR (3e-4; tiny: LR_TINY 2e-3), LTOL (1e-2),
# EP2_OF, BIG_B (2.0: a critic over this many billion parameters trains after its values and export, not beside
# them; 3 fits both hybrid cuts beside on a 141 GB H200), HYBRID_GDN (auto|fla|torch), CRITIC_HF_GDN (torch|auto),
# CRITIC_TEMPLATE (every lane's sft template), CRITIC_MG_KWARGS (JSON, extra MegatronArguments of the values runs),
# EXTRA_SFT_ARGS, CRITIC_FAMILIES_WORK (scratch dir, emptied; ~40 GB), SWIFT_PLT_GPU_ENV, SWIFT_PLT_GPU_DRY_RUN
# (lib.sh; toy widths, CPU, gloo).
set -o pipefail
set -m

GPU_BUDGET_ENV=${BUDGET:-}
# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_init critic_families critic_families_summary.txt "${CRITIC_FAMILIES_WORK:-/tmp/swift_plt_gpu/critic_families}" \
  540 1
[ "$NGPU" = 1 ] && [ -z "${GPU_BUDGET_ENV:-}" ] && BUDGET=1200
DRY=${SWIFT_PLT_GPU_DRY_RUN:-0}
FAMILIES=${FAMILIES:-deepseek-v3-cut,qwen3-30b-a3b-cut,qwen3-1.7b,qwen2.5-1.5b,tiny:qwen2_moe}
IFS=, read -r -a SPECS <<<"$FAMILIES"
EP2_OF=${EP2_OF:-qwen3-30b-a3b-cut}
LTOL=${LTOL:-1e-2}
ITERS=${ITERS:-40}
PY="python3 tests/gpu/critic_families.py"
CHECK="python3 tests/gpu/critic_checks.py"
MAKE_ARGS=(--layers "${LAYERS:-2}")
MG_KWARGS=${CRITIC_MG_KWARGS:-'{}'}
EXPORT_CHECK_ARGS=()
BIG_B=${BIG_B:-2.0}
HYBRID_GDN=${HYBRID_GDN:-auto}
CRITIC_HF_GDN=${CRITIC_HF_GDN:-torch}
if [ "$DRY" = 1 ]; then
  MAKE_ARGS+=(--tiny)
  CPU_MG='{"use_cpu_initialization": true, "attention_backend": "unfused", "ddp_backend": "gloo"}'
  MG_KWARGS=${CRITIC_MG_KWARGS:-$CPU_MG}
  EXPORT_CHECK_ARGS=(--ignore-dtype) # the harness's torch norms keep fp32 weights
  ITERS=${ITERS_DRY:-20}
  CAP_SCALE=${CAP_SCALE:-8} # CPU: every process many times slower
fi
bounded() { # bounded CAP_S CMD...: run CMD for at most min(CAP_S x CAP_SCALE, budget left) seconds
  local t
  t=$(cap $(($1 * ${CAP_SCALE:-1})))
  shift
  timeout -k 10 "$t" "$@"
}
last_err() { grep -E 'Error|error:' "$1" 2>/dev/null | tail -1 | cut -c1-300; }
python3 tests/harness/critic_rows.py "$W/reward.jsonl" reward 512 || { check setup 1; finish; }
say "0 rows: $W/reward.jsonl; families: ${SPECS[*]} ($NGPU GPU(s)); EP2: $EP2_OF; $(now)"

sft() { # sft NAME GPUS NPROC PORT DIR TYPE LR TEMPLATE GDN -- args...: megatron sft, log $OUT/NAME.log; prints rc
  # (GDN torch: megatron-core's torch Gated DeltaNet, padded batches; '' or fla: as configured)
  local name=$1 gpus=$2 nproc=$3 port=$4 dir=$5 type=$6 lr=$7 template=$8 gdn=$9
  local det=${NVTE_ALLOW_NONDETERMINISTIC_ALGO:-1}
  shift 10
  if [ "$gdn" = torch ]; then
    set -- "$@" "${TORCH_GDN[@]}"
    det=0 # megatron's TEDotProductAttention refuses deterministic_mode otherwise
  fi
  mkdir -p "$W/runs/$name" "$W/cache/$name"
  CUDA_VISIBLE_DEVICES=$(dev "$gpus") NPROC_PER_NODE=$nproc MASTER_PORT=$port HF_DATASETS_CACHE="$W/cache/$name/hf" \
    MODELSCOPE_CACHE="$W/cache/$name/ms" NVTE_ALLOW_NONDETERMINISTIC_ALGO=$det bounded 240 megatron sft \
    --model "$dir" --model_type "$type" --template "$template" --dataset "$W/reward.jsonl" --max_length 256 \
    --micro_batch_size 4 --global_batch_size 16 --seed 42 --attention_backend fused --lr "$lr" \
    --min_lr "$(python3 -c "print($lr / 10)")" --lr_warmup_iters 4 --bf16 true --torch_dtype bfloat16 \
    --logging_steps 1 --train_iters "$ITERS" --save_steps 100000 \
    --no_save_optim true --no_save_rng true --save_safetensors false --dataloader_num_workers 2 \
    --dataset_num_proc 2 --output_dir "$W/runs/$name" "$@" ${EXTRA_SFT_ARGS:-} >"$OUT/$name.log" 2>&1
  echo "rc=$?"
}

lane() { # lane SPEC GPU PORT: one family; lines -> $W/TAG/lines, "LABEL RC [WHY]" -> $W/TAG/checks (RC skip: WHY)
  local spec=$1 g=$2 port=$3 tag d ctype rc lr big why template gdn=''
  tag=${spec//:/_}
  d=$W/$tag
  mkdir -p "$d"
  note() { echo "$*" >>"$d/lines"; echo "[$tag] $* ($(now))"; }
  verdict() { # verdict LABEL FILE [RC]: FILE's lines to the summary; RC, else FILE's last line (-> OK), decides
    local rc=${3:-}
    cat "$2" >>"$d/lines"
    [ -n "$rc" ] || { tail -1 "$2" | grep -q -- '-> OK$'; rc=$?; }
    echo "$1 $rc" >>"$d/checks"
  }
  CUDA_VISIBLE_DEVICES=$(dev "$g") bounded 200 $PY make --spec "$spec" --out "$d/critic" "${MAKE_ARGS[@]}" \
    >"$OUT/$tag.make.log" 2>&1
  rc=$?
  why=$(sed -n 's/^no_critic: //p' "$OUT/$tag.make.log")
  if [ $rc = 0 ] && [ -n "$why" ]; then # the family's record has no critic: skipped, not failed
    note "== $tag: $(sed -n 's/^critic: //p' "$OUT/$tag.make.log") (skipped)"
    echo "$tag:critic skip $why" >>"$d/checks"
    return
  fi
  ctype=$(sed -n 's/^critic_type: //p' "$OUT/$tag.make.log")
  template=${CRITIC_TEMPLATE:-$(sed -n 's/^template: //p' "$OUT/$tag.make.log")}
  note "== $tag on GPU $g: $(sed -n 's/^critic: \(.*\) -> .*/\1/p' "$OUT/$tag.make.log") -> $ctype; make rc=$rc"
  grep '^layers: ' "$OUT/$tag.make.log" | while read -r line; do note "   $line"; done
  if grep -q '^gdn: ' "$OUT/$tag.make.log"; then # a Gated-DeltaNet hybrid
    gdn=$HYBRID_GDN
    [ "$gdn" = auto ] && gdn=$(sed -n 's/^gdn: \([a-z]*\).*/\1/p' "$OUT/$tag.make.log")
    note "   Gated DeltaNet: Megatron $gdn (HYBRID_GDN=$HYBRID_GDN; $(sed -n 's/^gdn: //p' "$OUT/$tag.make.log"))," \
      "HF $CRITIC_HF_GDN (CRITIC_HF_GDN)"
  fi
  if [ $rc != 0 ] || [ -z "$ctype" ] || [ "$ctype" = None ] || [ -z "$template" ]; then
    note "   $(tail -2 "$OUT/$tag.make.log" | tr '\n' ' ' | cut -c1-300)"
    echo "$tag:setup 1" >>"$d/checks"
    return
  fi
  case $spec in tiny:*) lr=${LR_TINY:-2e-3} ;; *) lr=${LR:-3e-4} ;; esac
  [ "$DRY" = 1 ] && lr=${LR_TINY:-2e-3}
  big=$(awk -v p="$(sed -n 's/^params_b: //p' "$OUT/$tag.make.log")" -v b="$BIG_B" 'BEGIN { print (p > b) ? 1 : 0 }')
  run_sft() {
    note "-- sft: $(sft "$tag.sft" "$g" 1 $((port + 3)) "$d/critic" "$ctype" "$lr" "$template" "$gdn" --)"
  }
  local hf_gdn=() mg_gdn=()
  if [ -n "$gdn" ]; then
    hf_gdn=(--hf-gdn "$CRITIC_HF_GDN")
    mg_gdn=(--gdn "$gdn")
  fi
  local p_sft='' p_hf p_mg p_export
  if [ "$big" = 0 ]; then
    run_sft &
    p_sft=$!
  fi
  # 1. values, 2. export: at once
  (CUDA_VISIBLE_DEVICES=$(dev "$g") bounded 240 $PY hf-values --model "$d/critic" --out "$d/hf.pt" \
    "${hf_gdn[@]}" >"$OUT/$tag.hf_values.log" 2>&1; echo $? >"$d/hf.rc") &
  p_hf=$!
  (CUDA_VISIBLE_DEVICES=$(dev "$g") bounded 300 $PY mg-values --model "$d/critic" --out "$d/mg.pt" \
    --port "$port" --mg-kwargs "$MG_KWARGS" "${mg_gdn[@]}" >"$OUT/$tag.mg_values.log" 2>&1; echo $? >"$d/mg.rc") &
  p_mg=$!
  (
    CUDA_VISIBLE_DEVICES=$(dev "$g") MASTER_PORT=$((port + 1)) bounded 240 swift export --model "$d/critic" \
      --model_type "$ctype" --to_mcore true --torch_dtype bfloat16 --output_dir "$d/mcore" \
      >"$OUT/$tag.to_mcore.log" 2>&1 &&
      CUDA_VISIBLE_DEVICES=$(dev "$g") MASTER_PORT=$((port + 2)) bounded 240 swift export --mcore_model "$d/mcore" \
        --model_type "$ctype" --to_hf true --torch_dtype bfloat16 --output_dir "$d/hf_export" \
        >"$OUT/$tag.to_hf.log" 2>&1
    echo $? >"$d/export.rc"
  ) &
  p_export=$!
  wait $p_hf $p_mg $p_export
  note "-- hf-values rc=$(cat "$d/hf.rc") mg-values rc=$(cat "$d/mg.rc") export rc=$(cat "$d/export.rc")" \
    "$(last_err "$OUT/$tag.mg_values.log")"
  if [ "$(cat "$d/hf.rc")" = 0 ] && [ "$(cat "$d/mg.rc")" = 0 ]; then
    $PY compare "$tag" "$d/hf.pt" "$d/mg.pt" 2>&1 | grep '^CRITIC' >"$d/values.out"
    grep ' values fp32' "$d/values.out" >"$d/v32.out" || echo "CRITIC $tag values fp32: no line -> FAIL" >"$d/v32.out"
    grep ' values bf16' "$d/values.out" >"$d/v16.out" || echo "CRITIC $tag values bf16: no line -> FAIL" >"$d/v16.out"
  else
    for p in fp32:v32 bf16:v16; do
      echo "CRITIC $tag values ${p%:*}: hf-values / mg-values failed (rc 124: timed out; logs $tag.*_values.log)" \
        "-> FAIL" >"$d/${p#*:}.out"
    done
  fi
  verdict "$tag:values-fp32" "$d/v32.out"
  verdict "$tag:values-bf16" "$d/v16.out"
  if [ "$(cat "$d/export.rc")" = 0 ] && [ "$(cat "$d/hf.rc")" = 0 ]; then
    CUDA_VISIBLE_DEVICES=$(dev "$g") bounded 180 $PY export-check "$tag" --orig "$d/critic" --exported "$d/hf_export" \
      --ref "$d/hf.pt" "${EXPORT_CHECK_ARGS[@]}" "${hf_gdn[@]}" 2>&1 | grep '^CRITIC' | tail -1 >"$d/export.out"
  else
    echo "CRITIC $tag export: rc=$(cat "$d/export.rc") (124: timed out) $(last_err "$OUT/$tag.to_mcore.log")" \
      "$(last_err "$OUT/$tag.to_hf.log") -> FAIL" >"$d/export.out"
  fi
  verdict "$tag:export" "$d/export.out"
  # 3. training (after the values and the export for big models), 4. EP2
  if [ "$big" = 1 ]; then run_sft; else wait $p_sft; fi
  $CHECK --curve "$tag $ctype (scalar rewards, $ITERS it, bf16, lr $lr)" "$OUT/$tag.sft.log" >"$d/curve.out" \
    2>>"$OUT/$tag.checks.log"
  verdict "$tag:sft-curve" "$d/curve.out" $?
  if [ "$spec" = "$EP2_OF" ]; then
    if [ "$NGPU" -ge 2 ]; then
      note "-- EP2 sft: $(sft "$tag.sft_ep2" 0,1 2 $((port + 4)) "$d/critic" "$ctype" "$lr" "$template" "$gdn" -- \
        --expert_model_parallel_size 2)"
      $CHECK --cp "$tag EP2 vs 1 GPU" "$OUT/$tag.sft.log" "$OUT/$tag.sft_ep2.log" --ltol "$LTOL" --min-drop 0.7 \
        2>>"$OUT/$tag.checks.log" |
        sed 's/^CP /EP2 /; s/(CP=2)/(EP=2)/; s/ CP=2 / EP=2 /' >"$d/ep2.out"
      verdict "$tag:ep2" "$d/ep2.out" $?
    else
      note "SKIP: $tag EP2 (needs 2 GPUs, $NGPU visible)"
      echo "$tag:ep2 skip needs 2 GPUs" >>"$d/checks"
    fi
  fi
}

i=0
LANES=()
for spec in "${SPECS[@]}"; do
  if [ "$NGPU" -ge 2 ]; then
    lane "$spec" $((i % NGPU)) $((29810 + 10 * i)) &
    LANES+=($!)
  else # one GPU: the lanes would not fit its memory together
    lane "$spec" 0 $((29810 + 10 * i))
  fi
  i=$((i + 1))
done
wait "${LANES[@]}"

for spec in "${SPECS[@]}"; do
  d=$W/${spec//:/_}
  [ -f "$d/lines" ] && tee -a "$SUM" <"$d/lines"
  if [ ! -s "$d/checks" ]; then
    check "${spec}:lane" 1
    continue
  fi
  while read -r label rc why; do
    if [ "$rc" = skip ]; then skip "$label" "${why:-skipped}"; else check "$label" "$rc"; fi
  done <"$d/checks"
done
finish
