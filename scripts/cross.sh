#!/usr/bin/env bash
# The Windows and macOS part of `make test`:
#   1. clippy -D warnings on the core, the CLI and the binding for x86_64-pc-windows-gnu and
#      aarch64-apple-darwin;
#   2. the core's and the CLI's test suites built for Windows and run under Wine;
#   3. trash-panda.exe under Wine against the Linux binary (inspect, plan --json);
#   4. the abi3 wheel for Windows (build only);
#   5. the core's dtype tests built for aarch64-unknown-linux-gnu and run under QEMU user-mode
#      emulation, so the NEON kernels are checked bit for bit on an x86 machine.
# What it needs (the Rust targets, mingw-w64, wine, qemu-user and the aarch64 cross gcc) it
# installs first, when missing
# (scripts/cross-prereqs.sh). Where that is impossible (no network, no root), the checks that need
# it are skipped with one line: `make test` never fails for lack of a download. Anything that
# runs and fails, fails.
# TRASH_PANDA_CROSS_DRY_RUN=1 gets the prerequisites and prints the checks it would run, and
# runs none of them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
CARGO=${CARGO:-cargo}
MATURIN=${MATURIN:-.venv/bin/maturin}
WIN=x86_64-pc-windows-gnu
MAC=aarch64-apple-darwin
ARM=aarch64-unknown-linux-gnu
ARM_SYSROOT=${TRASH_PANDA_ARM_SYSROOT:-/usr/aarch64-linux-gnu}
cache=${TRASH_PANDA_CACHE:-$HOME/.cache/trash-panda}
target_dir=${CARGO_TARGET_DIR:-$root/target}
start=$(date +%s)

say() { echo "cross: $*"; }

# shellcheck source=scripts/cross-prereqs.sh
. "$root/scripts/cross-prereqs.sh"
cross_prereqs
if [ "${TRASH_PANDA_CROSS_DRY_RUN:-0}" = 1 ]; then
  say "dry run: would run: ${cross_plan[*]:-nothing}"
  exit 0
fi

# 1. clippy.
if cross_planned clippy-windows; then
  packages=(-p trash-panda -p trash-panda-cli)
  if cross_planned clippy-windows-binding; then packages+=(-p trash-panda-python); fi
  say "clippy for $WIN"
  $CARGO clippy --quiet --target "$WIN" "${packages[@]}" --all-targets -- -D warnings
fi
if cross_planned clippy-macos; then
  say "clippy for $MAC"
  $CARGO clippy --quiet --target "$MAC" -p trash-panda -p trash-panda-cli -p trash-panda-python \
    --all-targets -- -D warnings
fi

# 2 and 3, under Wine (both or neither: they need the same things).
if cross_wants wine-tests wine-parity; then
  wine_bin=$(command -v wine)
  [ -x /usr/lib/wine/wine64 ] && wine_bin=/usr/lib/wine/wine64
  wineserver_bin=$(command -v wineserver || echo /usr/lib/wine/wineserver64)
  [ -x /usr/lib/wine/wineserver64 ] && wineserver_bin=/usr/lib/wine/wineserver64

  # A Wine prefix per Wine version and stand-in DLL, made once (wineboot takes a while).
  stub=scripts/wine/bcryptprimitives
  key=$( ("$wine_bin" --version; cat "$stub.c" "$stub.def") | sha256sum | cut -c1-12)
  export WINEPREFIX="$cache/wine-$key"
  mkdir -p "$cache"
  # Checkouts on one machine share the prefix: one run at a time uses it (another waits here),
  # so ending the wineserver below never ends someone else's tests.
  exec 9>"$WINEPREFIX.lock"
  if ! flock -w 900 9; then
    say "another run has held $WINEPREFIX for 15 minutes (a hung Wine?): giving up"
    exit 1
  fi
  export WINEDEBUG=-all
  # No Mono or Gecko: nothing here needs .NET or a browser, and their installers would prompt.
  export WINEDLLOVERRIDES="mscoree,mshtml="
  if [ ! -f "$WINEPREFIX/.complete" ]; then
    say "making the Wine prefix $WINEPREFIX (once)"
    rm -rf "$WINEPREFIX"
    mkdir -p "$WINEPREFIX"
    "$wine_bin" wineboot -i >/dev/null 2>&1 || true
    "$wineserver_bin" -w
    # Rust's std takes its random seeds from ProcessPrng in bcryptprimitives.dll, which Debian's
    # Wine 8 does not have; a stand-in that forwards to RtlGenRandom goes into the prefix.
    x86_64-w64-mingw32-gcc -O2 -shared -o "$WINEPREFIX/drive_c/windows/system32/bcryptprimitives.dll" \
      "$stub.c" "$stub.def" -ladvapi32
    touch "$WINEPREFIX/.complete"
  fi
  # One wineserver for the whole run instead of one per test binary (Wine starts in a tenth of
  # a second instead of two); ended with this prefix's Wine processes when the script exits, so
  # nothing of ours outlives `make test` or holds its output open.
  "$wineserver_bin" -p </dev/null >/dev/null 2>&1
  log=$(mktemp)
  trap '"$wineserver_bin" -k >/dev/null 2>&1 || true; rm -f "$log"' EXIT
fi

