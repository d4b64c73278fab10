"""scripts/cross.sh gets every prerequisite (the Rust targets, mingw-w64, wine, maturin, qemu-user
and the aarch64 cross gcc) before any check needs it, and where one cannot be had it skips
exactly the checks that need it, with one line, and exits 0.

The script runs against a PATH of stand-ins in a temporary folder (rustup, apt-get, id, sudo,
mingw's tools, wine, qemu, cargo, maturin) with the system's own tools (bash, grep, ...) linked
beside them: nothing is installed or downloaded and no real cargo runs. The stand-in cargo
answers the QEMU run as the dtype tests would, and fails the way pyo3's build script does when
the binding is checked for Windows without mingw's dlltool on PATH, so running the Windows
clippy before mingw is installed fails the script again."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "cross.sh"
WIN = "x86_64-pc-windows-gnu"
MAC = "aarch64-apple-darwin"
ARM = "aarch64-unknown-linux-gnu"
WINDOWS = ["clippy-windows", "clippy-windows-binding", "clippy-macos", "wine-tests", "wine-parity", "wheel-windows"]
ALL = [*WINDOWS, "qemu-arm-tests"]
# What apt-get's stand-in puts on PATH for each package (the C library goes to the sysroot).
PACKAGES = {
    "mingw-w64": ["x86_64-w64-mingw32-gcc", "x86_64-w64-mingw32-dlltool"],
    "wine": ["wine", "wineserver"],
    "wine64": [],
    "qemu-user": ["qemu-aarch64"],
    "gcc-aarch64-linux-gnu": ["aarch64-linux-gnu-gcc"],
    "libc6-dev-arm64-cross": [],
}
ARM_PACKAGES = ["qemu-user", "gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross"]
SKIP_ARM = "skipping the aarch64 dtype tests under QEMU"
# The system tools the script itself calls; anything else it looks for is a stand-in or absent.
SYSTEM = ["bash", "sh", "env", "dirname", "basename", "date", "grep", "sed", "awk", "cat", "cp", "chmod"]
SYSTEM += ["rm", "ls", "mkdir", "mktemp", "sha256sum", "cut", "tail", "touch", "flock", "true"]

SKIP_WIN = (
    "skipping clippy for Windows, the binding's clippy for Windows, the tests under Wine, "
    "trash-panda.exe against the Linux binary, the Windows wheel"
)
SKIP_MINGW = (
    "skipping the binding's clippy for Windows, the tests under Wine, "
    "trash-panda.exe against the Linux binary, the Windows wheel"
)
SKIP_WINE = "skipping the tests under Wine, trash-panda.exe against the Linux binary"


@dataclass
class Machine:
    """What the stand-in machine has and what its tools do."""

    targets: list[str] = field(default_factory=lambda: [WIN, MAC, ARM])  # installed
    rustup: bool = True
    rustup_adds: bool = False  # `rustup target add` works (a network)
    on_path: list[str] = field(default_factory=list)  # mingw-w64, wine: installed already
    uid: int = 0
    sudo: str | None = None  # None, "nopasswd" or "password"
    apt_get: bool = True
    apt_installs: list[str] = field(default_factory=list)  # packages apt-get can install
    maturin: bool = True
    arm_tools: bool = True  # qemu-aarch64, the aarch64 gcc and its C library: installed already


def _tool(path: Path, body: str, shebang: str = "/bin/sh") -> None:
    path.write_text(f"#!{shebang}\n{body}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _logger(log: Path, name: str) -> str:
    return f'echo "{name} $*" >> "{log}"\n'


def _stand_ins(tmp: Path, m: Machine) -> tuple[dict[str, str], Path]:
    bin_, repo, log = tmp / "bin", tmp / "repo", tmp / "calls.log"
    sysroot = tmp / "aarch64-linux-gnu"
    bin_.mkdir()
    log.touch()
    for name in SYSTEM:
        found = shutil.which(name)
        if found:
            (bin_ / name).symlink_to(found)
    (bin_ / "python3").symlink_to(os.path.realpath(sys.executable))

    # Each tool a package provides logs its calls; the cargo stand-in checks dlltool, not them.
    for pkg, tools in PACKAGES.items():
        (repo / pkg).mkdir(parents=True)
        for t in tools:
            _tool(repo / pkg / t, _logger(log, t))
            if pkg in m.on_path or (m.arm_tools and pkg in ARM_PACKAGES):
                shutil.copy2(repo / pkg / t, bin_ / t)
    if m.arm_tools:
        (sysroot / "lib").mkdir(parents=True)
        (sysroot / "lib" / "crt1.o").touch()

    _tool(bin_ / "id", f"echo {m.uid}\n")
    if m.sudo == "nopasswd":
        _tool(bin_ / "sudo", _logger(log, "sudo") + '[ "$1" = -n ] && shift\nexec "$@"\n')
    elif m.sudo == "password":
        _tool(bin_ / "sudo", _logger(log, "sudo") + "echo 'sudo: a password is required' >&2\nexit 1\n")
    if m.rustup:
        add = "exit 0" if m.rustup_adds else "echo 'error: could not download' >&2; exit 1"
        listed = "".join(f"echo {t}\n" for t in m.targets)
        _tool(
            bin_ / "rustup",
            _logger(log, "rustup") + f'case "$1 $2" in\n"target list") {listed};;\n"target add") {add};;\nesac\n',
        )
    if m.apt_get:
        installs = " ".join(m.apt_installs)
        _tool(
            bin_ / "apt-get",
            _logger(log, "apt-get")
            + f"""case " $* " in *" install "*) ;; *) exit 0 ;; esac
