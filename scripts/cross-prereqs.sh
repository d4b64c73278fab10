# shellcheck shell=bash
# Sourced by scripts/cross.sh. Gets what the cross checks need before any of them runs, because
# the first check already needs most of it: the binding's build script calls mingw's dlltool
# (pyo3 writes python3.dll's import library) even under clippy. Then decides which checks run.
#
# A check whose prerequisite cannot be had (no network, no root, rustup or apt-get failing) is
# dropped with one line naming the prerequisite, why, and every check it takes with it. A
# prerequisite is only sought while some check still needs it, so each check is dropped once,
# for the first thing it lacks.
#
# Needs WIN, MAC, ARM, ARM_SYSROOT and MATURIN set. Leaves the ids of the checks to run, in
# order, in cross_plan:
#   clippy-windows          clippy of the core and the CLI for Windows    (the Rust target)
#   clippy-windows-binding  clippy of the binding for Windows             (+ mingw-w64)
#   clippy-macos            clippy of the core, the CLI and the binding   (the Rust target)
#   wine-tests              the core's and the CLI's tests under Wine     (+ mingw-w64, wine)
#   wine-parity             trash-panda.exe against the Linux binary      (+ mingw-w64, wine)
#   wheel-windows           the abi3 wheel for Windows                    (+ mingw-w64, maturin)
#   qemu-arm-tests          the core's dtype tests for aarch64 Linux      (the Rust target,
#                           under QEMU user-mode emulation                 + qemu-user and the
#                                                                            aarch64 cross gcc)

cross_plan=(clippy-windows clippy-windows-binding clippy-macos wine-tests wine-parity wheel-windows
  qemu-arm-tests)
cross_why=
cross_apt_updated=0

cross_describe() {
  case $1 in
    clippy-windows) echo "clippy for Windows" ;;
    clippy-windows-binding) echo "the binding's clippy for Windows" ;;
    clippy-macos) echo "clippy for macOS" ;;
    wine-tests) echo "the tests under Wine" ;;
    wine-parity) echo "trash-panda.exe against the Linux binary" ;;
    wheel-windows) echo "the Windows wheel" ;;
    qemu-arm-tests) echo "the aarch64 dtype tests under QEMU" ;;
    *) echo "$1" ;;
  esac
}

cross_planned() {
  case " ${cross_plan[*]:-} " in *" $1 "*) return 0 ;; esac
  return 1
}

# True when any of the checks named is still to run.
cross_wants() {
  local id
  for id in "$@"; do
    if cross_planned "$id"; then return 0; fi
  done
  return 1
}

# cross_drop "WHAT (WHY)" ID...: the checks named leave the plan, with one line for all of them.
cross_drop() {
  local what=$1 id kept=() dropped=""
  shift
  for id in "${cross_plan[@]}"; do
    case " $* " in
      *" $id "*) dropped="${dropped:+$dropped, }$(cross_describe "$id")" ;;
      *) kept+=("$id") ;;
    esac
  done
  cross_plan=(${kept[@]+"${kept[@]}"})
  if [ -n "$dropped" ]; then echo "cross: no $what: skipping $dropped"; fi
}

cross_rust_target() {
  if ! command -v rustup >/dev/null; then
    cross_why="no rustup to add it"
    return 1
  fi
  # grep reads all of rustup's output: an early exit would fail the pipe under pipefail.
  if rustup target list --installed 2>/dev/null | grep -x -- "$1" >/dev/null; then return 0; fi
  echo "cross: adding the Rust target $1 with rustup (once per toolchain)"
  if rustup target add "$1" >/dev/null 2>&1; then return 0; fi
  cross_why="rustup target add failed"
  return 1
}

cross_is_root() { [ "$(id -u)" = 0 ]; }

cross_as_root() {
  if cross_is_root; then "$@"; else sudo -n "$@"; fi
}

