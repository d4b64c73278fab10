"""A resident load into fresh memory against its two possible bounds, measured beside it: the
drive (``dd iflag=direct bs=8M`` right before and right after each load) and the rate at which
the machine's cores fault fresh memory in, all of them at once (not a test).

    PYTHONPATH=python .venv/bin/python bench/resident_load.py [--rounds 3] [--blocks 12]

Model: ``--blocks`` pre-norm MLP blocks (d 2048, ffn 16384, bf16: 134 MB a block, 1.6 GB for
12), written once under target/bench-data/. Each load is ``stream_load`` with every block
resident on the CPU from a cold file (``drop_cache``, then ``cached_bytes`` checked), with the
load rule's choice of reads (``auto``) and with ``TRASH_PANDA_DISK_MODE=direct``, in turn; each
load's ratio is its rate over min(mean of the dd runs before and after it, the fault rate).
The fault rate: fresh anonymous memory of the file's size, first touched by one thread per
core (torch's parallel fill). Writes bench/results/resident_load.md.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import DATA, RESULTS, build_meta, cold, dd_direct, loadavg, machine, md_table, write_checkpoint

D, F = 2048, 16384
MODES = ("auto", "direct")


def fault_rate(nbytes: int) -> float:
    """GB/s at which all cores together first touch ``nbytes`` of fresh memory."""
    t = time.perf_counter()
    fresh = torch.empty(nbytes, dtype=torch.uint8)
    fresh.fill_(1)
    secs = time.perf_counter() - t
    del fresh
    return nbytes / secs / 1e9


def load(path: Path, blocks: int) -> tuple[float, int, str]:
    """Seconds of one resident load, its bytes, and the load rule's reason."""
    import trash_panda as tp
    from trash_panda import Plan

    model = build_meta(blocks, D, F, torch.bfloat16)
    plan = Plan.manual(resident=[f"blocks.{i}." for i in range(blocks)], streamed=[])
    cold(path)
    t = time.perf_counter()
    report = tp.stream_load(model, path, plan=plan, device="cpu")
    secs = time.perf_counter() - t
    nbytes = report.device_tier.bytes + report.outside.bytes
    reads = report.reads
    tp.release(model)
    del model
    gc.collect()
    return secs, nbytes, reads


def child(path: Path, blocks: int) -> None:
    secs, nbytes, reads = load(path, blocks)
    print(f"{secs} {nbytes} {reads}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    path = DATA / f"resident_{args.blocks}.safetensors"
    if args.child:
        child(path, args.blocks)
        return
    with torch.device("meta"):
        shapes = build_meta(args.blocks, D, F, torch.bfloat16)
    write_checkpoint(path, shapes, torch.bfloat16)
    size = path.stat().st_size // 4096 * 4096

    def drive() -> float:
        cold(path)
        return dd_direct(path, 0, size)

    rows: dict[str, list[tuple[float, float, float, float]]] = {m: [] for m in MODES}
    reasons: dict[str, str] = {}
    faults: list[float] = []
    for r in range(args.rounds):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            before = drive()
            env = dict(os.environ)
            if mode == "direct":
                env["TRASH_PANDA_DISK_MODE"] = mode
            out = subprocess.run(
                [sys.executable, __file__, "--child", "1", "--blocks", str(args.blocks)],
                check=True,
                env=env,
                capture_output=True,
                text=True,
            ).stdout.split(maxsplit=2)
            secs, nbytes, reasons[mode] = float(out[0]), int(out[1]), out[2].strip()
            after = drive()
            fault = fault_rate(size)
            faults.append(fault)
            rate = nbytes / secs / 1e9
            bound = min((before + after) / 2, fault)
            rows[mode].append((rate, (before + after) / 2, fault, rate / bound))
            print(
                f"round {r + 1} {mode}: {rate:.2f} GB/s, drive {before:.2f}/{after:.2f}, faults {fault:.2f} GB/s, "
                f"ratio {rate / bound:.2f}",
                flush=True,
            )
    m = machine(path)
    table = []
    for mode in MODES:
        rs = rows[mode]
        table.append(
            [
                mode,
                " / ".join(f"{x[0]:.2f}" for x in rs),
                " / ".join(f"{x[1]:.2f}" for x in rs),
                " / ".join(f"{x[2]:.2f}" for x in rs),
                " / ".join(f"{x[3]:.2f}" for x in rs),
                f"{statistics.median(x[3] for x in rs):.2f}",
                "drive" if statistics.median(x[1] for x in rs) <= statistics.median(x[2] for x in rs) else "faults",
            ]
        )
    text = "\n".join(
        [
            f"# Resident loads against the drive and the fault rate ({m['date']})",
            "",
            f"Machine: {m['cpu']}, {m['nproc']} CPUs, {m['ram']}, kernel {m['kernel']}, {m['fs']}; "
            f"load after: {loadavg()}.",
            "",
            f"Checkpoint: {size / 1e9:.2f} GB bf16, {args.blocks} blocks; every block resident on the CPU, "
            "the file dropped from the page cache before each load.",
            "",
            md_table(
                [
                    "reads",
                    "load GB/s each round",
                    "drive GB/s (dd before+after)",
                    "fault GB/s",
                    "ratio to the lesser",
                    "median ratio",
                    "bound",
                ],
                table,
            ),
            "",
            "The load rule's reasons: " + "; ".join(f"{k}: {v}" for k, v in reasons.items()),
        ]
    )
    print(text)
    (RESULTS / "resident_load.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
