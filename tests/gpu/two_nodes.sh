#!/usr/bin/env bash
# The two-stage recipe on two nodes, simulated on one machine of 2 (or, PER_NODE=2, 4) GPUs (from anywhere; summary
# $OUT/two_nodes_summary.txt, $OUT default ./gpu_results/two_nodes), ~3 min:
#     bash tests/gpu/two_nodes.sh                 # two nodes of 1 GPU against one node of 2
#     PER_NODE=2 bash tests/gpu/two_nodes.sh      # two nodes of 2 GPUs against one node of 4
#   0. the tiny Llama and its rows (make_tiny, lib.sh)
#   1. side by side, the same swift-plt-two-stage command (K=4, λ=S1·4/(S1·4+S2), T=256, G=8, --stage1_batch
#      sequences: stage 1 S1 steps, stage 2 S2 steps, --save_steps SAVE; deterministic algorithms) as
#      a. one node, 2·P GPUs (P = PER_NODE): NPROC_PER_NODE=2·P (the reference), $W/one
#      b. two "nodes" of P GPUs on a shared $W/two, as two machines would run it: NNODES=2 NODE_RANK=0|1
#         NPROC_PER_NODE=P MASTER_ADDR=127.0.0.1, one MASTER_PORT, CUDA_VISIBLE_DEVICES = node 0's or 1's GPUs,
#         own dataset cache; --micro_batch_size 4/P, so that G=8 splits over the 2·P data-parallel ranks
#   2. every run exits 0; in b each stage ran once on each node (one command in logs/stageN.log and in
#      logs/stageN.node1.log), the export once, on node 0 alone (one command in logs/export.log, none on node 1,
#      node 1 waited for it), the wall times and the summary written once (node 0)
#   3. b = a (the same global batch and data-parallel size): stage 1 (K=4) bit for bit; stage 2 (K=1) bit for bit
#      up to the first step whose grad_norm differs with the same loss (upstream's K=1 backward is not run-to-run
#      identical: tests/gpu/README.md), not before step MIN_SAME + 1, and every loss within LOSS_TOL (relative)
#      after; the exported weights (max |b - a| / max |a| per tensor) within WEIGHT_TOL where stage 2 was bit for
#      bit, else WEIGHT_TOL_SPLIT
#   4. resume: b's final stage-2 checkpoint removed, both nodes rerun: stage 1 skipped, stage 2 resumes from
#      checkpoint-SAVE on both nodes, its losses = a's (as in 3; its first step bit for bit), the export is kept
#   5. rerun: both nodes skip both stages and the export, nothing trains
# Last line "TWO_NODES: OK|FAIL (n/m)". env: OUT, PLT_WORK (scratch dir), BUDGET (480 s; dry run 3600), RUN_S (the
# most one recipe run may take: 400 s; dry run 2400), S1, S2, SAVE (steps, default 16, 16, 8; dry run 4, 4, 2),
# MIN_SAME (5), PER_NODE (1 or 2), LOSS_TOL (1e-3), WEIGHT_TOL (1e-3), WEIGHT_TOL_SPLIT (3e-2), EXTRA_PT_ARGS
# (appended to the recipe command: `megatron pt` flags of both stages), SWIFT_PLT_GPU_ENV, SWIFT_PLT_GPU_DRY_RUN
# (lib.sh; with NGPU=2, ~5 min on 2 CPU cores).
set -o pipefail
# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DRY=${SWIFT_PLT_GPU_DRY_RUN:-0}
if [ "$DRY" = 1 ]; then B=3600 D1=4 D2=4 DS=2 DR=2400; else B=480 D1=16 D2=16 DS=8 DR=400; fi
P=${PER_NODE:-1}
case $P in 1 | 2) ;; *) echo "PER_NODE=$P: 1 or 2 (GPUs per simulated node)" >&2; exit 2 ;; esac
gpu_init two_nodes two_nodes_summary.txt "${PLT_WORK:-/tmp/swift_plt_gpu/two_nodes}" "$B" $((2 * P)) \
  megatron,swift,torchrun,swift-plt-two-stage
S1=${S1:-$D1} S2=${S2:-$D2} SAVE=${SAVE:-$DS} LOSS_TOL=${LOSS_TOL:-1e-3} WEIGHT_TOL=${WEIGHT_TOL:-1e-3}
WEIGHT_TOL_SPLIT=${WEIGHT_TOL_SPLIT:-3e-2}
RUN_S=${RUN_S:-$DR} # the most one recipe run may take (capped to the budget)
make_tiny "$W/tiny"
rc=$?
say "0 setup: make_tiny rc=$rc; $(now)"
[ $rc = 0 ] || { tail -3 "$OUT/make_tiny.log" | sed 's/^/   | /' | tee -a "$SUM"; check setup 1; finish; }

