"""The dtype kernels' inner loops on CPUs this project has no machine of, by llvm-mca's models.

`make bench-neon-model` (NEON, Arm) and `make bench-avx2-model` (AVX2, x86 without AVX-512).

The NEON kernels are tested bit for bit under QEMU and the AVX2 ones on an AVX-512 Xeon with
the AVX2 path forced, but neither says how fast they run on an Arm core or an AVX2-only one.
What can be had is the loops as the compiler emits them and a model of each core's pipelines.
This builds the core as assembly for the ISA's target, finds each kernel's inner loop (in the
function it belongs to, the shortest way round it that holds the instructions marking it, so
that the code a rare branch leads to is left out) and runs llvm-mca on it for the ISA's cores,
printing cycles per 16 bytes written with data in L1 (what the core's pipes allow, not what
memory does) and writing them to bench/results/<isa>_model.md. With --against REV the same
loops of that commit are built in a worktree and printed beside them, with the ratio.

Needs llvm-mca 17 or later (Debian's llvm-19 has it; the make targets install it when apt-get
can) and the ISA's Rust target (the make targets add it).
"""

from __future__ import annotations

import argparse
import heapq
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ITERATIONS = 1000


@dataclass(frozen=True)
class Loop:
    """A kernel's inner loop: in a function whose mangled name holds `function`, the
    shortest cycle that holds every instruction of one of `signatures` (tried in order) and
    none of `excluded`."""

    name: str
    function: str
    signatures: tuple[frozenset[str], ...]
    excluded: frozenset[str] = frozenset()
    # For a loop that writes nothing: an instruction and how many bytes of output each one
    # stands for (the amax pass: each `vpmaxuw` takes 16 values, whose codes are 16 bytes).
    stands_for: tuple[str, int] | None = None


@dataclass(frozen=True)
class Isa:
    """What differs between the ISAs: where the core is built, how its assembly reads, which
    loops and cores are modeled."""

    name: str
    target: str
    mtriple: str
    cpus: tuple[str, ...]
    loops: tuple[Loop, ...]
    # A branch: its mnemonic and target label; `unconditional` names those that never fall
    # through, `returns` those that end a path.
    branch: re.Pattern[str]
    unconditional: frozenset[str]
    returns: frozenset[str]
    stored: Callable[[str], int]
    notes: tuple[str, ...] = ()
    # Instructions given to llvm-mca as others of the same ports and width, where a model
    # times them in a way the hardware does not.
    modeled_as: tuple[tuple[str, str], ...] = ()


def neon_stored(line: str) -> int:
    """Bytes an aarch64 instruction writes from vector registers (stores of general
    registers, bookkeeping, left out)."""
    m = re.match(r"^\s*(st1|st2|st3|st4|str|stp|stnp|stur)\s+(.*)$", line)
    if not m:
        return 0
    total = 0
    regs = re.findall(r"\b([qdv])(\d+)(?:\.(\d+)([bhsd]))?", m.group(2).split("[")[0])
    for kind, _, lanes, lane in regs:
        if kind == "q":
            total += 16
        elif kind == "d":
            total += 8
        elif lanes:
            total += int(lanes) * {"b": 1, "h": 2, "s": 4, "d": 8}[lane]
    return total


# An x86 store from a vector register (AT&T order: source first), by its width in bytes where
# that is not the register's.
X86_STORE_WIDTH = {"vmovq": 8, "vmovd": 4, "vmovss": 4, "vmovsd": 8, "vpextrq": 8, "vpextrd": 4}
X86_FULL_STORES = {"vmovdqu", "vmovdqa", "vmovups", "vmovaps", "vmovntdq", "vmovntps"}


def x86_stored(line: str) -> int:
    """Bytes an x86 instruction writes to memory other than the stack from a vector
    register (spills are not output)."""
    parts = line.split(None, 1)
    if len(parts) < 2:
        return 0
    op, args = parts
    dest = args.rsplit(",", 1)[-1].strip()
    if "(" not in dest or re.search(r"%[re]?(sp|bp)\b", dest):
        return 0
    reg = re.match(r"\s*(?:\$\w+,\s*)?%([xy])mm\d+", args)
    if not reg:
        return 0
    if op in X86_STORE_WIDTH:
        return X86_STORE_WIDTH[op]
    if op in ("vextracti128", "vextractf128"):
        return 16
    if op in X86_FULL_STORES:
        return 32 if reg.group(1) == "y" else 16
    return 0


