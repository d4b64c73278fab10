"""Long calls of the core release the GIL: another Python thread keeps running meanwhile."""

from __future__ import annotations

import threading
import time

import torch

from trash_panda.dtype import expand


def test_conversion_releases_gil() -> None:
    w = torch.randint(0, 120, (8192, 4096), dtype=torch.uint8).view(torch.float8_e4m3fn)
    scale = torch.rand(8192, 1)
    out = torch.empty(8192, 4096, dtype=torch.float32)
    window: list[float] = []

    def work() -> None:
        window.append(time.perf_counter())
        for _ in range(4):
            expand(w, torch.float32, scale, out=out, threads=1)
        window.append(time.perf_counter())

    ticks: list[float] = []
    worker = threading.Thread(target=work)
    worker.start()
    while worker.is_alive():
        ticks.append(time.perf_counter())
    worker.join()
    start, end = window
    inside = [t for t in ticks if start < t < end]
    assert end - start > 0.05, "the call was too short to tell"
    # With the GIL held for the whole call the main thread could not tick inside the window
    # (or only every switch interval); released, it ticks continuously.
    gaps = [b - a for a, b in zip([start, *inside], [*inside, end])]
    assert len(inside) > 1000, f"main thread ticked {len(inside)} times during {end - start:.3f}s"
    assert max(gaps) < (end - start) / 4, f"longest stall {max(gaps):.3f}s of {end - start:.3f}s"
