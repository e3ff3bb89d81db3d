# Shared by the GPU scripts (run_all.sh, critic_train.sh): `source tests/gpu/lib.sh` from the repo root.
#   gpu_init OUT_DEFAULT SUMMARY WORK BUDGET_DEFAULT: $OUT (created, exported; the device tool sets it), $SUM (emptied),
#     $W (scratch dir, emptied, with runs/), $BUDGET (env BUDGET wins), $T0
#   left / cap WANT / say MSG / now: seconds left of the budget, WANT capped to them (>= 5), MSG to stdout and $SUM,
#     "t=<elapsed>s"
#   install_plugin: pip-install this repo into the interpreter's site-packages (the .pth startup hook needs a real
#     site dir); prints INSTALLED_BY=...
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
