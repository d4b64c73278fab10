"""A watch on where the weights outside the blocks are read: ``outside.load_now`` (before the
first call: position None) and ``outside.load_outside`` (on the loader thread), put in as the
loader's reads (the ``loader_reads`` fixture), shared by the tests of the order file's outside
positions."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from trash_panda.offload import outside as outside_mod


class OutsideLoads:
    """What each call read, at which position, and whether the first block had started by then.
    A loader call waits for the first block to start (``first_block``): one made before the first
    call would time out instead."""

    def __init__(self, reads: Callable[..., object]) -> None:
        self.calls: list[tuple[int | None, list[str], bool]] = []
        self.first_block = threading.Event()
        later, now = outside_mod.load_outside, outside_mod.load_now

        def load(
            specs: list[Any],
            device: torch.device,
            threads: int,
            lane: Any = None,
            position: Any = None,
            copies: Any = None,
        ) -> None:
            started = self.first_block.wait(timeout=20)
            self.calls.append((position, sorted(s.name for s in specs), started))
            later(specs, device, threads, lane, position, copies)

        def load_now(specs: list[Any], device: torch.device, threads: int, lane: Any = None) -> None:
            self.calls.append((None, sorted(s.name for s in specs), self.first_block.is_set()))
            now(specs, device, threads, lane)

        reads(outside=load, now=load_now)
