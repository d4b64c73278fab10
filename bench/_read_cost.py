"""What a read behind compute costs the compute on this machine: bench/pipeline.py's plain way
times the transformer's warm steps alone and while the transformer's file is read cold the way
the runtime reads a stage ahead (direct reads into fresh pages of their own, through a read
lane), interleaved. On a machine with few cores the reader's CPU (the kernel's faults of the
fresh pages above all) comes out of the compute, a cost the floor max(compute, bytes / drive)
leaves out."""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _pipeline_models as pm
from _common import device_read_bytes

PIECE = 64 << 20  # the runtime's read groups (offload/materialize.py's GROUP_BYTES)


def _read(path: Path, out: dict[str, float]) -> None:
    import torch

    from trash_panda import _core, settings
    from trash_panda.offload.materialize import _fresh

    size = path.stat().st_size
    lane = _core.ReadLane([os.fspath(path)], 1, "run", direct=True)
    threads = max(1, int(settings.setting("ram_threads")))
    held = []  # kept until the end, as a stage's blocks are
    t = time.perf_counter()
    for start in range(0, size, PIECE):
        n = min(PIECE, size - start)
        dst = _fresh((n,), torch.uint8, n, start)
        _core.read_block([(os.fspath(path), start, dst)], threads=threads, lane=lane)
        held.append(dst)
    out["seconds"] = time.perf_counter() - t


def beside_reads(work: Callable[[], Any], path: Path, pairs: int = 3) -> dict[str, float]:
    """``work`` timed alone and beside a cold read of ``path``, ``pairs`` times each in turn;
    the medians, the read's bytes and time, and the compute lost per GB read."""
    alone, beside, read = [], [], []
    from_drive: list[int] = []
    for _ in range(pairs):
        t = time.perf_counter()
        work()
        alone.append(time.perf_counter() - t)
        # Direct reads go to the drive whatever the page cache holds (plain's process keeps its
        # files mapped, so they could not be dropped); the drive's own count checks it.
        out: dict[str, float] = {}
        drive0 = device_read_bytes(path)
        reader = threading.Thread(target=_read, args=(path, out), name="bench-read-beside")
        t = time.perf_counter()
        reader.start()
        work()
        beside.append(time.perf_counter() - t)
        reader.join()
        read.append(out["seconds"])
        from_drive.append(device_read_bytes(path) - drive0)
    gb = path.stat().st_size / 1e9
    a, b = statistics.median(alone), statistics.median(beside)
    return {
        "alone": a,
        "beside": b,
        "read_s": statistics.median(read),
        "bytes": path.stat().st_size,
        "drive_bytes": min(from_drive),
        "per_gb": max(0.0, b - a) / gb,
        "pairs": float(pairs),
    }


def transformer_cost(loaded: dict[str, Any], path: Path, steps: int) -> dict[str, float]:
    """bench/pipeline.py's measure: the plain models' transformer, its ``steps`` warm steps on the
    third prompt's conditioning, alone and beside a read of its file ``path``."""
    import torch

    with torch.no_grad():
        llm: Any = loaded["llm"]
        cond = pm.encode(loaded["text"], pm.rewrite(llm, pm.prompt(3, llm.config.vocab_size)))
    tr, latents = loaded["transformer"], pm.start_latents(3)

    def work() -> None:
        with torch.no_grad():
            x = latents
            for step in range(steps):
                x = pm.denoise(tr, x, cond, step, steps)

    return beside_reads(work, path)