NEON = Isa(
    name="neon",
    target="aarch64-unknown-linux-gnu",
    mtriple="aarch64",
    cpus=("neoverse-n1", "neoverse-v1", "neoverse-v2", "apple-m1"),
    loops=(
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
    ),
    branch=re.compile(r"^\s*(b|b\.\w+|cbn?z|tbn?z)\s.*?(\.LBB\w+)\s*$"),
    unconditional=frozenset({"b", "br"}),
    returns=frozenset({"ret"}),
    stored=neon_stored,
)

AVX2 = Isa(
    name="avx2",
    target="x86_64-unknown-linux-gnu",
    mtriple="x86_64",
    # Zen 1 (EPYC Naples: 256-bit operations split in two), Zen 2 (Rome), Zen 3 (Milan),
    # Haswell, Skylake (and the client cores after it up to Comet Lake), Alder Lake's P-core;
    # Sapphire Rapids is the model nearest the Xeon that times the AVX2 path forced.
    cpus=("znver1", "znver2", "znver3", "haswell", "skylake", "alderlake", "sapphirerapids"),
    loops=(
        Loop(
            "fp8 -> bf16, by table (unscaled, per-tensor, per-row)",
            "4avx23fp818fp8_to_bf16_scaled",
            (frozenset({"vpshufb", "vmovntdq"}),),
        ),
        Loop(
            "fp8 -> bf16, 128x128 block scale (a row of tiles)",
            "4avx23fp818fp8_to_bf16_blocks",
            (frozenset({"vpshufb", "vmovntdq"}),),
        ),
        Loop(
            "fp8 -> f16, by table",
            "4avx24wide18fp8_to_wide_scaled",
            (frozenset({"vpshufb", "vcvtps2ph", "vmovntdq"}),),
        ),
        Loop(
            "fp8 -> f32, by table",
            "4avx24wide18fp8_to_wide_scaled",
            (frozenset({"vpshufb", "vmovntdq"}),),
            frozenset({"vcvtps2ph"}),
        ),
        Loop(
            "f32 -> bf16",
            "4avx24cast11f32_to_bf16",
            (frozenset({"vcmpunordps", "vpackusdw", "vmovntdq"}),),
        ),
        Loop("f32 -> f16", "4avx24cast10f32_to_f16", (frozenset({"vcvtps2ph", "vmovntdq"}),)),
        Loop(
            "bf16 amax (the quantizer's first pass, per 16 bytes of codes it leads to)",
            "4avx25quant12amax_bits_16",
            (frozenset({"vpmaxuw", "prefetcht1"}),),
            frozenset({"vpcmpeqw"}),
            stands_for=("vpmaxuw", 16),
        ),
        Loop(
            "bf16 -> e4m3 quantize, by table",
            "5quant5table9table_run",
            (frozenset({"vpshufb", "vpsubusb", "vmovntdq"}),),
            frozenset({"vmulps", "vfnmadd231ps"}),
        ),
        Loop(
            "bf16 -> e4m3 quantize, by reciprocal",
            "10reciprocal14reciprocal_run",
            (frozenset({"vmulps", "vmovntdq"}),),
            frozenset({"vcvtph2ps"}),
        ),
        Loop(
            "f16 -> e4m3 quantize, by table",
            "5quant7table169table_run",
            (frozenset({"vpshufb", "vpaddusb", "vmovntdq"}),),
            frozenset({"vmulps", "vcvtph2ps"}),
        ),
    ),
    branch=re.compile(r"^\s*(j\w+)\s+(\.LBB\w+)\s*$"),
    unconditional=frozenset({"jmp", "jmpq"}),
    returns=frozenset({"retq", "ret"}),
    stored=x86_stored,
    notes=(
        "the amax row counts the 32 bytes of bf16 it reads per 16 bytes of codes; a per-row"
        " quantize costs it plus one encode loop",
        "non-temporal stores (`vmovntdq`) are modeled as aligned ones (`vmovdqa`): the Alder"
        " Lake and Sapphire Rapids models give them a latency of 507 cycles, which fills the"
        " reorder buffer in the model; on the hardware they retire into the store buffer",
        "the Zen 3 model holds 64 floating-point operations in its scheduler and none in the"
        " non-scheduling queue in front of it, so loops of long dependent chains (the quantize"
        " loops) come out slower on Zen 3 than on Zen 2",
    ),
    modeled_as=(("vmovntdq", "vmovdqa"), ("vmovntps", "vmovaps")),
)

ISAS = {isa.name: isa for isa in (NEON, AVX2)}

LABEL = re.compile(r"^(\.LBB\w+):")


