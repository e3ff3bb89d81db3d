#!/usr/bin/env bash
# The two-stage PLT recipe end to end on one GPU, ~4-5 min (from anywhere; summary $OUT/two_stage_summary.txt, $OUT
# default ./gpu_results/two_stage):
#     bash tests/gpu/two_stage.sh
#   0. the quickstarts' tiny Llama and data (swift-plt-make-tiny, the installed command)
#   1. swift-plt-two-stage --tokens 737280 --patch_size 4 --lam 2/3 --max_length 256 --global_batch_size 8
#      --stage1_batch sequences (G sequences per stage-1 step, so the step counts are small and round):
#      stage 1 K=4 at length 1024, 491520 tokens / 8192 per step = 60 steps; stage 2 K=1 at 256 from the stage-1
#      weights (fresh optimizer + LR schedule), 245760 / 2048 = 120 steps; vanilla export -> $W/run/hf
#   2. the loss falls in both stages (mean of the last 5 logged < mean of the first 5), with the planned step counts
#   3. rerun of the same command: must skip both stages and the export (resume state machine)
#   4. plain transformers loads the export with swift-plt disabled (model_type llama, no patch_size, no auto_map)
#   5. tests/gpu/export_logits.py: export logits vs the stage-2 Megatron checkpoint (bf16 as trained, and fp32)
# Last line "TWO_STAGE: OK|FAIL (n/m)". env: OUT, PLT_WORK (scratch dir), EXTRA_PT_ARGS (appended to the recipe
# command: `megatron pt` flags of both stages), FAMILY (a tests/gpu/make_family_configs.py name, e.g.
# qwen3-next-80b-a3b-cut: the recipe on that family at toy widths, its config.json model_type, lib.sh's
# family_template, instead of the tiny Llama), SWIFT_PLT_GPU_ENV, SWIFT_PLT_GPU_DRY_RUN (lib.sh; steps 0-4 on CPU,
# ~2.5 min with FAMILY=qwen3-next-80b-a3b-cut; step 5 needs CUDA).
set -o pipefail
# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gpu_init two_stage two_stage_summary.txt "${PLT_WORK:-/tmp/swift_plt_gpu/two_stage}" 600 1 \
  megatron,swift,torchrun,swift-plt-two-stage,swift-plt-make-tiny
swift-plt-make-tiny "$W/tiny" >"$OUT/two_stage_setup.log" 2>&1
rc=$?
say "0 setup: swift-plt-make-tiny rc=$rc; $(now)"
[ $rc = 0 ] || { tail -3 "$OUT/two_stage_setup.log" | sed 's/^/   | /' | tee -a "$SUM"; check setup 1; finish; }
MODEL=$W/tiny/model TEMPLATE=llama MODEL_TYPE=llama3_2_plt
if [ -n "${FAMILY:-}" ]; then
  python3 "$REPO/tests/gpu/make_family_configs.py" --tiny --out "$W/families" --only "$FAMILY" \
    >>"$OUT/two_stage_setup.log" 2>&1
  rc=$?
  MODEL=$W/families/$FAMILY
  MODEL_TYPE=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['model_type'])" "$MODEL/config.json")
  TEMPLATE=$(family_template "$MODEL_TYPE")
  say "0 family $FAMILY (toy widths, model_type $MODEL_TYPE, template $TEMPLATE): rc=$rc"
  [ $rc = 0 ] || { check setup 1; finish; }
fi
ARCH=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['architectures'][0])" "$MODEL/config.json")

EXPORT_ARGS="--torch_dtype bfloat16"
if [ "${SWIFT_PLT_GPU_DRY_RUN:-0}" = 1 ]; then # the CPU harness: `megatron export` on gloo (as two_nodes.sh)
  EXPORT_ARGS+=" --ddp_backend gloo --use_cpu_initialization true --perform_initialization true --check_model false"
fi
RECIPE=(swift-plt-two-stage --model "$MODEL" --output_dir "$W/run" --tokens 737280 --patch_size 4 --lam 2/3
  --max_length 256 --global_batch_size 8 --stage1_batch sequences
  --dataset "$W/tiny/train.jsonl" --template "$TEMPLATE" --micro_batch_size 4 --lr 1e-3 --min_lr 1e-4 --lr_warmup_iters 5
  --torch_dtype bfloat16 --attention_backend fused --logging_steps 1 --save_steps 30 --seed 42
  --dataloader_num_workers 2 --dataset_num_proc 4
  --export_args "$EXPORT_ARGS")
