"""Shared pieces of the Python benchmarks: a plain-torch model of Linear blocks, a safetensors
writer that generates the checkpoint tensor by tensor (never two copies of the model in memory),
and a description of the machine.

Not a test and not part of the package: run the scripts in bench/ with
``PYTHONPATH=python .venv/bin/python bench/<script>.py``.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import struct
import subprocess
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "target" / "bench-data"
RESULTS = ROOT / "bench" / "results"


class Block(nn.Module):
    """A pre-norm MLP block: x + down(gelu(up(norm(x))))."""

    def __init__(self, d: int, f: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, f, bias=False)
        self.down = nn.Linear(f, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, n_blocks: int, d: int, f: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(d, f) for _ in range(n_blocks))
        self.norm_out = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.norm_out(x)


def build_meta(n_blocks: int, d: int, f: int, dtype: torch.dtype) -> Net:
    with torch.device("meta"):
        return Net(n_blocks, d, f).to(dtype).eval()


_HEADER_DTYPE = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}


def write_checkpoint(path: Path, model: nn.Module, dtype: torch.dtype, seed: int = 0) -> int:
    """Writes ``model``'s state dict (shapes only; the model may be on meta) as a safetensors file,
    generating each tensor just before it is written, in chunks of at most 64 Mi elements.
    The data starts 4096-byte aligned. Returns the file size. Reuses an existing file of the same
    layout (the layout is checked from its header)."""
    shapes = [(name, tuple(p.shape)) for name, p in model.state_dict().items()]
    elt = torch.tensor([], dtype=dtype).element_size()
    header: dict[str, object] = {"__metadata__": {"format": "pt", "generator": "trash-panda bench"}}
    off = 0
    for name, shape in shapes:
        n = 1
        for s in shape:
            n *= s
        header[name] = {"dtype": _HEADER_DTYPE[dtype], "shape": list(shape), "data_offsets": [off, off + n * elt]}
        off += n * elt
    text = json.dumps(header, separators=(",", ":")).encode()
    pad = (-(8 + len(text))) % 4096
    text += b" " * pad
    total = 8 + len(text) + off
    if path.exists() and path.stat().st_size == total:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if f.read(n) == text:
                return total
    path.parent.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, shape in shapes:
            if name.endswith("norm.weight") or name.endswith("norm_out.weight"):
                t = torch.ones(shape, dtype=dtype)
                f.write(t.view(torch.uint8).numpy().data)
                continue
            if name.endswith(".bias"):
                t = torch.zeros(shape, dtype=dtype)
                f.write(t.view(torch.uint8).numpy().data)
                continue
            rows = shape[0]
            cols = 1
            for s in shape[1:]:
                cols *= s
            step = max(1, (64 << 20) // max(cols, 1))
            std = 1.0 / max(cols, 1) ** 0.5
            for r in range(0, rows, step):
                chunk = torch.randn((min(step, rows - r), cols), generator=gen, dtype=torch.float32).mul_(std)
                f.write(chunk.to(dtype).view(torch.uint8).numpy().data)
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(path)
    return total


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:
        return "?"


def machine(path: Path) -> dict[str, str]:
    """nproc, RAM, kernel, the file system and device of ``path``, the CPU model, and the load."""
    mem = "?"
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    fs = _run(["df", "--output=fstype,source", str(path)]).splitlines()[-1:]
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": _run(["nproc"]),
        "ram": mem,
        "kernel": platform.release(),
        "fs": " on ".join(fs[0].split()) if fs else "?",
        "cpu": cpu,
        "loadavg": open("/proc/loadavg").read().split()[0:3].__str__(),
        "torch": torch.__version__,
        "torch_threads": str(torch.get_num_threads()),
    }


def loadavg() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def dd_direct(path: Path, skip_bytes: int = 0, count_bytes: int | None = None, bs: int = 8 << 20) -> float:
    """GB/s of ``dd if=path of=/dev/null iflag=direct bs=8M`` over [skip, skip+count)."""
    import time

    cmd = ["dd", f"if={path}", "of=/dev/null", "iflag=direct,skip_bytes,count_bytes", f"bs={bs}", f"skip={skip_bytes}"]
    size = path.stat().st_size - skip_bytes if count_bytes is None else count_bytes
    cmd.append(f"count={size}")
    t = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return size / (time.perf_counter() - t) / 1e9


def dd_direct_parallel(path: Path, skip_bytes: int, count_bytes: int, jobs: int = 2, bs: int = 8 << 20) -> float:
    """GB/s of ``jobs`` direct-read dd processes at once, each over its share of the range: the
    drive with several requests in flight, as a reader with a deeper queue sees it."""
    import time

    share = (count_bytes // jobs) // bs * bs
    procs = []
    t = time.perf_counter()
    for j in range(jobs):
        count = share if j < jobs - 1 else count_bytes - share * (jobs - 1)
        cmd = [
            "dd",
            f"if={path}",
            "of=/dev/null",
            "iflag=direct,skip_bytes,count_bytes",
            f"bs={bs}",
            f"skip={skip_bytes + j * share}",
            f"count={count}",
        ]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    for proc in procs:
        if proc.wait() != 0:
            raise RuntimeError(f"dd failed on {path}")
    return count_bytes / (time.perf_counter() - t) / 1e9


def device_read_bytes(path: Path) -> int:
    """Bytes read so far from the block device holding ``path`` (/proc/diskstats, whole disk)."""
    import os

    dev = os.stat(path).st_dev
    major, minor = os.major(dev), os.minor(dev)
    with open("/proc/diskstats") as f:
        lines = [line.split() for line in f]
    part = next(f for f in lines if int(f[0]) == major and int(f[1]) == minor)
    # Partitions count their own reads too; the first field after the name is reads completed.
    return int(part[5]) * 512


def direct_read_speed(path: Path, start: int, length: int, threads: int = 4, piece: int = 256 << 20) -> float:
    """GB/s of plain O_DIRECT reads of [start, start+length) with ``threads`` requests in flight,
    into one reused buffer placed so that its address lines up with the file offset (no bounce)."""
    import time

    import torch

    from trash_panda import _core

    raw = torch.empty(piece + 8192, dtype=torch.uint8)
    raw.fill_(0)  # touch it once: first-touch memory would be measured otherwise
    shift = (start - raw.data_ptr()) % 4096
    t = time.perf_counter()
    done = 0
    while done < length:
        n = min(piece, length - done)
        _core.read_tensors(str(path), [(start + done, raw[shift : shift + n])], threads=threads, direct=True)
        done += n
    return length / (time.perf_counter() - t) / 1e9


def best_reader(path: Path) -> float:
    """The best of plain O_DIRECT reads with 4 and with 16 requests in flight and dd, each over
    the whole file (cut to whole pages, which O_DIRECT needs) from a cold cache: this disk
    serves more with more requests in flight, and the runtime keeps many (the engine's workers,
    the loaders, the cold RAM tier)."""
    size = path.stat().st_size // 4096 * 4096
    speeds = []
    for threads in (4, 16):
        cold(path)
        speeds.append(direct_read_speed(path, 0, size, threads=threads))
    cold(path)
    speeds.append(dd_direct(path, 0, size))
    return max(speeds)


def cold(path: Path) -> int:
    """Drops ``path`` from the page cache and checks it is gone (under 1% still cached)."""
    from trash_panda import _core

    _core.drop_cache(path)
    cached = _core.cached_bytes(path)
    if cached > path.stat().st_size // 100:
        raise SystemExit(f"{cached} bytes of {path} still cached after drop_cache")
    return cached


def md_table(header: list[str], rows: list[list[str]]) -> str:
    out = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|",
    ]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)