# 2. The test suites under Wine. The runner is called with the test binary and its arguments.
if cross_planned wine-tests; then
  say "core and CLI tests under Wine"
  set +e
  CARGO_TARGET_X86_64_PC_WINDOWS_GNU_RUNNER="$wine_bin" \
    $CARGO test --no-fail-fast --target "$WIN" -p trash-panda -p trash-panda-cli >"$log" 2>&1
  rc=$?
  set -e
  if [ "$rc" != 0 ]; then
    # Now and then Wine fails to start a test binary (exit status 1 before the harness prints a
    # line). A binary that never started is run once more; one whose tests ran and failed is not.
    # shellcheck disable=SC2016 # the backquotes are cargo's, matched literally
    failed=$(sed -n 's/.*process didn.t exit successfully: `[^ ]* \([^ `]*\.exe\).*/\1/p' "$log")
    started=$(awk '/^ +Running .*\.exe\)$/ { exe = $NF; gsub(/[()]/, "", exe) }
                   /^running [0-9]+ tests?$/ && exe != "" { n = split(exe, p, "/"); print p[n]; exe = "" }' "$log")
    retried=0
    for exe in $failed; do
      if printf '%s\n' "$started" | grep -qxF "$(basename "$exe")"; then
        retried=-1
        break
      fi
      say "$(basename "$exe") did not start under Wine; running it again"
      if ! "$wine_bin" "$exe" >>"$log" 2>&1; then
        retried=-1
        break
      fi
      retried=$((retried + 1))
    done
    if [ -z "$failed" ] || [ "$retried" -le 0 ]; then
      grep -vE '^\s+(Compiling|Checking)' "$log" | tail -60
      say "tests failed under Wine"
      exit 1
    fi
  fi
  awk '/^test result/ { p += $4; f += $6; i += $8 } END {
    printf "cross: under Wine: %d passed, %d failed, %d ignored\n", p, f, i }' "$log"
  grep -E '^test .* ignored, ' "$log" | sed 's/^/cross:   skipped: /' || true
fi

# 3. The Windows exe against the Linux binary on the same checkpoint.
if cross_planned wine-parity; then
  say "trash-panda.exe under Wine against the Linux binary"
  $CARGO build --quiet --target "$WIN" -p trash-panda-cli
  set +e
  TRASH_PANDA_WINDOWS_EXE="$target_dir/$WIN/debug/trash-panda.exe" TRASH_PANDA_WINE="$wine_bin" \
    $CARGO test -p trash-panda-cli --test wine_parity -- --ignored >"$log" 2>&1
  rc=$?
  set -e
  if [ "$rc" != 0 ]; then
    grep -vE '^\s+(Compiling|Checking)' "$log" | tail -60
    say "trash-panda.exe under Wine and the Linux binary disagree (or Wine failed)"
    exit 1
  fi
  grep -E '^test result' "$log" | sed 's/^/cross: parity: /'
fi

# 4. The abi3 wheel for Windows (pyo3 writes python3.dll's import library: no Windows Python).
if cross_planned wheel-windows; then
  say "abi3 wheel for Windows"
  wheels="$target_dir/wheels-windows"
  rm -rf "$wheels"
  "$MATURIN" build --quiet --target "$WIN" --out "$wheels" >/dev/null 2>&1 \
    || { "$MATURIN" build --target "$WIN" --out "$wheels"; exit 1; }
  wheel=$(ls "$wheels"/*-abi3-win_amd64.whl)
  python3 - "$wheel" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
assert "trash_panda/_core.pyd" in names, names
print("cross: built", sys.argv[1].rsplit("/", 1)[-1])
EOF
fi
# 5. The dtype tests for aarch64 under QEMU: the level tests then run portable and neon, and
# one test fails unless neon is the level the emulated CPU gets. A target dir of their own keeps
# the host builds warm, under the user's cache as the venv is, so a fresh clone (CI) builds only
# the core and not its dependencies again; optimized (opt-level 2), since emulation makes debug
# code crawl. The threaded test over every pair and a million elements takes minutes emulated,
# and checks no kernel that the other tests leave out: skipped here.
if cross_planned qemu-arm-tests; then
  say "dtype tests for $ARM under QEMU (the neon kernels)"
  qemu_start=$(date +%s)
  qlog=$(mktemp)
  qemu_test() {
    CARGO_TARGET_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/trash-panda/target-qemu" CARGO_PROFILE_DEV_OPT_LEVEL=2 \
      CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
      CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L $ARM_SYSROOT" \
      $CARGO test --target "$ARM" -p trash-panda "$@" >>"$qlog" 2>&1
  }
  if ! { qemu_test --lib -- dtype:: \
    && qemu_test --test dtype_kernels --test dtype_quant \
      -- --skip every_pair_threads_and_alignment_match_the_reference; }; then
    grep -vE '^\s+(Compiling|Checking)' "$qlog" | tail -60
    rm -f "$qlog"
    say "dtype tests failed for $ARM under QEMU"
    exit 1
  fi
  if ! grep -q '^test dtype::neon::tests::the_neon_level_runs_here \.\.\. ok$' "$qlog"; then
    rm -f "$qlog"
    say "the neon level did not run under QEMU"
    exit 1
  fi
  awk -v s=$(( $(date +%s) - qemu_start )) '/^test result/ { p += $4; f += $6; i += $8 } END {
    printf "cross: under QEMU: %d passed, %d failed, %d ignored in %d s\n", p, f, i, s }' "$qlog"
  rm -f "$qlog"
fi
say "done in $(( $(date +%s) - start )) s"
