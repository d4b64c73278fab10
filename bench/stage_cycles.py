"""What a process holds after many stages (not a test): does memory, or anything else, creep?

    PYTHONPATH=python .venv/bin/python bench/stage_cycles.py [--cycles 20] [--blocks 16]

Generates (once) a bf16 checkpoint of pre-norm MLP blocks (d 2048, ffn 8192: 64 MB a block)
under target/bench-data/, then in one process runs ``--cycles`` stages of it, each with every
tier (4 blocks resident, the RAM tier, the rest on the disk tier), two passes, the second a final
pass, and the release. After each cycle it records the cycle's time, the process's private memory
(RssAnon), resident set, open files, threads and mappings. The reference, in the same process
and run: the same number of cycles of the plain model (built on the CPU, load_state_dict of
safetensors' load_file, two passes, deleted), whose drift is what torch and glibc alone give.
Writes bench/results/stage_cycles.md.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import DATA, RESULTS, Net, build_meta, loadavg, machine, md_table, write_checkpoint

D, F = 2048, 8192


def holdings() -> dict[str, int]:
    from trash_panda import _core

    gc.collect()
    _core.trim_heap()
    with open("/proc/self/maps", encoding="utf-8") as f:
        maps = sum(1 for _ in f)
    return {
        "private": _core.private_memory(),
        "rss": _core.current_rss(),
        "files": len(os.listdir("/proc/self/fd")),
        "threads": len(os.listdir("/proc/self/task")),
        "maps": maps,
    }


def ours(path: Path, blocks: int, x: torch.Tensor, ram: str) -> float:
    import trash_panda as tp

    t = time.perf_counter()
    with (
        tp.stage(
            lambda: build_meta(blocks, D, F, torch.bfloat16),
            path,
            device="cpu",
            resident_blocks=4,
            ram=ram,
            min_free_ram=0,
        ) as (model, plan, handle),
        torch.no_grad(),
    ):
        assert plan.blocks_in("ram") and plan.blocks_in("disk"), plan
        model(x)
        with handle.final_pass():
            model(x)
    return time.perf_counter() - t


def plain(path: Path, blocks: int, x: torch.Tensor) -> float:
    from safetensors.torch import load_file

    t = time.perf_counter()
    torch.set_default_dtype(torch.bfloat16)
    model = Net(blocks, D, F).eval()
    torch.set_default_dtype(torch.float32)
    model.load_state_dict(load_file(str(path)))
    with torch.no_grad():
        model(x)
        model(x)
    del model
    return time.perf_counter() - t


def drift(rows: list[dict[str, float]], key: str) -> float:
    steady = [r[key] for r in rows[2:]]
    return max(steady) - steady[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--blocks", type=int, default=16)
    args = ap.parse_args()
    path = DATA / f"cycles-{args.blocks}.safetensors"
    size = write_checkpoint(path, build_meta(args.blocks, D, F, torch.bfloat16), torch.bfloat16)
    block = 2 * D * F * 2
    # RAM for about half the streamed blocks beside the staging pool: every tier in use.
    ram = f"{(3 + (args.blocks - 4) // 2) * block + (64 << 20)}"
    x = torch.randn(4, 64, D, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    results: dict[str, list[dict[str, float]]] = {"trash-panda": [], "plain torch": []}
    for name in results:
        for _ in range(args.cycles):
            seconds = ours(path, args.blocks, x, ram) if name == "trash-panda" else plain(path, args.blocks, x)
            results[name].append({"seconds": seconds, **holdings()})
    mach = machine(path)
    lines = [
        "# Stage cycles (`bench/stage_cycles.py`)",
        "",
        f"- date: {mach['date']}",
        f"- machine: nproc {mach['nproc']} ({mach['cpu']}), {mach['ram']} RAM, kernel {mach['kernel']}, "
        f"{mach['fs']}, torch {mach['torch']}; load average at the end {loadavg()}",
        "",
        f"{args.cycles} cycles of a {size / 1e9:.2f} GB bf16 checkpoint ({args.blocks} blocks of "
        f"{block / 1e6:.0f} MB) in one process. Drift: the largest value from the third cycle on, less "
        "the third cycle's.",
        "",
    ]
    rows = []
    for name, got in results.items():
        secs = [r["seconds"] for r in got]
        rows.append(
            [
                name,
                f"{secs[0]:.2f}",
                f"{statistics.median(secs[2:]):.2f}",
                f"{got[2]['private'] / 1e6:.0f}",
                f"{drift(got, 'private') / 1e6:+.1f}",
                f"{drift(got, 'rss') / 1e6:+.1f}",
                f"{drift(got, 'files'):+.0f}",
                f"{drift(got, 'threads'):+.0f}",
                f"{drift(got, 'maps'):+.0f}",
            ]
        )
    lines.append(
        md_table(
            [
                "system",
                "first cycle s",
                "median cycle s",
                "private MB (3rd)",
                "private drift MB",
                "RSS drift MB",
                "files",
                "threads",
                "mappings",
            ],
            rows,
        )
    )
    ratio = drift(results["trash-panda"], "private") - drift(results["plain torch"], "private")
    lines += ["", f"private-memory drift beyond plain torch's: {ratio / 1e6:+.1f} MB", ""]
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "stage_cycles.md").write_text(text)


if __name__ == "__main__":
    main()
