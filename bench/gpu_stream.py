"""GPU streaming benchmark: a pass with most blocks in the RAM tier against its floor, over a
sweep of worker threads and lookahead.

The floor is max(compute of one pass with every block resident, RAM-tier bytes / the pinned
host-to-device copy speed), both measured in the same run. For each setting it prints the
steady pass against the floor, the copy GB/s the pass achieved and its share of the pinned
bandwidth, the compute stream's wait for copies and the engine's counters, and appends a
markdown table to --out (default bench/results/gpu.md). Its files are removed at the end.

    PYTHONPATH=python python3 bench/gpu_stream.py --blocks 32 --resident 8
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

import trash_panda as tp

DIM = 4096


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(DIM, 2 * DIM, bias=False)
        self.down = nn.Linear(2 * DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Stack(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


def timed(fn, repeat: int = 3) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=32)
    ap.add_argument("--resident", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--lookahead", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--out", default="bench/results/gpu.md")
    args = ap.parse_args()
    dev = torch.device("cuda")
    workdir = Path(tempfile.mkdtemp(prefix="tp-gpu-"))
    path = workdir / "stack.safetensors"
    torch.manual_seed(0)
    ref = Stack(args.blocks).to(torch.bfloat16)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    block_bytes = 2 * DIM * 2 * DIM * 2
    x = torch.randn(args.tokens, DIM, dtype=torch.bfloat16, device=dev)

    # Reference 1: pinned host-to-device copy speed.
    host = torch.empty(block_bytes * 4, dtype=torch.uint8).pin_memory()
    devbuf = torch.empty_like(host, device=dev)
    h2d = host.numel() / timed(lambda: devbuf.copy_(host, non_blocking=True))
    host = devbuf = None  # freed before the passes

    # Reference 2: one pass with every block on the GPU.
    ref = ref.to(dev)
    with torch.no_grad():
        want = ref(x)
        compute = timed(lambda: ref(x))
    ref = ref.cpu()
    ref = None
    torch.cuda.empty_cache()

    streamed = [f"blocks.{i}." for i in range(args.resident, args.blocks)]
    ram_bytes = len(streamed) * block_bytes
    floor = max(compute, ram_bytes / h2d)
    rows = []
    try:
        for workers in args.workers:
            for lookahead in args.lookahead:
                os.environ["TRASH_PANDA_WORKERS"] = str(workers)
                os.environ["TRASH_PANDA_LOOKAHEAD"] = str(lookahead)
                with torch.device("meta"):
                    model = Stack(args.blocks)
                p = tp.Plan.manual(resident=[f"blocks.{i}." for i in range(args.resident)], streamed=streamed)
                tp.stream_load(model, path, plan=p, device=dev)
                handle = tp.install_offload(model)
                with torch.no_grad():
                    t0 = time.perf_counter()
                    got = model(x)
                    torch.cuda.synchronize()
                    first = time.perf_counter() - t0
                    assert torch.equal(got, want), "offloaded output differs from the resident model's"
                    steady = timed(lambda model=model: model(x))
                stats = handle.stats()
                last_pass = handle.runs[-args.blocks :]  # resident blocks' runs are recorded too
                waited = sum(t.gpu_wait for i, _s, _e, t in last_pass if i >= args.resident)
                tp.release(model, handle)
                achieved = ram_bytes / steady
                rows.append(
                    f"| {workers} | {lookahead} | {first * 1e3:.1f} | {steady * 1e3:.1f} | {steady / floor:.2f}x "
                    f"| {achieved / 1e9:.2f} | {achieved / h2d:.0%} | {waited * 1e3:.1f} "
                    f"| {stats.hits if stats else 0}/{stats.acquires if stats else 0} "
                    f"| {stats.buffer_waits if stats else 0} |"
                )
                print(rows[-1], flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    lines = [
        f"- {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {torch.cuda.get_device_name(dev)}, "
        f"torch {torch.__version__}, {platform.node()}",
        f"- model: {args.blocks} blocks of {block_bytes / 1e6:.0f} MB bf16, {args.resident} resident, "
        f"{len(streamed)} in the RAM tier ({ram_bytes / 1e9:.2f} GB); input {args.tokens} x {DIM}",
        f"- pinned host-to-device copy (reference, same run): {h2d / 1e9:.2f} GB/s; a pass with every block "
        f"resident: {compute * 1e3:.1f} ms; floor max(compute, RAM tier / copy speed): {floor * 1e3:.1f} ms",
        "- steady = best of 3 passes; copy GB/s = RAM-tier bytes / steady pass; waited = the compute stream's "
        "wait for copies (events) in the last pass; hits/acquires and buffer waits from the engine",
        "",
        "| workers | lookahead | first ms | steady ms | steady / floor | copy GB/s | of link | waited ms "
        "| hits/acquires | buffer waits |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
    ]
    text = "\n".join(lines)
    print(text)
    out = Path(os.environ.get("OUT", "")) / "gpu.md" if os.environ.get("OUT") else Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a", encoding="utf-8") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
