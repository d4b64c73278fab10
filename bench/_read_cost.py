"""What a read behind compute costs the compute on this machine: bench/pipeline.py's plain way
times each stage's warm compute alone and while the transformer's file is read the way the
runtime reads a stage ahead (direct reads into fresh pages of their own, through a read lane),
in turn. On a machine with few cores a read slows the compute beside it (on the 2-vCPU virtual
machine of BENCHMARK.md by about what the read takes alone, and not through the faults of the
fresh pages: pages faulted beforehand cost the same): a cost the floor max(compute, bytes /
drive) leaves out, and one no way of running the pipeline avoids, since a byte not read beside
compute is read with nothing to hide it."""

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
LEAD = 0.05  # seconds the read runs before the compute starts, to be under way


def _read(path: Path, marks: list[tuple[float, int]], stop: threading.Event) -> None:
    """Reads ``path`` in pieces until its end or ``stop``, noting when each piece was in."""
    import torch

    from trash_panda import _core, settings
    from trash_panda.offload.materialize import _fresh

    size = path.stat().st_size
    lane = _core.ReadLane([os.fspath(path)], 1, _core.Priority.RUN, direct=True)
    threads = max(1, int(settings.setting("ram_threads")))
    held = []  # kept until the end, as a stage's blocks are
    for start in range(0, size, PIECE):
        if stop.is_set():
            break
        n = min(PIECE, size - start)
        dst = _fresh((n,), torch.uint8, n, start)
        _core.read_block([(os.fspath(path), start, dst)], threads=threads, lane=lane)
        held.append(dst)
        marks.append((time.perf_counter(), n))


def beside_reads(work: Callable[[], Any], path: Path, pairs: int = 3) -> dict[str, float]:
    """``work`` timed alone and beside a read of ``path``, ``pairs`` times each in turn; the
    medians of the two times and of the compute lost per GB read while it ran. Direct reads go
    to the drive whatever the page cache holds (plain's process keeps its files mapped, so they
    could not be dropped); the drive's own count is kept to show it."""
    alone, beside, during, from_drive = [], [], [], []
    per_gb: list[float] = []
    for _ in range(pairs):
        t = time.perf_counter()
        work()
        alone.append(time.perf_counter() - t)
        marks: list[tuple[float, int]] = []
        stop = threading.Event()
        drive0 = device_read_bytes(path)
        reader = threading.Thread(target=_read, args=(path, marks, stop), name="bench-read-beside")
        reader.start()
        time.sleep(LEAD)
        t0 = time.perf_counter()
        work()
        t1 = time.perf_counter()
        stop.set()
        reader.join()
        from_drive.append(device_read_bytes(path) - drive0)
        gb = sum(n for at, n in marks if t0 <= at <= t1) / 1e9
        beside.append(t1 - t0)
        during.append(gb)
        if gb:  # none: the read was over before the compute began (a small preset)
            per_gb.append(max(0.0, beside[-1] - alone[-1]) / gb)
    return {
        "alone": statistics.median(alone),
        "beside": statistics.median(beside),
        "gb_during": statistics.median(during),
        "per_gb": statistics.median(per_gb) if per_gb else float("nan"),
        "drive_read": float(min(from_drive)),
        "pairs": float(pairs),
    }


def stage_costs(loaded: dict[str, Any], path: Path, steps: int) -> dict[str, dict[str, float]]:
    """bench/pipeline.py's measure: each plain model's warm compute of a run (the text encoder's
    five times over, to last long enough to time), alone and beside a read of ``path``."""
    import torch

    llm, text, tr, vae = (loaded[n] for n in pm.STAGES)
    with torch.no_grad():
        ids = pm.rewrite(llm, pm.prompt(3, llm.config.vocab_size))
        cond = pm.encode(text, ids)
    latents = pm.start_latents(3)

    def denoise() -> None:
        x = latents
        for step in range(steps):
            x = pm.denoise(tr, x, cond, step, steps)

    works: dict[str, Callable[[], Any]] = {
        "llm": lambda: pm.rewrite(llm, pm.prompt(3, llm.config.vocab_size)),
        "text": lambda: [pm.encode(text, ids) for _ in range(5)],
        "transformer": denoise,
        "vae": lambda: pm.decode(vae, latents),
    }
    out = {}
    with torch.no_grad():
        for name, work in works.items():
            work()  # warm
            out[name] = beside_reads(work, path)
    return out
