"""The NEON kernels' inner loops on Arm cores, by llvm-mca's models (`make bench-neon-model`).

This project has no Arm machine: the NEON kernels are tested bit for bit under QEMU, whose
speed says nothing of a core's. What can be had is the loops as the compiler emits them and a
model of each core's pipelines. This builds the core for aarch64-unknown-linux-gnu as assembly,
finds each kernel's inner loop (by the function it is in and the instructions that mark it),
and runs llvm-mca on it for Neoverse N1 (Graviton2), V1 (Graviton3), V2 (Graviton4) and Apple
M1, printing cycles per 16 bytes written with data in L1 (what the core's pipes allow, not what
memory does) and writing them to bench/results/neon_model.md. With --against REV the same loops
of that commit are built in a worktree and printed beside them, with the ratio.

Needs the aarch64 Rust target and llvm-mca 17 or later (Debian's llvm-19 has it; the make
target installs it when apt-get can).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = "aarch64-unknown-linux-gnu"
CPUS = ("neoverse-n1", "neoverse-v1", "neoverse-v2", "apple-m1")
ITERATIONS = 1000
OUT = ROOT / "bench" / "results" / "neon_model.md"


@dataclass(frozen=True)
class Loop:
    """A kernel's inner loop: in a function whose mangled name holds `function`, the
    smallest loop that holds every instruction of one of `signatures` (tried in order) and
    none of `excluded`."""

    name: str
    function: str
    signatures: tuple[frozenset[str], ...]
    excluded: frozenset[str] = frozenset()


LOOPS = (
    Loop(
        "f32 -> bf16",
        "4neon7convert",
        (frozenset({"urhadd"}), frozenset({"addhn"})),
        frozenset({"fmul", "tbl", "bl", "fcvtn"}),
    ),
    Loop(
        "f32 -> f16",
        "4neon7convert",
        (frozenset({"fcvtn"}),),
        frozenset({"fmul", "tbl", "bl", "addhn", "urhadd"}),
    ),
    Loop(
        "fp8 -> bf16 or f16, by table (unscaled, per-tensor, per-row)",
        "4neon6expand8half_run",
        (frozenset({"tbx", "st2"}),),
    ),
    Loop(
        "bf16 -> e4m3 quantize (runs of 1024 values or more)",
        "4neon6narrow12half_to_e4m3",
        (frozenset({"tbx", "urshl"}), frozenset({"fcvtnu", "shll"})),
        frozenset({"fdiv", "fcvtl"}),
    ),
    Loop(
        "bf16 -> e4m3 quantize, computed (short runs)",
        "4neon6narrow12half_to_e4m3",
        (frozenset({"fcvtnu", "shll"}),),
        frozenset({"fdiv", "fcvtl", "tbx"}),
    ),
    Loop(
        "f16 -> e4m3 quantize, by table (runs of 1024 or more, from the first normal binade up)",
        "4neon6narrow12half_to_e4m3",
        (frozenset({"tbl", "ld2", "umaxv"}),),
        frozenset({"tbx", "fcvtnu", "urshl"}),
    ),
    Loop(
        "f16 -> e4m3 quantize, computed",
        "4neon6narrow12half_to_e4m3",
        (frozenset({"fcvtnu", "fcvtl"}),),
        frozenset({"fdiv", "shll"}),
    ),
)

# Lines of a function that are not instructions of its loops.
NOISE = re.compile(r"^\s*(\.(loc|p2align|cfi|file)\b|//)|^\.Ltmp")
BRANCH = re.compile(r"^\s*(b|b\.\w+|cbn?z|tbn?z)\s.*?(\.LBB\w+)\s*$")
VECTOR_STORE = re.compile(r"^\s*(st1|st2|st3|st4|str|stp|stnp|stur)\s+(.*)$")


def functions(asm: str) -> dict[str, list[str]]:
    """The instruction lines and labels of each function of `asm`, by mangled name."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in asm.splitlines():
        m = re.match(r"^(_ZN\S+):$", line)
        if m:
            current = out.setdefault(m.group(1), [])
        elif current is not None:
            if line.strip().startswith(".cfi_endproc"):
                current = None
            elif not NOISE.match(line):
                current.append(line)
    return out


def loops(body: list[str]) -> list[list[str]]:
    """Every span from a label to a branch back to it, as instruction lines."""
    labels = {}
    for i, line in enumerate(body):
        m = re.match(r"^(\.LBB\w+):", line)
        if m:
            labels[m.group(1)] = i
    spans = []
    for i, line in enumerate(body):
        m = BRANCH.match(line)
        if m and labels.get(m.group(2), i) < i:
            start = labels[m.group(2)]
            spans.append([x for x in body[start + 1 : i] if not x.startswith(".LBB")])
    return spans


def mnemonics(lines: list[str]) -> set[str]:
    return {line.split()[0] for line in lines if line.strip()}


def bytes_stored(lines: list[str]) -> int:
    """Bytes one iteration writes through vector registers (bookkeeping stores of general
    registers left out)."""
    total = 0
    for line in lines:
        m = VECTOR_STORE.match(line)
        if not m:
            continue
        regs = re.findall(r"\b([qdv])(\d+)(?:\.(\d+)([bhsd]))?", m.group(2).split("[")[0])
        for kind, _, lanes, lane in regs:
            if kind == "q":
                total += 16
            elif kind == "d":
                total += 8
            elif lanes:
                total += int(lanes) * {"b": 1, "h": 2, "s": 4, "d": 8}[lane]
    return total


