"""One model loaded with ``stage(overlap=True)`` under a RAM budget that holds its weights but
not also its file's pages: the plan's read rule (past the page cache) against reads through it
(``TRASH_PANDA_DISK_MODE=buffered``, what every load did before), each in its own process on a
cold file, alternating, with the drive's plain sequential read beside them (not a test).

    PYTHONPATH=python .venv/bin/python bench/stage_reads.py [--rounds 3] [--blocks 24]

The model: ``--blocks`` pre-norm MLP blocks (d 2048, ffn 8192, bf16: 67 MB a block), every block
resident, one forward pass of 64 tokens after the load (it waits for the blocks as they arrive).
Budget: ``ram`` = 1.5 x the file, ``min_free_ram=0``. Per run: wall seconds of load + first pass,
the process's system and user CPU seconds over them (getrusage), bytes the drive read
(/proc/diskstats), the file's bytes left in the page cache, the output checked against the
buffered run's. Reference: ``dd iflag=direct bs=8M`` of the file right before each run.
Writes bench/results/stage_reads.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import (
    DATA,
    RESULTS,
    build_meta,
    cold,
    dd_direct,
    device_read_bytes,
    loadavg,
    machine,
    md_table,
    write_checkpoint,
)

D, F = 2048, 8192
MODES = ("auto", "buffered")


def child(path: Path, blocks: int, mode: str, out: Path) -> None:
    if mode != "auto":
        os.environ["TRASH_PANDA_DISK_MODE"] = mode
    import trash_panda as tp
    from trash_panda import _core
    from trash_panda.offload.state import get_state

    size = path.stat().st_size
    x = torch.randn(1, 64, D, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    read0 = device_read_bytes(path)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t = time.perf_counter()
    build = lambda: build_meta(blocks, D, F, torch.bfloat16)  # noqa: E731
    with tp.stage(build, path, device="cpu", ram=size + size // 2, min_free_ram=0, overlap=True) as (m, p, _):
        with torch.no_grad():
            y = m(x)
        wall = time.perf_counter() - t
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        state = get_state(m)
        direct = bool(state is not None and state.lane is not None and state.lane.direct)
        tiers = sorted({b.tier.value for b in p.blocks})
        reason = p.load_reads(size).reason
    torch.save(y, out.with_suffix(".pt"))
    out.write_text(
        json.dumps(
            {
                "wall": wall,
                "sys": r1.ru_stime - r0.ru_stime,
                "user": r1.ru_utime - r0.ru_utime,
                "read": device_read_bytes(path) - read0,
                "cached": _core.cached_bytes(path),
                "direct": direct,
                "tiers": tiers,
                "reason": reason,
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=24)
    ap.add_argument("--child", choices=MODES)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    path = DATA / f"stage-reads-{args.blocks}.safetensors"
    if args.child:
        child(path, args.blocks, args.child, args.out)
        return
    size = write_checkpoint(path, build_meta(args.blocks, D, F, torch.bfloat16), torch.bfloat16)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    drive: list[float] = []
    outputs: dict[str, torch.Tensor] = {}
    for r in range(args.rounds):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            cold(path)
            drive.append(dd_direct(path))
            cold(path)
            out = DATA / f"stage-reads-{mode}.json"
            subprocess.run(
                [sys.executable, __file__, "--child", mode, "--out", str(out), "--blocks", str(args.blocks)], check=True
            )
            res = json.loads(out.read_text())
            runs[mode].append(res)
            y = torch.load(out.with_suffix(".pt"))
            assert mode not in outputs or torch.equal(outputs[mode], y)
            outputs[mode] = y
            print(
                f"round {r + 1} {mode}: {res['wall']:.2f} s, sys {res['sys']:.2f} s, "
                f"direct={res['direct']}, dd {drive[-1]:.2f} GB/s",
                flush=True,
            )
    assert torch.equal(outputs["auto"], outputs["buffered"]), "outputs differ between the read modes"
    dd = statistics.median(drive)
    rows = []
    for mode in MODES:
        rs = runs[mode]
        med = {k: statistics.median(x[k] for x in rs) for k in ("wall", "sys", "user", "read", "cached")}
        rows.append(
            [
                "rule (auto)" if mode == "auto" else "buffered (the setting)",
                "direct" if rs[0]["direct"] else "buffered",
                f"{med['wall']:.2f}",
                f"{med['sys']:.2f}",
                f"{med['sys'] / (size / 1e9):.2f}",
                f"{med['user']:.2f}",
                f"{med['read'] / 1e9:.2f}",
                f"{med['cached'] / 1e9:.2f}",
                f"{size / 1e9 / med['wall'] / dd:.2f}",
            ]
        )
    a, b = runs["auto"], runs["buffered"]
    pairs = ", ".join(f"{x['sys'] / y['sys']:.2f}" for x, y in zip(a, b, strict=True))
    walls = ", ".join(f"{x['wall'] / y['wall']:.2f}" for x, y in zip(a, b, strict=True))
    m = machine(path)
    text = [
        "# One model, stage(overlap=True), read past the page cache or through it (`bench/stage_reads.py`)",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- machine: {m['cpu']}, {m['nproc']} CPUs, {m['ram']}, {m['fs']}; load average at the end {loadavg()}",
        f"- model: {args.blocks} pre-norm MLP blocks (d {D}, ffn {F}, bf16), {size / 1e9:.2f} GB file, every block "
        f"resident ({', '.join(a[0]['tiers'])}); `ram` = 1.5 x the file, `min_free_ram=0`; load + one forward pass",
        f"- each run in its own process on a cold file, the two ways alternating, {args.rounds} rounds; "
        f"medians; drive: dd iflag=direct bs=8M right before each run, median {dd:.2f} GB/s",
        f"- the rule's words: {a[0]['reason']}",
        "",
        md_table(
            [
                "reads",
                "mode",
                "wall s",
                "system CPU s",
                "system s / GB",
                "user s",
                "drive read GB",
                "left in page cache GB",
                "x dd",
            ],
            rows,
        ),
        "",
        f"- system time, rule / buffered, per round: {pairs}; wall: {walls}",
        "- outputs of the two ways equal bit for bit",
        "",
    ]
    (RESULTS / "stage_reads.md").write_text("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    main()