# N = S1 steps x 8 x 1024 (stage 1, K·T) + S2 steps x 8 x 256 (stage 2), λ = the stage-1 share, exact
N=$((S1 * 8 * 1024 + S2 * 8 * 256))
DTYPE=(--torch_dtype bfloat16)
EXPORT_ARGS="--torch_dtype bfloat16"
if [ "$DRY" = 1 ]; then # the CPU harness: fp32, and `megatron export` on gloo (tests/recipe/test_two_stage_cli.py)
  DTYPE=(--torch_dtype float32 --bf16 false --fp16 false)
  EXPORT_ARGS="--torch_dtype float32 --ddp_backend gloo --use_cpu_initialization true --perform_initialization true"
  EXPORT_ARGS+=" --check_model false"
fi
RECIPE=(swift-plt-two-stage --model "$W/tiny/model" --tokens "$N" --patch_size 4 --lam "$((S1 * 4))/$((S1 * 4 + S2))"
  --max_length 256 --global_batch_size 8 --stage1_batch sequences
  --dataset "$W/tiny/data/train.jsonl" --template llama --micro_batch_size $((4 / P)) --lr 1e-3 --min_lr 1e-4
  --lr_warmup_iters 2 "${DTYPE[@]}" --attention_backend fused --logging_steps 1 --save_steps "$SAVE" --seed 42
  --dataset_num_proc 4 --megatron_extra_kwargs '{"deterministic_mode": true}'
  --export_args "$EXPORT_ARGS")
# shellcheck disable=SC2206
RECIPE+=(${EXTRA_PT_ARGS:-}) # unknown flags go to `megatron pt` in both stages
export NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
say "1 command (+ --output_dir): ${RECIPE[*]}"

if [ "$P" = 1 ]; then ALL=0,1 NODE_GPUS=(0 1); else ALL=0,1,2,3 NODE_GPUS=(0,1 2,3); fi
one() { # the reference: one node, 2·P GPUs
  env NPROC_PER_NODE=$((2 * P)) MASTER_PORT=29771 CUDA_VISIBLE_DEVICES="$(dev $ALL)" \
    HF_DATASETS_CACHE="$W/cache/one" \
    MODELSCOPE_CACHE="$W/cache/one/ms" timeout -k 10 "$(cap "$RUN_S")" "${RECIPE[@]}" --output_dir "$W/one" \
    >"$OUT/one.log" 2>&1
}
node() { # node RANK TAG: one of the two "nodes" on the shared $W/two
  env NNODES=2 NODE_RANK="$1" NPROC_PER_NODE="$P" MASTER_ADDR=127.0.0.1 MASTER_PORT=29772 \
    CUDA_VISIBLE_DEVICES="$(dev "${NODE_GPUS[$1]}")" HF_DATASETS_CACHE="$W/cache/node$1" \
    MODELSCOPE_CACHE="$W/cache/node$1/ms" \
    SWIFT_PLT_NODE_WAIT="$(cap "$RUN_S")" timeout -k 10 "$(cap "$RUN_S")" "${RECIPE[@]}" --output_dir "$W/two" \
    >"$OUT/$2.node$1.log" 2>&1
}
two() { # two TAG: both nodes side by side; sets RC0 RC1
  local p0 p1
  node 0 "$1" &
  p0=$!
  node 1 "$1" &
  p1=$!
  wait $p0
  RC0=$?
  wait $p1
  RC1=$?
}
count() { # count REGEX FILE: matching lines (0 without the file; FILE - is stdin)
  if [ "$2" != - ] && [ ! -f "$2" ]; then echo 0; else grep -c -E "$1" "$2" || true; fi
}

t=$SECONDS
one &
pa=$!
two two
wait $pa
rca=$?
say "1 runs: a (one node, $((2 * P)) GPUs) rc=$rca; b (two nodes of $P) rc=$RC0/$RC1; $((SECONDS - t))s; $(now)"
check 1.a-runs $rca
[ "$RC0" = 0 ] && [ "$RC1" = 0 ]
check 1.b-runs $?
for f in one.log two.node0.log two.node1.log; do
  grep -E '^(\[(stage1|stage2|export|done)\]|swift-plt-two-stage)' "$OUT/$f" | sed "s/^/   $f: /" | tee -a "$SUM"
done