def find(funcs: dict[str, list[str]], loop: Loop) -> list[str] | None:
    for signature in loop.signatures:
        found = [
            span
            for name, body in funcs.items()
            if loop.function in name
            for span in loops(body)
            if signature <= mnemonics(span) and not loop.excluded & mnemonics(span)
        ]
        if found:
            return min(found, key=len)
    return None


def cycles(mca: str, lines: list[str], cpu: str) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".s") as f:
        f.write("\n".join(lines) + "\n")
        f.flush()
        out = subprocess.run(
            [mca, "-mtriple=aarch64", f"-mcpu={cpu}", f"-iterations={ITERATIONS}", f.name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    m = re.search(r"Total Cycles:\s+(\d+)", out)
    if not m:
        sys.exit(f"llvm-mca printed no cycle count for {cpu}")
    return int(m.group(1)) / ITERATIONS


def assembly(tree: Path) -> str:
    """The core built for aarch64 as one assembly file (release, one codegen unit)."""
    env = dict(os.environ, CARGO_TARGET_DIR=str(tree / "target" / "neon-model"))
    deps = tree / "target" / "neon-model" / TARGET / "release" / "deps"
    build = ["cargo", "rustc", "-q", "-p", "trash-panda", "--release", "--target", TARGET]
    for _ in range(2):
        subprocess.run(
            [*build, "--lib", "--", "--emit", "asm", "-C", "codegen-units=1"],
            cwd=tree,
            env=env,
            check=True,
        )
        # Where nothing changed cargo builds nothing, and the file it wrote last is this
        # build's; where that file is gone, the crate is cleaned and built again.
        found = sorted(deps.glob("trash_panda-*.s"), key=lambda p: p.stat().st_mtime)
        if found:
            return found[-1].read_text()
        clean = ["cargo", "clean", "-q", "-p", "trash-panda", "--release", "--target", TARGET]
        subprocess.run(clean, cwd=tree, env=env, check=True)
    sys.exit(f"cargo wrote no assembly under {deps}")


def model(mca: str, asm: str) -> dict[str, tuple[int, list[float]] | None]:
    """Per loop: its length and cycles per 16 bytes written on each of CPUS."""
    funcs = functions(asm)
    out: dict[str, tuple[int, list[float]] | None] = {}
    for loop in LOOPS:
        lines = find(funcs, loop)
        stored = bytes_stored(lines) if lines else 0
        if not lines or not stored:
            out[loop.name] = None
            continue
        out[loop.name] = (len(lines), [cycles(mca, lines, c) * 16 / stored for c in CPUS])
    return out


def llvm_mca() -> str:
    for name in ("llvm-mca-19", "llvm-mca-18", "llvm-mca-17", "llvm-mca"):
        path = shutil.which(name)
        if path:
            version = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
            m = re.search(r"version (\d+)", version)
            if m and int(m.group(1)) >= 17:
                return path
    sys.exit("llvm-mca 17 or later is needed (Debian: apt-get install llvm-19)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", metavar="REV", help="a commit to model beside this tree")
    args = parser.parse_args()
    mca = llvm_mca()
    now = model(mca, assembly(ROOT))
    before = None
    if args.against:
        with tempfile.TemporaryDirectory() as tmp:
            tree = Path(tmp) / "tree"
            subprocess.run(
                ["git", "worktree", "add", "-q", "--detach", str(tree), args.against],
                cwd=ROOT,
                check=True,
            )
            try:
                before = model(mca, assembly(tree))
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT)
    version = subprocess.run([mca, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"version ([\d.]+)", version)
    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    against = f' ARGS="--against {args.against}"' if args.against else ""
    beside = f" (and {args.against} beside it)" if args.against else ""
    lines = [
        "# NEON loops in llvm-mca's models (`make bench-neon-model`): cycles per 16 bytes written",
        "",
        f"- date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- machine: llvm-mca {m.group(1) if m else '?'} models of "
        + ", ".join(CPUS)
        + f" (no Arm machine; built on {host_cpu()})",
        f"- method: `make bench-neon-model{against}`: the core at {rev}{beside} built for"
        " aarch64 as assembly, each kernel's inner loop picked out of its function,"
        f" {ITERATIONS} iterations with the data in L1; a model of the core's pipes, not a timing",
        "",
        f"| loop | instructions | {' | '.join(CPUS)} |",
        "|---|---:|" + "---:|" * len(CPUS),
    ]
    for name, got in now.items():
        if got is None:
            lines.append(f"| {name} | not found |" + " |" * len(CPUS))
            continue
        n, cs = got
        was = before.get(name) if before else None
        if was:
            cells = [f"{b:.2f} -> {c:.2f} ({b / c:.2f}x)" for b, c in zip(was[1], cs, strict=True)]
            lines.append(f"| {name} | {was[0]} -> {n} | " + " | ".join(cells) + " |")
        else:
            lines.append(f"| {name} | {n} | " + " | ".join(f"{c:.2f}" for c in cs) + " |")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")


def host_cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "an unknown CPU"


if __name__ == "__main__":
    main()
