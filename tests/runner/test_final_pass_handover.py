"""The final pass's feeder hands a freed block's memory to the next stage only once the device
work queued on it is done (its event), and the compute thread never waits for the feeder.

A device whose kernels run behind the host, as CUDA's do: each freed block carries an event that
completes when the test lets that block's queued kernels finish. Until then the next stage's
reads must not be given the block's bytes (they would overwrite weights a queued kernel has still
to read); the pass itself (the compute thread) goes on meanwhile."""

from __future__ import annotations

import queue
import threading
import time

from trash_panda import _core
from trash_panda.offload.final_pass import FreedBlock
from trash_panda.pipeline.loaded import LoadedStage


class QueuedKernels:
    """The event recorded after a block's kernels: ``synchronize`` returns once they ran."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.waited = threading.Event()  # someone is waiting for it

    def synchronize(self) -> None:
        self.waited.set()
        assert self.done.wait(60), "the block's kernels never finished"


class Pass:
    """What the feeder reads of a final pass: its queue of freed blocks, open or closed."""

    def __init__(self) -> None:
        self.events: queue.SimpleQueue[FreedBlock] = queue.SimpleQueue()
        self.active = True


def stage() -> LoadedStage:
    none: object = None
    return LoadedStage("dit", none, none, none, none, _core.Holds(0, 300), _core.Free(0, 0), None)  # type: ignore[arg-type]


def test_each_block_is_handed_over_only_after_its_kernels_ran() -> None:
    running, fp = stage(), Pass()
    nxt = _core.Allowance("vae", 0)
    running.feed(fp, nxt)  # type: ignore[arg-type]
    kernels = [QueuedKernels() for _ in range(3)]
    started = time.monotonic()
    for i, k in enumerate(kernels):  # the compute thread frees three blocks and goes on
        fp.events.put_nowait(FreedBlock(f"blocks.{i}.", 100, _core.Tier.DEVICE, k))  # type: ignore[arg-type]
    assert time.monotonic() - started < 1.0  # guards against a hang only: putting never waits

    assert kernels[0].waited.wait(60)
    assert nxt.stats().given == 0  # block 0's kernels are queued: nothing handed over
    kernels[0].done.set()
    deadline = time.monotonic() + 60
    while nxt.stats().given < 100:
        assert time.monotonic() < deadline, "block 0 was never handed over"
        time.sleep(0.002)
    assert kernels[1].waited.wait(60)
    assert nxt.stats().given == 100  # block 1 still queued: only block 0's bytes
    # The blocks' events complete in stream order; each is handed over after its own.
    kernels[2].done.set()
    kernels[1].done.set()
    fp.active = False
    running.stop_feeding()
    assert nxt.stats().given == 300 == running.freed


def test_blocks_without_memory_of_their_own_are_not_handed_over() -> None:
    """A mapped RAM-tier block's pages are page cache, which free memory counts already; a
    disk-tier block holds nothing between runs."""
    running, fp = stage(), Pass()
    nxt = _core.Allowance("vae", 0)
    running.feed(fp, nxt)  # type: ignore[arg-type]
    fp.events.put_nowait(FreedBlock("blocks.0.", 100, _core.Tier.RAM, None))
    fp.events.put_nowait(FreedBlock("blocks.1.", 0, _core.Tier.DISK, None))
    fp.events.put_nowait(FreedBlock("blocks.2.", 50, _core.Tier.DEVICE, None))
    fp.active = False
    running.stop_feeding()
    assert nxt.stats().given == 50 == running.freed
