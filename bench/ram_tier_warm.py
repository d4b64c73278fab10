"""A warm pass over a RAM tier with the CPU as the device, against the same model with every
block resident (plain PyTorch's pass: weights in memory, no hooks' work), in one process (not a
test).

    PYTHONPATH=python .venv/bin/python bench/ram_tier_warm.py [--dtype bf16] [--blocks 24] [--tokens 64]

Model: ``--blocks`` pre-norm MLP blocks (d 2048, ffn 8192), written once under
target/bench-data/. The RAM tier is the checkpoint's map (the default). The file is dropped from
the page cache before each way, so the RAM tier's pages are those its own first pass read in (as
after a user's load), not those the writer left; they are in the page cache after that pass.
Each way runs 7 passes of ``--tokens`` tokens; the figure is the median of the last 6. Rounds
alternate the ways. Writes bench/results/ram_tier_warm-<dtype>.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import DATA, RESULTS, build_meta, machine, md_table, write_checkpoint

import trash_panda as tp
from trash_panda import Plan, _core

D, F = 2048, 8192
PASSES = 7


def passes(model: torch.nn.Module, x: torch.Tensor) -> tuple[float, torch.Tensor]:
    times = []
    with torch.no_grad():
        for _ in range(PASSES):
            t = time.perf_counter()
            y = model(x)
            times.append(time.perf_counter() - t)
    return statistics.median(times[1:]), y


def way(name: str, path: Path, blocks: int, dtype: torch.dtype, x: torch.Tensor) -> tuple[float, torch.Tensor]:
    prefixes = [f"blocks.{i}." for i in range(blocks)]
    _core.drop_cache(path)
    model = build_meta(blocks, D, F, dtype)
    if name == "resident":
        tp.stream_load(model, path, plan=Plan.manual(resident=prefixes, streamed=[]), device="cpu")
    else:
        plan = Plan.manual(resident=[], streamed=prefixes, streamed_tier="ram")
        tp.stream_load(model, path, plan=plan, device="cpu")
        tp.install_offload(model)
    try:
        return passes(model, x)
    finally:
        tp.release(model)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    ap.add_argument("--blocks", type=int, default=24)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    path = DATA / f"ram_tier_warm_{args.dtype}_{args.blocks}.safetensors"
    size = write_checkpoint(path, build_meta(args.blocks, D, F, dtype), dtype)
    x = torch.randn(1, args.tokens, D, generator=torch.Generator().manual_seed(0)).to(dtype)
    got: dict[str, list[float]] = {"resident": [], "ram tier": []}
    outputs: dict[str, torch.Tensor] = {}
    for r in range(args.rounds):
        for name in ("resident", "ram tier") if r % 2 == 0 else ("ram tier", "resident"):
            seconds, outputs[name] = way(name, path, args.blocks, dtype, x)
            got[name].append(seconds)
            print(f"round {r + 1} {name}: {seconds:.3f} s a pass", flush=True)
    base = statistics.median(got["resident"])
    rows = [
        [name, " / ".join(f"{s:.3f}" for s in times), f"{statistics.median(times) / base:.2f}x"]
        for name, times in got.items()
    ]
    equal = torch.equal(outputs["resident"], outputs["ram tier"])
    m = machine(path)
    text = "\n".join(
        [
            f"# A warm pass over a RAM tier on the CPU ({args.dtype}, {m['date']})",
            "",
            f"Machine: {m['cpu']}, {m['nproc']} CPUs, {m['ram']}, kernel {m['kernel']}; torch {m['torch']}.",
            "",
            f"Model: {args.blocks} blocks, {size / 1e9:.2f} GB {args.dtype}; {args.tokens} tokens a pass; median "
            f"of the last {PASSES - 1} of {PASSES} passes, each round.",
            "",
            md_table(["blocks", "s a pass, each round", "median / resident"], rows),
            "",
            f"Outputs equal bit for bit: {'yes' if equal else 'NO'}.",
        ]
    )
    print(text)
    (RESULTS / f"ram_tier_warm-{args.dtype}.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
