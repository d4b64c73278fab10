"""Long calls of the core release the GIL: another Python thread runs while one is in progress."""

from __future__ import annotations

import threading
import time

import torch

from trash_panda.dtype import expand

SENTINEL = -12345.0  # never produced: the weights and scales are positive


def test_conversion_releases_gil() -> None:
    """A handshake through the output itself: this thread sees the call's first element written
    and its last one not yet written, which is possible only if the thread in the call let go of
    the GIL (one thread writes the output in order, first element first)."""
    w = torch.randint(1, 120, (8192, 4096), dtype=torch.uint8).view(torch.float8_e4m3fn)
    scale = torch.rand(8192, 1) + 0.5
    out = torch.full((8192, 4096), SENTINEL, dtype=torch.float32)
    flat = out.view(-1)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            expand(w, torch.float32, scale, out=out, threads=1)
        except BaseException as e:
            errors.append(e)

    worker = threading.Thread(target=work)
    worker.start()
    deadline = time.monotonic() + 30
    seen_inside = False
    while worker.is_alive() and time.monotonic() < deadline:
        if flat[0].item() != SENTINEL:
            seen_inside = flat[-1].item() == SENTINEL
            break
    worker.join()
    assert not errors, errors
    assert flat[-1].item() != SENTINEL, "the call did not finish"
    assert seen_inside, "this thread only ran after the call ended: the GIL was held during it"