while [ "$1" != install ]; do shift; done
shift
for p in "$@"; do
  case $p in -*) continue ;; esac
  case " {installs} " in *" $p "*) ;; *) echo "E: Unable to locate package $p" >&2; exit 100 ;; esac
  cp "{repo}/$p/"* "{bin_}/" 2>/dev/null || true
  [ "$p" != libc6-dev-arm64-cross ] || {{ mkdir -p "{sysroot}/lib" && touch "{sysroot}/lib/crt1.o"; }}
done
""",
        )

    # cargo as pyo3's build script and the -gnu linker see it: the binding for Windows needs
    # mingw's dlltool, anything linked for Windows needs mingw's gcc.
    cargo = tmp / "cargo"
    _tool(
        cargo,
        _logger(log, "cargo")
        + f"""case " $* " in
  *" --target {WIN} "*)
    case " $* " in *" trash-panda-python "*)
      command -v x86_64-w64-mingw32-dlltool >/dev/null \\
        || {{ echo "error: failed to generate python3.dll import library" >&2; exit 101; }} ;;
    esac
    case $1 in build|test) command -v x86_64-w64-mingw32-gcc >/dev/null || exit 101 ;; esac ;;
esac
[ -z "$FAIL_CLIPPY" ] || [ "$1" != clippy ] || exit 101
case "$1 $*" in "test "*" --target {ARM} "*)
  echo "test dtype::neon::tests::the_neon_level_runs_here ... ok"
  echo "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out" ;;
esac
""",
    )
    maturin = tmp / "maturin"
    if m.maturin:
        _tool(
            maturin,
            f"""import os, shutil, sys, zipfile
with open({str(log)!r}, "a") as f:
    f.write("maturin " + " ".join(sys.argv[1:]) + "\\n")
if not shutil.which("x86_64-w64-mingw32-dlltool"):
    sys.exit("error: failed to generate python3.dll import library")
out = sys.argv[sys.argv.index("--out") + 1]
os.makedirs(out, exist_ok=True)
with zipfile.ZipFile(os.path.join(out, "dumpsterpanda-0.1.0-cp310-abi3-win_amd64.whl"), "w") as z:
    z.writestr("trash_panda/_core.pyd", b"")