# apt-get as root; sudo would drop DEBIAN_FRONTEND from the environment, so env sets it.
cross_apt() {
  cross_as_root env DEBIAN_FRONTEND=noninteractive apt-get -y -q -o DPkg::Lock::Timeout=300 "$@" \
    >/dev/null 2>&1
}

cross_apt_install() {
  if ! command -v apt-get >/dev/null; then
    cross_why="no apt-get to install it"
    return 1
  fi
  if ! cross_is_root && ! { command -v sudo >/dev/null && sudo -n true 2>/dev/null; }; then
    cross_why="not root and no passwordless sudo for apt-get"
    return 1
  fi
  echo "cross: installing $* with apt-get (once per machine)"
  if cross_apt install --no-install-recommends "$@"; then return 0; fi
  # A fresh machine may have no package lists yet, or stale ones: update once and try again.
  if [ "$cross_apt_updated" = 0 ]; then
    cross_apt_updated=1
    if cross_apt update && cross_apt install --no-install-recommends "$@"; then return 0; fi
  fi
  cross_why="apt-get failed"
  return 1
}

# Fails, with cross_why set, when a tool named is not on PATH (after an install that said it worked).
cross_on_path() {
  local tool
  for tool in "$@"; do
    if ! command -v "$tool" >/dev/null; then
      cross_why="$tool is not on PATH"
      return 1
    fi
  done
}

cross_prereqs() {
  local win_all=(clippy-windows clippy-windows-binding wine-tests wine-parity wheel-windows)
  local needs_mingw=(clippy-windows-binding wine-tests wine-parity wheel-windows)
  # The linker of the -gnu target, and the dlltool pyo3 writes python3.dll's import library with.
  local mingw=(x86_64-w64-mingw32-gcc "${PYO3_MINGW_DLLTOOL:-x86_64-w64-mingw32-dlltool}")

  if ! cross_rust_target "$WIN"; then cross_drop "Rust target $WIN ($cross_why)" "${win_all[@]}"; fi
  if ! cross_rust_target "$MAC"; then cross_drop "Rust target $MAC ($cross_why)" clippy-macos; fi

  if cross_wants "${needs_mingw[@]}" && ! cross_on_path "${mingw[@]}"; then
    if ! { cross_apt_install mingw-w64 && cross_on_path "${mingw[@]}"; }; then
      cross_drop "mingw-w64 ($cross_why)" "${needs_mingw[@]}"
    fi
  fi

  if cross_wants wine-tests wine-parity && ! cross_on_path wine; then
    if ! { cross_apt_install wine wine64 && cross_on_path wine; }; then
      cross_drop "wine ($cross_why)" wine-tests wine-parity
    fi
  fi

  if cross_wants wheel-windows && [ ! -x "$MATURIN" ]; then
    cross_drop "$MATURIN (run make venv)" wheel-windows
  fi

  # The aarch64 tests: the Rust target, the cross gcc as linker (with the target's C library:
  # Debian only recommends it, and recommendations are not installed) and qemu-aarch64.
  if ! cross_rust_target "$ARM"; then cross_drop "Rust target $ARM ($cross_why)" qemu-arm-tests; fi
  if cross_wants qemu-arm-tests && ! cross_arm_tools; then
    if ! { cross_apt_install qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross \
      && cross_arm_tools; }; then
      cross_drop "qemu-user or the aarch64 cross gcc ($cross_why)" qemu-arm-tests
    fi
  fi
}

# Fails, with cross_why set, when the aarch64 linker, its C library or qemu-aarch64 is missing.
# ARM_SYSROOT is where Debian's cross packages put the target's C library (a test moves it).
cross_arm_tools() {
  cross_on_path aarch64-linux-gnu-gcc qemu-aarch64 || return 1
  if [ ! -f "$ARM_SYSROOT/lib/crt1.o" ]; then
    cross_why="no aarch64 C library in $ARM_SYSROOT"
    return 1
  fi
}
