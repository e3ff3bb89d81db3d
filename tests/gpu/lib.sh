# Shared by the GPU scripts (run_all.sh, critic_train.sh): `source tests/gpu/lib.sh` from the repo root.
#   gpu_init OUT_DEFAULT SUMMARY WORK BUDGET_DEFAULT: $OUT (created, exported; the device tool sets it), $SUM (emptied),
#     $W (scratch dir, emptied, with runs/), $BUDGET (env BUDGET wins), $T0
#   left / cap WANT / say MSG / now: seconds left of the budget, WANT capped to them (>= 5), MSG to stdout and $SUM,
#     "t=<elapsed>s"
#   install_plugin: pip-install this repo into the interpreter's site-packages (the .pth startup hook needs a real
#     site dir); prints INSTALLED_BY=...
#   critic_setup: (critic_train.sh, critic_cp.sh) machine line, .gpu_kit, plugin, tiny Llama $W/tiny/model, critic rows
#     $W/reward.jsonl (512) and $W/returns.jsonl (256, with old_values), a tiny critic $W/critic with a random value
#     head N(0, 0.05); logs in $OUT, lines in $SUM; returns 1 if the kit cannot be sourced
gpu_init() {
  OUT=${OUT:-$1}
  mkdir -p "$OUT"
  export OUT
  SUM=$OUT/$2
  : >"$SUM"
  W=$3
  rm -rf "$W"
  mkdir -p "$W/runs"
  BUDGET=${BUDGET:-$4}
  T0=$SECONDS
}
left() { echo $((BUDGET - (SECONDS - T0))); }
cap() { # cap WANT: WANT seconds, or what is left of the budget (at least 5)
  local want=$1 l
  l=$(left)
  [ "$l" -lt "$want" ] && want=$l
  [ "$want" -lt 5 ] && want=5
  echo "$want"
}
say() { echo "$*" | tee -a "$SUM"; }
now() { echo "t=$((SECONDS - T0))s"; }
install_plugin() {
  python3 -m pip install --no-deps --no-build-isolation --no-index . && echo "INSTALLED_BY=pip" && return 0
  python3 -m pip install --no-deps --no-build-isolation --no-index --break-system-packages . &&
    echo "INSTALLED_BY=pip(--break-system-packages)" && return 0
  # last resort: put in site-packages exactly what the wheel holds (setup.py: swift_plt, patches -> swift_plt/patches,
  # swift_plt_startup.pth at the root)
  local sp
  sp=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  [ -w "$sp" ] || sp=$(python3 -m site --user-site)
  mkdir -p "$sp" && rm -rf "$sp/swift_plt" && cp -r swift_plt "$sp/" && rm -rf "$sp/swift_plt/patches" &&
    cp -r patches "$sp/swift_plt/patches" && cp swift_plt_startup.pth "$sp/" && echo "INSTALLED_BY=copy($sp)"
}
critic_setup() {
  say "machine: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | xargs), $(nproc) CPUs"
  # shellcheck disable=SC1091
  if ! source .gpu_kit/setup_device.sh >"$OUT/setup_kit.log" 2>&1; then
    say "0 setup: FAILED to source .gpu_kit/setup_device.sh (see setup_kit.log); stopping"
    return 1
  fi
  install_plugin >"$OUT/pip_install.log" 2>&1
  say "0 setup: plugin $(grep -o 'INSTALLED_BY=.*' "$OUT/pip_install.log" | tail -1); $(now)"
  python3 .gpu_kit/make_tiny_llama.py --out "$W/tiny" --max-pos 2048 >"$OUT/make_tiny.log" 2>&1
  python3 tests/harness/critic_rows.py "$W/reward.jsonl" reward 512 &&
    python3 tests/harness/critic_rows.py "$W/returns.jsonl" returns 256 &&
    python3 -c "import sys; sys.path.insert(0, 'tests'); from harness.tiny import make_tiny_critic
make_tiny_critic('$W/critic', '$W/tiny/model', head_std=0.05)" >"$OUT/make_critic.log" 2>&1
  say "0 data: rc=$? tiny model $(grep -E '^model:' "$OUT/make_tiny.log" | head -1); $(now)"
}
