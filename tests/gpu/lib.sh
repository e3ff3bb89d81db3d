# Shared by the scripts in tests/gpu. A script sources it first, from wherever it was started:
#     source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#   gpu_init NAME SUMMARY WORK BUDGET MIN_GPUS [COMMANDS]: source $SWIFT_PLT_GPU_ENV if set; $OUT (env wins, else
#     ./gpu_results/NAME under the directory the script was started from; created, exported, printed); cd to the
#     repo; $SUM=$OUT/SUMMARY (emptied); prerequisites (tests/gpu/prereq.py: CUDA GPUs, Transformer Engine,
#     ms-swift[megatron], swift-plt installed, COMMANDS on PATH) -> exit 2 with what to install; $NGPU; fewer than
#     MIN_GPUS -> a SKIP verdict and exit 0; $W (scratch dir WORK, env wins where the script says so; emptied, with
#     runs/); $BUDGET (env wins), $T0. Logs of the set-up: $OUT/prereq.log.
#   left / cap WANT / say MSG / now: seconds left of the budget, WANT capped to them (>= 5), MSG to stdout and $SUM,
#     "t=<elapsed>s"
#   dev IDX[,IDX]: the CUDA_VISIBLE_DEVICES value for the script's GPU indices 0, 1, ... (the GPUs the caller made
#     visible, else all), so a script asking for GPU 1 gets the second visible GPU
#   gpu_id IDX: which physical GPU the script's GPU IDX is ("GPU<index> <name> <uuid>"; "cpu (dry run)")
#   check LABEL RC / skip LABEL WHY / finish: count a check (RC 0 = pass), report a skipped part with a SKIP line,
#     and end with the verdict line "TAG: OK (n/n)" or "TAG: FAIL (p/n; failed: ...)" (exit 0 / 1); TAG is
#     $GPU_TAG if the script set it, else NAME in capitals
#   make_tiny DIR / critic_setup: the tiny Llama DIR/model + DIR/data/train.jsonl (tests/gpu/make_tiny.py);
#     critic_setup: that at $W/tiny, critic rows $W/reward.jsonl (512) and $W/returns.jsonl (256, with old_values),
#     a tiny critic $W/critic with a random value head N(0, 0.05); lines in $SUM; returns 1 on failure
#   TORCH_GDN: the `megatron` flags of a hybrid on megatron-core's torch Gated DeltaNet (padded batches,
#     deterministic_mode; run it with NVTE_ALLOW_NONDETERMINISTIC_ALGO=0: TE's attention refuses deterministic_mode
#     otherwise), where fla refuses its backward
# Exit codes of every script: 0 all checks passed (or the script was skipped), 1 a check failed, 2 set-up failed.
# SWIFT_PLT_GPU_DRY_RUN=1: rehearse a script on CPU under the test harness (tests/harness: gloo, CPU stand-ins for
#   Transformer Engine, its CPU flags appended to every megatron command); no CUDA needed, NGPU from the env
#   (default 1). It checks the script's plumbing, not the GPU numbers. A script that sets GPU_CUDA_ONLY=WHY before
#   gpu_init has no dry run. On a GPU machine NGPU=n uses only the first n visible GPUs.

GPU_START_DIR=$PWD
TORCH_GDN=(--padding_free false --megatron_extra_kwargs '{"deterministic_mode": true}')
GPU_NGPU_ENV=${NGPU:-} # NGPU=n: use only the first n visible GPUs
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

say() { echo "$*" | tee -a "$SUM"; }
now() { echo "t=$((SECONDS - T0))s"; }
left() { echo $((BUDGET - (SECONDS - T0))); }
cap() { # cap WANT: WANT seconds, or what is left of the budget (at least 5)
  local want=$1 l
  l=$(left)
  [ "$l" -lt "$want" ] && want=$l
  [ "$want" -lt 5 ] && want=5
  echo "$want"
}