def functions(asm: str) -> dict[str, list[str]]:
    """The instruction lines and block labels of each function of `asm`, by mangled name."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in asm.splitlines():
        m = re.match(r"^(_ZN\S+):$", line)
        if m:
            current = out.setdefault(m.group(1), [])
        elif current is not None:
            s = line.strip()
            if s.startswith(".cfi_endproc"):
                current = None
            elif LABEL.match(line) or (s and not s.startswith((".", "#", "//")) and not s.endswith(":")):
                current.append(line)
    return out


@dataclass
class Block:
    label: str | None
    lines: list[str]
    successors: list[int]


def blocks(isa: Isa, body: list[str]) -> list[Block]:
    """The function's basic blocks, each with the blocks control may go to after it."""
    out: list[Block] = []
    for line in body:
        m = LABEL.match(line)
        if m:
            out.append(Block(m.group(1), [], []))
            continue
        if not out or (out[-1].lines and ends(isa, out[-1].lines[-1])):
            out.append(Block(None, [], []))
        out[-1].lines.append(line)
    index = {b.label: i for i, b in enumerate(out) if b.label}
    for i, b in enumerate(out):
        last = b.lines[-1] if b.lines else ""
        m = isa.branch.match(last)
        op = last.split()[0] if last.strip() else ""
        if m and m.group(2) in index:
            b.successors.append(index[m.group(2)])
        if op not in isa.unconditional and op not in isa.returns and i + 1 < len(out):
            b.successors.append(i + 1)
    return out


def ends(isa: Isa, line: str) -> bool:
    op = line.split()[0] if line.strip() else ""
    return bool(isa.branch.match(line)) or op in isa.returns or op in isa.unconditional


def cycles_through(bs: list[Block], head: int) -> list[list[str]]:
    """For each edge back to block `head`, the shortest way (in instructions) round from it."""
    out = []
    for tail, b in enumerate(bs):
        # Only edges that go back in the layout: every loop has one, and its target is a head
        # the caller tries, so every loop is found once from there.
        if head not in b.successors or tail < head:
            continue
        # Dijkstra from head to tail, each block costing its length.
        dist = {head: len(bs[head].lines)}
        prev: dict[int, int] = {}
        queue = [(dist[head], head)]
        while queue:
            d, i = heapq.heappop(queue)
            if i == tail or d > dist.get(i, d):
                continue
            for j in bs[i].successors:
                nd = d + len(bs[j].lines)
                if j != head and nd < dist.get(j, nd + 1):
                    dist[j], prev[j] = nd, i
                    heapq.heappush(queue, (nd, j))
        if tail not in dist:
            continue
        path = [tail]
        while path[-1] != head:
            path.append(prev[path[-1]])
        out.append([line for i in reversed(path) for line in bs[i].lines])
    return out


def mnemonics(lines: list[str]) -> set[str]:
    return {line.split()[0] for line in lines if line.strip()}


def find(isa: Isa, funcs: dict[str, list[str]], loop: Loop) -> list[str] | None:
    for signature in loop.signatures:
        found = []
        for name, body in funcs.items():
            if loop.function not in name:
                continue
            bs = blocks(isa, body)
            for head, b in enumerate(bs):
                for span in cycles_through(bs, head) if b.label else []:
                    ops = mnemonics(span)
                    if signature <= ops and not loop.excluded & ops:
                        found.append(span)
        if found:
            return min(found, key=len)
    return None


# llvm-mca's latency for an instruction a model has no figure for (Zen 1 and 2 give it to
# `vperm2i128` and `vcvtps2ph` on 256-bit registers, which take a few cycles on the hardware).
PLACEHOLDER_LATENCY = 100