L=$W/two/logs
once="stage1.log=$(count '^\$ ' "$L/stage1.log") stage1.node1.log=$(count '^\$ ' "$L/stage1.node1.log")"
once+=" stage2.log=$(count '^\$ ' "$L/stage2.log") stage2.node1.log=$(count '^\$ ' "$L/stage2.node1.log")"
once+=" export.log=$(count '^\$ ' "$L/export.log") export.node1.log=$(count '^\$ ' "$L/export.node1.log")"
once+=" node0-exports=$(count '^\[export\] vanilla HF model' "$OUT/two.node0.log")"
once+=" node1-exports=$(count '^\[export\] vanilla HF model' "$OUT/two.node1.log")"
once+=" node1-waited=$(count '^\[export\] done by node 0' "$OUT/two.node1.log")"
once+=" stage1.time=$(count . "$L/stage1.time.jsonl") stage2.time=$(count . "$L/stage2.time.jsonl")"
once+=" summary=$(count . "$W/two/summary.txt" | sed 's/^[1-9][0-9]*$/yes/;s/^0$/no/')"
want="stage1.log=1 stage1.node1.log=1 stage2.log=1 stage2.node1.log=1 export.log=1 export.node1.log=0"
want+=" node0-exports=1 node1-exports=0 node1-waited=1 stage1.time=1 stage2.time=1 summary=yes"
say "2 once: $once"
[ "$once" = "$want" ]
check 2.once $?
for s in stage1_patch stage2_token; do
  cp "$W/two/$s/logging.jsonl" "$OUT/two_$s.logging.jsonl" 2>/dev/null
  cp "$W/one/$s/logging.jsonl" "$OUT/one_$s.logging.jsonl" 2>/dev/null
done

COMPARE=$(
  cat <<'EOF'
import json, os, sys

def rows(run, stage, skip=0):
    """{iteration: [(loss, grad_norm), ...]} of the stage's logging.jsonl from line `skip` on."""
    out = {}
    path = os.path.join(run, stage, 'logging.jsonl')
    for line in (open(path).readlines() if os.path.exists(path) else [])[skip:]:
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if 'loss' in d and 'iteration' in d:
            out.setdefault(int(str(d['iteration']).split('/')[0]), []).append((d['loss'], d.get('grad_norm')))
    return out

def rel(x, y):
    return abs(float(x) - float(y)) / max(abs(float(y)), 1e-12)

def compare(a, b, stage, want, skip=0, exact=False, min_same=None):
    """b's steps `want` of `stage` (its lines from `skip`) against a's; (ok, bit for bit, line). exact: every step
    bit for bit. Else bit for bit up to the first step whose grad_norm differs with the same loss (the same weights
    and batch; upstream's K=1 backward is not run-to-run identical, tests/gpu/README.md), at least MIN_SAME steps,
    then within tol (min_same: MIN_SAME)."""
    min_same = MIN_SAME if min_same is None else min_same
    ra, rb = rows(a, stage), rows(b, stage, skip)
    missing = [i for i in want if i not in ra or i not in rb or len(rb[i]) != 1]
    if missing:
        return False, False, f'{stage}: steps {missing} missing or logged twice'
    pa, pb = [ra[i][0] for i in want], [rb[i][0] for i in want]
    first = next((j for j, (x, y) in enumerate(zip(pa, pb)) if x != y), None)
    worst = max([rel(y[0], x[0]) for x, y in zip(pa, pb)] + [0.0])
    if first is None:
        ok, how = True, 'bit for bit'
    elif exact:
        ok, how = False, f'differs at step {want[first]} (bit for bit expected)'
    else:
        same_loss = pa[first][0] == pb[first][0]
        split = same_loss and first >= min_same
        ok = split and worst <= tol
        what = (f'grad_norm {pa[first][1]} vs {pb[first][1]} with the same loss' if same_loss else
                f'loss {pa[first][0]} vs {pb[first][0]}')
        verdict = 'a backward split' if split else (f'NOT a backward split (a loss differs, or before step '
                                                     f'{want[0] + min_same})')
        how = (f'bit for bit on steps {want[0]}..{want[first] - 1}, then step {want[first]} {what}: {verdict}; '
               f'after: max loss rel diff {worst:.3g} (tol {tol:g})')
    return ok, first is None, f'{stage} steps {want[0]}..{want[-1]}: {how}; a last {pa[-1][0]}, b last {pb[-1][0]}'

mode, a, b, tol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
s1, s2 = int(sys.argv[5]), int(sys.argv[6])
MIN_SAME = int(os.environ.get('MIN_SAME', 5))
ok = True
if mode == 'runs':
    good, _, line = compare(a, b, 'stage1_patch', list(range(1, s1 + 1)), exact=True)  # K=4: bit for bit
    ok &= good
    print(line)
    good, stage2_exact, line = compare(a, b, 'stage2_token', list(range(1, s2 + 1)))
    ok &= good
    print(line)
    import torch
    from safetensors.torch import load_file
    paths = [os.path.join(r, 'hf', 'model.safetensors') for r in (a, b)]
    if not all(os.path.exists(p) for p in paths):
        print(f'export missing: {[p for p in paths if not os.path.exists(p)]}')
        sys.exit(1)
    wa, wb = (load_file(p) for p in paths)
    wtol = float(sys.argv[7] if stage2_exact else sys.argv[8])  # tighter where stage 2 was bit for bit
    worst, same = 0.0, 0
    for k in wa:
        x, y = wa[k].float(), wb[k].float() if k in wb else None
        if y is None or y.shape != x.shape:
            worst = float('inf')
            continue
        worst = max(worst, ((y - x).abs().max() / x.abs().max().clamp_min(1e-12)).item())
        same += bool(torch.equal(wa[k], wb[k]))
    good = set(wa) == set(wb) and worst <= wtol
    ok &= good
    print(f'export {len(wa)} tensors: max |b - a| / max |a| {worst:.3g} (tol {wtol:g}), {same} bit for bit, '
          f'same names {set(wa) == set(wb)}')
else:  # resume: b's stage-2 lines after the first run's (argv 7) against a
    save = int(sys.argv[7])
    good, _, line = compare(a, b, 'stage2_token', list(range(save + 1, s2 + 1)), int(sys.argv[8]), min_same=1)
    ok &= good
    print('resumed ' + line)
sys.exit(0 if ok else 1)
EOF
)
python3 -c "$COMPARE" runs "$W/one" "$W/two" "$LOSS_TOL" "$S1" "$S2" "$WEIGHT_TOL" "$WEIGHT_TOL_SPLIT" 2>&1 |
  sed 's/^/3 /' | tee -a "$SUM"
