"""GPU streaming benchmark: a pass with most blocks in the RAM tier against its floor.

The floor is max(compute of one pass with every block resident, RAM-tier bytes / the pinned
host-to-device copy speed), both measured in the same run. Prints the ratio and appends a
markdown table to the file given by --out (default bench/results/gpu.md).

    PYTHONPATH=python python3 bench/gpu_stream.py --blocks 32 --resident 8
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
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

    with torch.device("meta"):
        model = Stack(args.blocks)
    streamed = [f"blocks.{i}." for i in range(args.resident, args.blocks)]
    p = tp.Plan.manual(resident=[f"blocks.{i}." for i in range(args.resident)], streamed=streamed)
    report = tp.stream_load(model, path, plan=p, device=dev)
    print(report)
    handle = tp.install_offload(model)
    with torch.no_grad():
        t0 = time.perf_counter()
        got = model(x)
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        assert torch.equal(got, want), "offloaded output differs from the resident model's"
        steady = timed(lambda: model(x))
    ram_bytes = len(streamed) * block_bytes
    floor = max(compute, ram_bytes / h2d)
    tp.release(model, handle)
    lines = [
        f"- {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {torch.cuda.get_device_name(dev)}, "
        f"torch {torch.__version__}, {platform.node()}",
        f"- model: {args.blocks} blocks of {block_bytes / 1e6:.0f} MB bf16, {args.resident} resident, "
        f"{len(streamed)} in the RAM tier ({ram_bytes / 1e9:.2f} GB); input {args.tokens} x {DIM}",
        "",
        "| measure | value |",
        "|---|---:|",
        f"| pinned host-to-device copy | {h2d / 1e9:.2f} GB/s |",
        f"| pass, every block resident (compute) | {compute * 1e3:.1f} ms |",
        f"| floor max(compute, RAM tier / copy speed) | {floor * 1e3:.1f} ms |",
        f"| offloaded pass, first (cold pages) | {first * 1e3:.1f} ms |",
        f"| offloaded pass, steady (best of 3) | {steady * 1e3:.1f} ms |",
        f"| steady / floor | {steady / floor:.2f}x |",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    out = Path(os.environ.get("OUT", "")) / "gpu.md" if os.environ.get("OUT") else Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a", encoding="utf-8") as f:
        f.write(text + "\n")
    path.unlink()


if __name__ == "__main__":
    main()