def cycles(isa: Isa, mca: str, lines: list[str], cpu: str) -> tuple[float, set[str]]:
    """Cycles per iteration, and the instructions the model times with its placeholder."""
    text = "\n".join(lines) + "\n"
    for op, model_op in isa.modeled_as:
        text = re.sub(rf"\b{op}\b", model_op, text)
    with tempfile.NamedTemporaryFile("w", suffix=".s") as f:
        f.write(text)
        f.flush()
        out = subprocess.run(
            [mca, f"-mtriple={isa.mtriple}", f"-mcpu={cpu}", f"-iterations={ITERATIONS}", f.name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    m = re.search(r"Total Cycles:\s+(\d+)", out)
    if not m:
        sys.exit(f"llvm-mca printed no cycle count for {cpu}")
    # Instruction info rows: uops, latency, reciprocal throughput, flags, the instruction.
    placeholders = {
        row.group(2)
        for row in re.finditer(r"^\s*\d+\s+(\d+)\s+[\d.]+\s+[^a-z]*?([a-z]\w*)\s", out, re.M)
        if int(row.group(1)) >= PLACEHOLDER_LATENCY
    }
    return int(m.group(1)) / ITERATIONS, placeholders


def assembly(isa: Isa, tree: Path) -> str:
    """The core built for the ISA's target as one assembly file (release, one codegen unit)."""
    out = tree / "target" / f"{isa.name}-model"
    env = dict(os.environ, CARGO_TARGET_DIR=str(out))
    deps = out / isa.target / "release" / "deps"
    target = ["--target", isa.target]
    build = ["cargo", "rustc", "-q", "-p", "trash-panda", "--release", *target]
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
        clean = ["cargo", "clean", "-q", "-p", "trash-panda", "--release", *target]
        subprocess.run(clean, cwd=tree, env=env, check=True)
    sys.exit(f"cargo wrote no assembly under {deps}")


@dataclass
class Modeled:
    """A loop's length, its cycles per 16 bytes written on each core, and per core the
    instructions the model gave its placeholder latency."""

    length: int
    cycles: list[float]
    placeholders: list[set[str]]


def model(isa: Isa, mca: str, asm: str) -> dict[str, Modeled | None]:
    """Per loop, as modeled on each of the ISA's cores."""
    funcs = functions(asm)
    out: dict[str, Modeled | None] = {}
    for loop in isa.loops:
        lines = find(isa, funcs, loop)
        if lines and loop.stands_for:
            op, size = loop.stands_for
            stored = size * sum(line.split()[0] == op for line in lines)
        else:
            stored = sum(isa.stored(line) for line in lines) if lines else 0
        if not lines or not stored:
            out[loop.name] = None
            continue
        runs = [cycles(isa, mca, lines, c) for c in isa.cpus]
        out[loop.name] = Modeled(len(lines), [c * 16 / stored for c, _ in runs], [p for _, p in runs])
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
    parser.add_argument("isa", choices=sorted(ISAS), help="the kernels to model")
    parser.add_argument("--against", metavar="REV", help="a commit to model beside this tree")
    args = parser.parse_args()
    isa = ISAS[args.isa]
    mca = llvm_mca()
    now = model(isa, mca, assembly(isa, ROOT))
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
                before = model(isa, mca, assembly(isa, tree))
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT)
    write(isa, mca, args.against, now, before)


def write(
    isa: Isa,
    mca: str,
    against: str | None,
    now: dict[str, Modeled | None],
    before: dict[str, Modeled | None] | None,
) -> None:
    version = subprocess.run([mca, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"version ([\d.]+)", version)
    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    command = f"make bench-{isa.name}-model" + (f' ARGS="--against {against}"' if against else "")
    beside = f" (and {against} beside it)" if against else ""
    upper = isa.name.upper()
    lines = [
        f"# {upper} loops in llvm-mca's models (`{command}`): cycles per 16 bytes written",
        "",
        f"- date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- machine: llvm-mca {m.group(1) if m else '?'} models of "
        + ", ".join(isa.cpus)
        + f" (built on {host_cpu()})",
        f"- method: `{command}`: the core at {rev}{beside} built for {isa.target} as assembly, each"
        " kernel's inner loop picked out of its function (the shortest way round it that holds"
        f" the loop's marking instructions), {ITERATIONS} iterations with the data in L1;"
        " a model of the core's pipes, not a timing",
        *(f"- {note}" for note in isa.notes),
        "",
        f"| loop | instructions | {' | '.join(isa.cpus)} |",
        "|---|---:|" + "---:|" * len(isa.cpus),
    ]
    flagged: dict[str, set[str]] = {}
    for name, got in now.items():
        if got is None:
            lines.append(f"| {name} | not found |" + " |" * len(isa.cpus))
            continue
        was = before.get(name) if before else None
        cells = []
        for i, cpu in enumerate(isa.cpus):
            mark = ""
            for ops in (got.placeholders[i], was.placeholders[i] if was else set()):
                if ops:
                    mark = " †"
                    for op in ops:
                        flagged.setdefault(op, set()).add(cpu)
            c = got.cycles[i]
            if was:
                b = was.cycles[i]
                cells.append(f"{b:.2f} -> {c:.2f} ({b / c:.2f}x){mark}")
            else:
                cells.append(f"{c:.2f}{mark}")
        length = f"{was.length} -> {got.length}" if was else f"{got.length}"
        lines.append(f"| {name} | {length} | " + " | ".join(cells) + " |")
    if flagged:
        listed = "; ".join(f"`{op}` on {', '.join(sorted(cpus))}" for op, cpus in sorted(flagged.items()))
        lines += [
            "",
            f"† the model has no figure for an instruction of the loop and times it at"
            f" {PLACEHOLDER_LATENCY} cycles ({listed}): the figure is an upper bound",
        ]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    out = ROOT / "bench" / "results" / f"{isa.name}_model.md"
    out.write_text(text)
    print(f"wrote {out.relative_to(ROOT)}")


def host_cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "an unknown CPU"


if __name__ == "__main__":
    main()
