#!/usr/bin/env bash
# The quality benchmark on one GPU (~8 min for one size), from the root of a swift-plt checkout, on a GPU machine with
# ms-swift[megatron], Transformer Engine and swift-plt installed; QUAL_KIT is prepare_data.py's output:
#     QUAL_KIT=path/to/kit bash benchmarks/quality/run_gpu.sh
# -> $OUT: run.log, results.md, results.json, quality.png, regime.md, regime.png (regime.py on this call's runs),
#    logs.tar.xz (every stage's logging.jsonl, gpu_time.json, megatron/export logs, plan; eval.jsonl, meta.json,
#    setup.log)
# env: QUAL_BUDGET (seconds for the whole run, default 530), QUAL_RESERVE (of it, kept for eval, report and bundling;
#      110), QUAL_ARGS (extra run.py flags), QUAL_WORK, SWIFT_PLT_GPU_ENV (optional script sourced first: the machine's
#      environment), QUAL_TRACEBACK_EVERY (seconds: every Python process dumps its threads' stacks to runs/tb/PID.txt
#      that often, to find a hang; it can crash the process it dumps, so never in runs whose figures are reported),
#      QUAL_EXPORT_STARTS=1 (continued pretraining: the start models this call trains -> $OUT/starts.tar, for
#      --start_models of a later call). A call with --continue_from also leaves continued.md and continued.png.
set -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 1
OUT=${OUT:-/tmp/qual_out}
mkdir -p "$OUT"
W=${QUAL_WORK:-/tmp/qual_work}
rm -rf "$W"
mkdir -p "$W"
T0=$SECONDS
BUDGET=${QUAL_BUDGET:-530}
QKIT=$(cd "${QUAL_KIT:?set QUAL_KIT}" && pwd)
{
  echo "== quality benchmark, $(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(nproc) CPUs"
  # shellcheck disable=SC1090
  if [ -n "${SWIFT_PLT_GPU_ENV:-}" ]; then source "$SWIFT_PLT_GPU_ENV" >"$W/setup.log" 2>&1 || { echo "setup FAILED"; exit 1; }; fi
  command -v megatron >/dev/null 2>&1 || { echo "megatron (ms-swift[megatron]) not found"; exit 1; }
  (cd /tmp && python3 -c "import swift_plt") 2>/dev/null || { echo "swift-plt is not installed (pip install .)"; exit 1; }
  echo "setup: t=$((SECONDS - T0))s"
  if [ -n "${QUAL_TRACEBACK_EVERY:-}" ]; then
    mkdir -p "$W/runs/tb"
    echo "import faulthandler, os; faulthandler.dump_traceback_later(${QUAL_TRACEBACK_EVERY}, repeat=True, \
file=open(os.path.join('$W/runs/tb', '%d.txt' % os.getpid()), 'w'))" \
      >"$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_qual_traceback.pth"
  fi
  # training + exports get what is left after set-up, minus ~80 s for eval, report and bundling
  EXPORT_STARTS=()
  if [ -n "${QUAL_EXPORT_STARTS:-}" ]; then EXPORT_STARTS=(--export_starts "$W/report/starts.tar"); fi
  python3 benchmarks/quality/run.py --kit "$QKIT" --work "$W" --out "$W/report" \
    --deadline $((BUDGET - (SECONDS - T0) - ${QUAL_RESERVE:-110})) "${EXPORT_STARTS[@]}" ${QUAL_ARGS:-}
  echo "run.py rc=$? t=$((SECONDS - T0))s"
  python3 benchmarks/quality/regime.py "$W/report/results.json" --png "$W/report/regime.png" \
    --md "$W/report/regime.md" >/dev/null 2>&1 || echo "regime.py: no (b) run with a result in this call"
} 2>&1 | tee "$OUT/run.log"
# raw logs, without checkpoints, models or training data
cp "$W/report/results.md" "$W/report/results.json" "$W/report/quality.png" "$W/report/regime.md" \
  "$W/report/regime.png" "$W/report/continued.md" "$W/report/continued.png" "$W/report/starts.tar" "$OUT/" 2>/dev/null
(cd "$W" && find runs report setup.log data -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.log' \
  -o -name '*.txt' -o -name '*.png' -o -name '*.md' \) -not -path '*/checkpoint-*' -not -path '*/hf*/*' \
  -not \( -path 'data/*' -not -name 'data_stats*' \) -print0 \
  2>/dev/null | tar --null -T - -cJf "$OUT/logs.tar.xz")
ls -la "$OUT"