gpu_init() {
  local name=$1 summary=$2 work=$3 budget=$4 min_gpus=$5 commands=${6:-megatron,swift,torchrun} rc
  GPU_NAME=$name
  GPU_TAG=${GPU_TAG:-$(echo "$name" | tr a-z A-Z)} # the verdict line's tag
  if [ -n "${SWIFT_PLT_GPU_ENV:-}" ]; then
    if [ ! -f "$SWIFT_PLT_GPU_ENV" ]; then
      echo "SWIFT_PLT_GPU_ENV=$SWIFT_PLT_GPU_ENV is not a file; unset it or point it at the environment script" >&2
      exit 2
    fi
    # shellcheck disable=SC1090
    source "$SWIFT_PLT_GPU_ENV" || { echo "sourcing SWIFT_PLT_GPU_ENV=$SWIFT_PLT_GPU_ENV failed" >&2; exit 2; }
  fi
  OUT=${OUT:-$GPU_START_DIR/gpu_results/$name}
  mkdir -p "$OUT" || { echo "cannot create OUT=$OUT" >&2; exit 2; }
  OUT=$(cd "$OUT" && pwd)
  export OUT
  cd "$REPO" || exit 2
  SUM=$OUT/$summary
  : >"$SUM"
  BUDGET=${BUDGET:-$budget}
  T0=$SECONDS
  CHECKS_N=0
  CHECKS_OK=0
  CHECKS_FAILED=()
  CHECKS_SKIPPED=()
  local rev='(no git)' # only this tree's own git (a copy inside another checkout must not report that one's HEAD)
  if [ "$(git -C "$REPO" rev-parse --show-toplevel 2>/dev/null)" = "$REPO" ]; then
    rev=$(git -C "$REPO" rev-parse --short HEAD)
    git -C "$REPO" diff --quiet HEAD 2>/dev/null || rev="$rev+dirty"
  fi
  say "== swift-plt $name, $(date -u +%FT%TZ), repo $rev; results in $OUT"
  local dry=()
  if [ "${SWIFT_PLT_GPU_DRY_RUN:-0}" = 1 ]; then
    if [ -n "${GPU_CUDA_ONLY:-}" ]; then
      say "$GPU_TAG: SKIP (no dry run: $GPU_CUDA_ONLY)"
      exit 0
    fi
    dry=(--dry-run)
    gpu_dry_run_env
  fi
  (cd / && python3 "$REPO/tests/gpu/prereq.py" --repo "$REPO" --commands "$commands" "${dry[@]}") >"$OUT/prereq.log" 2>&1
  rc=$?
  grep -E '^(ok|WARN|MISSING) ' "$OUT/prereq.log" | sed 's/^/   /' | tee -a "$SUM"
  NGPU=$(grep -o '^NGPU=[0-9]*' "$OUT/prereq.log" | cut -d= -f2)
  if [ $rc != 0 ] || [ -z "$NGPU" ]; then
    [ -n "$NGPU" ] || tail -5 "$OUT/prereq.log" | sed 's/^/   | /' | tee -a "$SUM"
    say "$GPU_TAG: SETUP FAILED (prerequisites above; log $OUT/prereq.log)"
    exit 2
  fi
  if [ "${SWIFT_PLT_GPU_DRY_RUN:-0}" = 1 ]; then
    NGPU=${GPU_NGPU_ENV:-1}
  elif [ -n "$GPU_NGPU_ENV" ] && [ "$GPU_NGPU_ENV" -lt "$NGPU" ]; then
    NGPU=$GPU_NGPU_ENV
  fi
  export NGPU
  GPU_VISIBLE=${CUDA_VISIBLE_DEVICES-}
  say "machine: $NGPU GPU(s) used of $(grep -o '[0-9]* GPU(s) visible.*' "$OUT/prereq.log" || echo 'none (dry run)'), $(getconf _NPROCESSORS_ONLN) CPUs"
  if [ "$NGPU" -lt "$min_gpus" ]; then
    say "SKIP: $name needs $min_gpus GPUs, $NGPU visible"
    say "$GPU_TAG: SKIP (needs $min_gpus GPUs)"
    exit 0
  fi
  case $work in /*) W=$work ;; *) W=$GPU_START_DIR/$work ;; esac
  rm -rf "$W"
  mkdir -p "$W/runs"
}

gpu_dry_run_env() { # the test harness in every Python process, CPU flags appended to every megatron command
  local cpu_args
  export SWIFT_PLT_CPU_HARNESS=1 PYTHONPATH=$REPO/tests/harness/site${PYTHONPATH:+:$PYTHONPATH}
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 MODELSCOPE_OFFLINE=1 TOKENIZERS_PARALLELISM=false
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  cpu_args=$(cd "$REPO/tests" && python3 -c "from harness.cli import CPU_MEGATRON_ARGS; print(' '.join(CPU_MEGATRON_ARGS))")
  export EXTRA_PT_ARGS="${EXTRA_PT_ARGS:-} $cpu_args" EXTRA_SFT_ARGS="${EXTRA_SFT_ARGS:-} $cpu_args"
  export ENGINE_DTYPE=${ENGINE_DTYPE:-fp32} ENGINE_MG_KWARGS=${ENGINE_MG_KWARGS:-'{"use_cpu_initialization": true, "attention_backend": "unfused", "ddp_backend": "gloo", "perform_initialization": true, "use_distributed_optimizer": false}'}
}

dev() { # dev 0 | dev 0,1: CUDA_VISIBLE_DEVICES for the script's GPU indices
  local vis=${GPU_VISIBLE:-} out=() i ids idx
  if [ -z "$vis" ]; then
    echo "$1"
    return
  fi
  IFS=, read -r -a ids <<<"$vis"
  IFS=, read -r -a idx <<<"$1"
  for i in "${idx[@]}"; do out+=("${ids[$i]}"); done
  (IFS=,; echo "${out[*]}")
}

gpu_id() { # gpu_id IDX: index, name and UUID of the script's GPU IDX (which card a run used)
  if [ "${SWIFT_PLT_GPU_DRY_RUN:-0}" = 1 ]; then
    echo "cpu (dry run)"
    return
  fi
  nvidia-smi --query-gpu=index,name,uuid --format=csv,noheader -i "$(dev "$1")" 2>/dev/null |
    awk -F', ' '{print "GPU" $1 " " $2 " " $3}' || echo "GPU $(dev "$1") (nvidia-smi failed)"
}

check() { # check LABEL RC
  CHECKS_N=$((CHECKS_N + 1))
  if [ "$2" = 0 ]; then CHECKS_OK=$((CHECKS_OK + 1)); else CHECKS_FAILED+=("$1"); fi
}
skip() { # skip LABEL WHY
  CHECKS_SKIPPED+=("$1")
  say "SKIP: $1 ($2)"
}
finish() { # finish: the verdict line, then exit
  local tag=$GPU_TAG extra='' failed
  [ ${#CHECKS_SKIPPED[@]} -gt 0 ] && extra="; skipped: $(printf '%s, ' "${CHECKS_SKIPPED[@]}")" && extra=${extra%, }
  if [ "$CHECKS_N" -gt 0 ] && [ "$CHECKS_OK" = "$CHECKS_N" ]; then
    say "$tag: OK ($CHECKS_OK/$CHECKS_N$extra); $(now)"
    exit 0
  fi
  failed=$(printf '%s, ' "${CHECKS_FAILED[@]}")
  say "$tag: FAIL ($CHECKS_OK/$CHECKS_N; failed: ${failed%, }$extra); $(now)"
  exit 1
}

family_template() { # family_template MODEL_TYPE: the ms-swift template a toy family dir (tiny tokenizer) trains with:
  # `default`; Qwen3.5's own for its multimodal checkpoint (`default` supports no padding-free / packing for one)
  case $1 in qwen3_5 | qwen3_5_moe) echo qwen3_5 ;; *) echo default ;; esac
}

make_tiny() { # make_tiny DIR [make_tiny.py flags]: DIR/model, DIR/data/train.jsonl; log $OUT/make_tiny.log
  local dir=$1
  shift
  python3 tests/gpu/make_tiny.py --out "$dir" --max-pos 2048 "$@" >"$OUT/make_tiny.log" 2>&1
}

critic_setup() {
  make_tiny "$W/tiny" --critic "$W/critic" --head-std 0.05 &&
    python3 tests/harness/critic_rows.py "$W/reward.jsonl" reward 512 &&
    python3 tests/harness/critic_rows.py "$W/returns.jsonl" returns 256
  local rc=$?
  say "0 setup: rc=$rc tiny $(grep -E '^model:' "$OUT/make_tiny.log" | head -1), critic $W/critic; $(now)"
  [ $rc = 0 ] || tail -3 "$OUT/make_tiny.log" | sed 's/^/   | /' | tee -a "$SUM"
  return $rc
}