""",
            shebang=os.path.realpath(sys.executable),
        )
    env = {
        "PATH": str(bin_),
        "HOME": str(tmp / "home"),
        "CARGO": str(cargo),
        "MATURIN": str(maturin),
        "CARGO_TARGET_DIR": str(tmp / "target"),
        "TRASH_PANDA_CACHE": str(tmp / "cache"),
        "TRASH_PANDA_ARM_SYSROOT": str(sysroot),
    }
    return env, log


@dataclass
class Run:
    rc: int
    out: str
    calls: list[str]

    @property
    def skips(self) -> list[str]:
        return [line for line in self.out.splitlines() if line.startswith("cross: no ")]

    @property
    def plan(self) -> list[str]:
        line = next(x for x in self.out.splitlines() if x.startswith("cross: dry run: would run: "))
        rest = line.removeprefix("cross: dry run: would run: ")
        return [] if rest == "nothing" else rest.split()

    def called(self, tool: str) -> list[str]:
        return [c for c in self.calls if c.split(" ", 1)[0] == tool]


def run(tmp_path: Path, m: Machine, dry: bool = True, **extra: str) -> Run:
    env, log = _stand_ins(tmp_path, m)
    env.update(extra)
    if dry:
        env["TRASH_PANDA_CROSS_DRY_RUN"] = "1"
    r = subprocess.run(
        [shutil.which("bash") or "/bin/bash", str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    return Run(r.returncode, r.stdout + r.stderr, log.read_text().splitlines())


def clippy(target: str, *packages: str) -> str:
    ps = " ".join(f"-p {p}" for p in packages)
    return f"cargo clippy --quiet --target {target} {ps} --all-targets -- -D warnings"


ALL_PACKAGES = ("trash-panda", "trash-panda-cli", "trash-panda-python")
# The dtype tests for aarch64 under QEMU, as the script calls cargo for them.
QEMU = [
    f"cargo test --target {ARM} -p trash-panda --lib -- dtype::",
    f"cargo test --target {ARM} -p trash-panda --test dtype_kernels --test dtype_quant"
    " -- --skip every_pair_threads_and_alignment_match_the_reference",
]
ROOTLESS = "not root and no passwordless sudo for apt-get"

# name: (machine, the lines that say what is skipped, the checks that run)
CASES: dict[str, tuple[Machine, list[str], list[str]]] = {
    "everything there": (Machine(on_path=["mingw-w64", "wine"]), [], ALL),
    "no Rust targets, rustup cannot add them": (
        Machine(targets=[], on_path=["mingw-w64", "wine"]),
        [
            f"cross: no Rust target {WIN} (rustup target add failed): {SKIP_WIN}",
            f"cross: no Rust target {MAC} (rustup target add failed): skipping clippy for macOS",
            f"cross: no Rust target {ARM} (rustup target add failed): {SKIP_ARM}",
        ],
        [],
    ),
    "no macOS target": (
        Machine(targets=[WIN], on_path=["mingw-w64", "wine"]),
        [
            f"cross: no Rust target {MAC} (rustup target add failed): skipping clippy for macOS",
            f"cross: no Rust target {ARM} (rustup target add failed): {SKIP_ARM}",
        ],
        ["clippy-windows", "clippy-windows-binding", "wine-tests", "wine-parity", "wheel-windows"],
    ),
    "no aarch64 target": (
        Machine(targets=[WIN, MAC], on_path=["mingw-w64", "wine"]),
        [f"cross: no Rust target {ARM} (rustup target add failed): {SKIP_ARM}"],
        WINDOWS,
    ),
    "no qemu or aarch64 gcc, apt-get fails": (
        Machine(on_path=["mingw-w64", "wine"], arm_tools=False),
        [f"cross: no qemu-user or the aarch64 cross gcc (apt-get failed): {SKIP_ARM}"],
        WINDOWS,
    ),
    "apt-get installs qemu and the aarch64 gcc": (
        Machine(on_path=["mingw-w64", "wine"], arm_tools=False, apt_installs=ARM_PACKAGES),
        [],
        ALL,
    ),
    "rustup adds the targets": (
        Machine(targets=[], rustup_adds=True, on_path=["mingw-w64", "wine"]),
        [],
        ALL,
    ),
    "no rustup": (
        Machine(rustup=False, on_path=["mingw-w64", "wine"]),
        [
            f"cross: no Rust target {WIN} (no rustup to add it): {SKIP_WIN}",
            f"cross: no Rust target {MAC} (no rustup to add it): skipping clippy for macOS",
            f"cross: no Rust target {ARM} (no rustup to add it): {SKIP_ARM}",
        ],
        [],
    ),
    "no mingw or wine, apt-get fails": (
        Machine(),
        [f"cross: no mingw-w64 (apt-get failed): {SKIP_MINGW}"],
        ["clippy-windows", "clippy-macos", "qemu-arm-tests"],
    ),
    "no mingw or wine, not root, no sudo": (
        Machine(uid=1000),
        [f"cross: no mingw-w64 ({ROOTLESS}): {SKIP_MINGW}"],
        ["clippy-windows", "clippy-macos", "qemu-arm-tests"],
    ),
    "no mingw, sudo asks for a password": (
        Machine(uid=1000, sudo="password", on_path=["wine"], apt_installs=["mingw-w64"]),
        [f"cross: no mingw-w64 ({ROOTLESS}): {SKIP_MINGW}"],
        ["clippy-windows", "clippy-macos", "qemu-arm-tests"],
    ),
    "no mingw, no apt-get": (
        Machine(apt_get=False, on_path=["wine"]),
        [f"cross: no mingw-w64 (no apt-get to install it): {SKIP_MINGW}"],
        ["clippy-windows", "clippy-macos", "qemu-arm-tests"],
    ),
    "mingw there, no wine, apt-get fails": (
        Machine(on_path=["mingw-w64"]),
        [f"cross: no wine (apt-get failed): {SKIP_WINE}"],
        ["clippy-windows", "clippy-windows-binding", "clippy-macos", "wheel-windows", "qemu-arm-tests"],
    ),
    "apt-get installs mingw, not wine": (
        Machine(apt_installs=["mingw-w64"]),
        [f"cross: no wine (apt-get failed): {SKIP_WINE}"],
        ["clippy-windows", "clippy-windows-binding", "clippy-macos", "wheel-windows", "qemu-arm-tests"],
    ),
    "apt-get installs both": (Machine(apt_installs=["mingw-w64", "wine", "wine64"]), [], ALL),
    "passwordless sudo installs both": (
        Machine(uid=1000, sudo="nopasswd", apt_installs=["mingw-w64", "wine", "wine64"]),
        [],
        ALL,
    ),
    "no maturin": (
        Machine(on_path=["mingw-w64", "wine"], maturin=False),
        ["cross: no {maturin} (run make venv): skipping the Windows wheel"],
        ["clippy-windows", "clippy-windows-binding", "clippy-macos", "wine-tests", "wine-parity", "qemu-arm-tests"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_decides_before_running_anything(tmp_path: Path, case: str) -> None:
    machine, skips, plan = CASES[case]
    r = run(tmp_path, machine)
    assert r.rc == 0, r.out
    assert r.skips == [s.format(maturin=tmp_path / "maturin") for s in skips], r.out
    assert r.plan == plan, r.out
    # A dry run obtains and decides, and runs no check: no cargo, maturin, wine or mingw call.
    assert [c for c in r.calls if c.split(" ", 1)[0] not in ("rustup", "apt-get", "sudo")] == [], r.calls


def test_installs_before_the_first_check(tmp_path: Path) -> None:
    m = Machine(apt_installs=["mingw-w64", "wine", "wine64"], targets=[], rustup_adds=True)
    r = run(tmp_path, m)
    assert r.rc == 0, r.out
    installs = [c for c in r.calls if c.startswith(("rustup target add", "apt-get"))]
    assert installs == [
        f"rustup target add {WIN}",
        f"rustup target add {MAC}",
        "apt-get -y -q -o DPkg::Lock::Timeout=300 install --no-install-recommends mingw-w64",
        "apt-get -y -q -o DPkg::Lock::Timeout=300 install --no-install-recommends wine wine64",
        f"rustup target add {ARM}",
    ]


def test_apt_get_update_once_then_retry(tmp_path: Path) -> None:
    r = run(tmp_path, Machine())
    apt = "apt-get -y -q -o DPkg::Lock::Timeout=300"
    assert r.called("apt-get") == [
        f"{apt} install --no-install-recommends mingw-w64",
        f"{apt} update",
        f"{apt} install --no-install-recommends mingw-w64",
    ]


@pytest.mark.parametrize("case", ["no mingw or wine, not root, no sudo", "no mingw, no apt-get"])
def test_nothing_tried_without_root_or_apt_get(tmp_path: Path, case: str) -> None:
    r = run(tmp_path, CASES[case][0])
    assert r.called("apt-get") == [], r.calls


# Whole runs (cargo and maturin stand-ins) that do not reach Wine, which would be the machine's
# own: what runs is what the dry run said, and the binding's Windows clippy comes after mingw is
# on PATH (the stand-in cargo fails otherwise).
@pytest.mark.parametrize(
    ("case", "cargo", "wheel"),
    [
        (
            "no mingw or wine, apt-get fails",
            [clippy(WIN, "trash-panda", "trash-panda-cli"), clippy(MAC, *ALL_PACKAGES), *QEMU],
            False,
        ),
        ("apt-get installs mingw, not wine", [clippy(WIN, *ALL_PACKAGES), clippy(MAC, *ALL_PACKAGES), *QEMU], True),
        ("mingw there, no wine, apt-get fails", [clippy(WIN, *ALL_PACKAGES), clippy(MAC, *ALL_PACKAGES), *QEMU], True),
        ("no Rust targets, rustup cannot add them", [], False),
    ],
)
def test_runs_what_it_decided(tmp_path: Path, case: str, cargo: list[str], wheel: bool) -> None:
    machine, skips, _ = CASES[case]
    r = run(tmp_path, machine, dry=False)
    assert r.rc == 0, r.out
    assert r.skips == skips, r.out
    assert r.called("cargo") == cargo, r.out
    assert bool(r.called("maturin")) == wheel, r.out
    if wheel:
        assert "cross: built dumpsterpanda-0.1.0-cp310-abi3-win_amd64.whl" in r.out, r.out
    assert r.out.splitlines()[-1].startswith("cross: done in "), r.out


def test_a_check_that_fails_fails(tmp_path: Path) -> None:
    r = run(tmp_path, CASES["no mingw or wine, apt-get fails"][0], dry=False, FAIL_CLIPPY="1")
    assert r.rc != 0, r.out
    assert "cross: done" not in r.out