check 3.b-equals-a $?

# 4. resume: stage 2 interrupted after checkpoint-SAVE (its final checkpoint removed), both nodes rerun
lines=$(count . "$W/two/stage2_token/logging.jsonl")
rm -rf "$W/two/stage2_token/checkpoint-$S2"
t=$SECONDS
two resume
r0=$(grep -E '^\[(stage1|stage2|export)\] ' "$OUT/resume.node0.log" | grep -v running | cut -c1-60 | tr '\n' ';')
r1=$(grep -E '^\[(stage1|stage2|export)\] ' "$OUT/resume.node1.log" | grep -v running | cut -c1-60 | tr '\n' ';')
say "4 resume rerun: rc=$RC0/$RC1 $((SECONDS - t))s; node 0: $r0"
say "4   node 1: $r1"
ok=0
for f in "$OUT/resume.node0.log" "$OUT/resume.node1.log"; do
  [ "$(count '^\[stage1\] skip \(complete' "$f")" = 1 ] &&
    [ "$(count "^\[stage2\] resume from .*/checkpoint-$SAVE\$" "$f")" = 1 ] &&
    [ "$(count '^\[export\] skip \(done' "$f")" = 1 ] || ok=1
done
[ "$RC0" = 0 ] && [ "$RC1" = 0 ] || ok=1
[ -f "$W/two/stage2_token/checkpoint-$S2/latest_checkpointed_iteration.txt" ] || ok=1
python3 -c "$COMPARE" resume "$W/one" "$W/two" "$LOSS_TOL" "$S1" "$S2" "$SAVE" "$lines" 2>&1 | sed 's/^/4 /' |
  tee -a "$SUM" || ok=1
check 4.resume $ok

t=$SECONDS
two rerun
s0=$(count '^\[(stage[12]\] skip \(complete|export\] skip \(done)' "$OUT/rerun.node0.log")
s1=$(count '^\[(stage[12]\] skip \(complete|export\] skip \(done)' "$OUT/rerun.node1.log")
trained=$(cat "$OUT"/rerun.node*.log | count "'iteration'" -)
say "5 rerun: rc=$RC0/$RC1 $((SECONDS - t))s, steps skipped node 0: $s0, node 1: $s1 (want 3 each), training log" \
  "lines: $trained (want 0)"
[ "$RC0" = 0 ] && [ "$RC1" = 0 ] && [ "$s0" = 3 ] && [ "$s1" = 3 ] && [ "$trained" = 0 ]
check 5.rerun $?
cp "$W/two/logs/node0_status.json" "$W/two/plan.json" "$OUT/" 2>/dev/null
finish
