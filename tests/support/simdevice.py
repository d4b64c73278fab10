"""A simulated asynchronous device for the CPU test suite.

Its "copies" run on another thread, in order (as on a CUDA stream), each after its event and
a random delay, so they complete late. It poisons memory at the moments the rules of
:mod:`trash_panda.offload.backends.copies` say it may be reused: a slot the moment a copy into it is
queued, a staging buffer the moment it goes back to the engine. A pipeline that broke a rule
would compute on poison, and the outputs would differ from the reference.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from typing import Any

import torch

from trash_panda.offload.gpu_swap import HostCopy

POISON = 0xFF  # all-ones bytes: NaN in every float dtype


class SimulatedDevice:
    def __init__(self, seed: int = 0, max_delay: float = 0.004) -> None:
        self.rng = random.Random(seed)
        self.max_delay = max_delay
        self.copies: queue.Queue[tuple[torch.Tensor, torch.Tensor, Any, threading.Event, float] | None] = queue.Queue()
        self.copied = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.copies.get()
            if item is None:
                return
            dst, src, after, done, delay = item
            if after is not None:
                after.wait()
            time.sleep(delay)
            dst.copy_(src)
            self.copied += 1
            # A view of a staging buffer held here, past its lease's release, would keep the
            # buffer from the engine until the next copy came (never, with a single buffer).
            del item, dst, src
            done.set()

    def empty(self, nbytes: int) -> torch.Tensor:
        return torch.full((nbytes,), POISON, dtype=torch.uint8)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, after: Any) -> threading.Event:
        dst.fill_(POISON)  # the slot is being refilled: whatever read it must be done
        done = threading.Event()
        self.copies.put((dst, src, after, done, self.rng.uniform(0, self.max_delay)))
        return done

    def compute_waits(self, event: threading.Event) -> None:
        event.wait()  # the CPU computes on this thread: waiting here is the stream's wait

    def compute_done(self) -> threading.Event:
        done = threading.Event()
        done.set()  # the CPU computed the block before its hook returned
        return done

    def ready(self, event: threading.Event) -> bool:
        return event.is_set()

    def wait(self, event: threading.Event) -> None:
        event.wait()

    def released(self, host: torch.Tensor, lease: Any) -> None:
        host.fill_(POISON)  # the staging buffer goes back: a copy still reading it reads poison
        lease.discard()  # so the engine stages the block again rather than reuse the poison

    def empty_on_copy_stream(self, nbytes: int) -> torch.Tensor:
        return self.empty(nbytes)

    def free_memory(self) -> int:
        return 1 << 62

    def current_stream(self) -> None:
        return None  # one stream: the CPU computes on the calling thread

    def record_stream(self, t: torch.Tensor, stream: Any) -> None:
        pass  # nothing is reused behind the copy thread's back: memory is torch's CPU memory

    def side(self) -> SimulatedDevice:
        return self  # its copies go to the same thread, in order

    def pin(self, owner: object, ranges: list[tuple[int, int]], fallback: str) -> Any:
        return _Registration()

    def pinned(self, t: torch.Tensor) -> bool:
        return True

    def synchronize(self) -> None:
        done = threading.Event()
        self.copies.put((torch.empty(0), torch.empty(0), None, done, 0.0))
        done.wait()

    def stop(self) -> None:
        self.copies.put(None)
        self.thread.join()


class _Registration:
    def close(self) -> None:
        pass


class SimMemory:
    """The simulated device's memory as the device side (every CPU tensor not in a host buffer
    made here) and plain host buffers; counts what it allocates and can run out of memory."""

    def __init__(self, sim: SimulatedDevice, fail_after: int | None = None) -> None:
        self.device = sim
        self.hosts: list[tuple[int, int]] = []
        self.allocated = 0
        self.allocations = 0
        self.fail_after = fail_after
        self.gave_back = 0

    def holds(self, t: torch.Tensor) -> bool:
        if t.device.type != "cpu":
            return False
        at = t.untyped_storage().data_ptr()
        return not any(lo <= at < hi for lo, hi in self.hosts)

    def device_buffer(self, nbytes: int) -> torch.Tensor:
        if self.fail_after is not None and self.allocations >= self.fail_after:
            raise torch.OutOfMemoryError("simulated: out of device memory")
        self.allocations += 1
        self.allocated += nbytes
        return self.device.empty(nbytes)

    def host_buffer(self, nbytes: int) -> HostCopy:
        data = torch.full((nbytes,), POISON, dtype=torch.uint8)
        self.hosts.append((data.data_ptr(), data.data_ptr() + max(nbytes, 1)))
        return HostCopy(data, pinned=True)

    def empty_cache(self) -> None:
        self.gave_back += 1
