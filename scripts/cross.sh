#!/usr/bin/env bash
# The Windows and macOS part of `make test`:
#   1. clippy -D warnings on the core, the CLI and the binding for x86_64-pc-windows-gnu and
#      aarch64-apple-darwin;
#   2. the core's and the CLI's test suites built for Windows and run under Wine;
#   3. trash-panda.exe under Wine against the Linux binary (inspect, plan --json);
#   4. the abi3 wheel for Windows (build only).
# What it needs (the Rust targets, wine and mingw-w64) it installs when missing. Where that is
# impossible (no network, no root), the checks that need it print one line and are skipped:
# `make test` never fails for lack of a download. Anything that runs and fails, fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
CARGO=${CARGO:-cargo}
WIN=x86_64-pc-windows-gnu
MAC=aarch64-apple-darwin
cache=${TRASH_PANDA_CACHE:-$HOME/.cache/trash-panda}
target_dir=${CARGO_TARGET_DIR:-$root/target}
start=$(date +%s)

say() { echo "cross: $*"; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo -n "$@"; else return 1; fi
}

# 1. Rust targets and clippy.
targets=()
for t in "$WIN" "$MAC"; do
  if rustup target list --installed 2>/dev/null | grep -qx "$t" \
    || rustup target add "$t" >/dev/null 2>&1; then
    targets+=("$t")
  else
    say "cannot fetch the Rust target $t (rustup target add failed): its checks are skipped"
  fi
done
for t in "${targets[@]}"; do
  say "clippy for $t"
  $CARGO clippy --quiet --target "$t" -p trash-panda -p trash-panda-cli -p trash-panda-python \
    --all-targets -- -D warnings
done
case " ${targets[*]} " in *" $WIN "*) ;; *) exit 0 ;; esac

# 2. Wine and mingw-w64 (the linker of the -gnu target and the stand-in DLL below).
if ! command -v wine >/dev/null || ! command -v x86_64-w64-mingw32-gcc >/dev/null; then
  say "installing wine and mingw-w64 with apt-get (once per machine)"
  export DEBIAN_FRONTEND=noninteractive
  if ! { as_root apt-get install -y -q --no-install-recommends wine wine64 mingw-w64 >/dev/null 2>&1 \
    || { as_root apt-get update -q >/dev/null 2>&1 \
      && as_root apt-get install -y -q --no-install-recommends wine wine64 mingw-w64 >/dev/null 2>&1; }; }; then
    say "cannot install wine and mingw-w64 (apt-get failed): the Windows test run is skipped"
    exit 0
  fi
fi
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
trap '"$wineserver_bin" -k >/dev/null 2>&1 || true' EXIT

# 3. The test suites under Wine. The runner is called with the test binary and its arguments.
say "core and CLI tests under Wine"
log=$(mktemp)
trap '"$wineserver_bin" -k >/dev/null 2>&1 || true; rm -f "$log"' EXIT
set +e
CARGO_TARGET_X86_64_PC_WINDOWS_GNU_RUNNER="$wine_bin" \
  $CARGO test --no-fail-fast --target "$WIN" -p trash-panda -p trash-panda-cli >"$log" 2>&1
rc=$?
set -e
if [ "$rc" != 0 ]; then
  # Now and then Wine fails to start a test binary (exit status 1 before the harness prints a
  # line). A binary that never started is run once more; one whose tests ran and failed is not.
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

# 4. The Windows exe against the Linux binary on the same checkpoint.
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

# 5. The abi3 wheel for Windows (pyo3 writes python3.dll's import library: no Windows Python).
maturin=.venv/bin/maturin
if [ -x "$maturin" ]; then
  say "abi3 wheel for Windows"
  wheels="$target_dir/wheels-windows"
  rm -rf "$wheels"
  "$maturin" build --quiet --target "$WIN" --out "$wheels" >/dev/null 2>&1 \
    || { "$maturin" build --target "$WIN" --out "$wheels"; exit 1; }
  wheel=$(ls "$wheels"/*-abi3-win_amd64.whl)
  python3 - "$wheel" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
assert "trash_panda/_core.pyd" in names, names
print("cross: built", sys.argv[1].rsplit("/", 1)[-1])
EOF
else
  say "no $maturin (run make venv): the Windows wheel build is skipped"
fi
say "done in $(( $(date +%s) - start )) s"