# shellcheck disable=SC2206
RECIPE+=(${EXTRA_PT_ARGS:-}) # unknown flags go to `megatron pt` in both stages
export NPROC_PER_NODE=1 MASTER_PORT=29741 CUDA_VISIBLE_DEVICES=$(dev 0)
say "1 command: ${RECIPE[*]}"
t=$SECONDS
timeout -k 10 "$(cap 100000)" "${RECIPE[@]}" >"$OUT/two_stage_run.log" 2>&1 # the budget bounds every run
rc=$?
say "1 two-stage run: rc=$rc $((SECONDS - t))s; $(now)"
check 1.run $rc
sed -n '/^Two-stage PLT plan/,/compute vs token-level/p' "$OUT/two_stage_run.log" | tee -a "$SUM"
grep -E '^\[(stage1|stage2|export|done)\]' "$OUT/two_stage_run.log" | tee -a "$SUM"

python3 - "$W/run" "$SUM" <<'EOF'
import json, os, sys
run, summary = sys.argv[1], sys.argv[2]
def losses(stage):
    path = os.path.join(run, stage, 'logging.jsonl')
    out = []
    if os.path.exists(path):
        for line in open(path):
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if 'loss' in d:
                out.append(float(d['loss']))
    return out
ok = True
lines = []
for stage, want in (('stage1_patch', 60), ('stage2_token', 120)):
    l = losses(stage)
    first5 = sum(l[:5]) / max(len(l[:5]), 1)
    last5 = sum(l[-5:]) / max(len(l[-5:]), 1)
    falling = len(l) >= 10 and last5 < first5
    ok &= falling and len(l) == want
    lines.append(f'2 {stage}: {len(l)} logged steps (want {want}); first={l[0] if l else None} '
                 f'final={l[-1] if l else None}; mean(first 5)={first5:.4f} mean(last 5)={last5:.4f}; '
                 f'falling={"yes" if falling else "NO"}')
s1, s2 = losses('stage1_patch'), losses('stage2_token')
lines.append(f'2 stage-1 final loss (patch level, K=4): {s1[-1] if s1 else None}')
lines.append(f'2 stage-2 loss, first 10 steps (token level, from the stage-1 weights): {[round(x, 4) for x in s2[:10]]}')
lines.append(f'2 final loss (stage 2, step {len(s2)}): {s2[-1] if s2 else None}')
with open(summary, 'a') as f:
    for x in lines:
        print(x)
        f.write(x + '\n')
sys.exit(0 if ok else 1)
EOF
check 2.losses $?

t=$SECONDS
timeout -k 10 "$(cap 300)" "${RECIPE[@]}" >"$OUT/two_stage_rerun.log" 2>&1
rc=$?
skipped=$(grep -c -E '^\[(stage[12]\] skip \(complete|export\] skip \(done)' "$OUT/two_stage_rerun.log")
trained=$(grep -c "'iteration'" "$OUT/two_stage_rerun.log")
say "3 rerun (resume state machine): rc=$rc $((SECONDS - t))s, steps skipped=$skipped (want 3), training log lines=$trained (want 0)"
[ $rc = 0 ] && [ "$skipped" = 3 ] && [ "$trained" = 0 ]
check 3.rerun $?

chk=$(cd /tmp && SWIFT_PLT_DISABLE=1 python3 -m swift_plt.recipe.export --check "$W/run/hf" 2>&1)
rc=$?
chk=$(echo "$chk" | tail -1)
say "4 plain transformers (plugin disabled) loads the export: rc=$rc $chk"
say "4 export config.json: $(python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print({k: c.get(k) for k in ('model_type', 'architectures', 'patch_size', 'auto_map', 'dtype', 'torch_dtype')})" "$W/run/hf/config.json" 2>&1)"
echo "$chk" | grep -q "$ARCH"
check 4.plain-transformers $?

ck=$(ls -d "$W"/run/stage2_token/checkpoint-120 2>/dev/null)
python3 tests/gpu/export_logits.py --hf "$W/run/hf" --checkpoint "${ck:-missing}" --source "$MODEL" \
  --model-type "$MODEL_TYPE" \
  --data "$W/tiny/train.jsonl" --json "$OUT/two_stage_export_logits.json" >"$OUT/two_stage_export_logits.log" 2>&1
rc=$?
grep '^EXPORT_LOGITS' "$OUT/two_stage_export_logits.log" | sed 's/^/5 /' | tee -a "$SUM"
say "5 export_logits.py: rc=$rc"
check 5.export-logits $rc

cp "$W/run/plan.json" "$OUT/two_stage_plan.json" 2>/dev/null
for s in stage1_patch stage2_token; do cp "$W/run/$s/logging.jsonl" "$OUT/two_stage_$s.logging.jsonl" 2>/dev/null; done
finish
