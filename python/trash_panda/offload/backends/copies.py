"""The bookkeeping of an asynchronous device: device slots, copies in flight, and when a staging
buffer or a slot may be used again.

A block's staged bytes go to a device slot in one copy on the copy stream. The copies of the
next ``lookahead`` blocks are queued as soon as the engine has staged them, so the copy engine
stays busy while the current block computes. Two rules make this safe, and the simulated devices
of the test suite catch the moment either is broken:

- a staging buffer goes back to the engine only once the copy reading it has completed
  (polled, never waited for on the compute thread);
- a slot is refilled only by a copy queued after the compute that read it (the copy stream
  waits for an event recorded when that block's kernels were queued), and never while its
  block is running or its copy waits to be used.

Two more keep copies and compute overlapping when the host runs ahead of the device, as it does
on CUDA (proven in virtual time by tests/device/test_copy_schedule.py):

- a copy goes to the free slot freed longest ago, whose compute ends first, not to the one the
  previous block has just left (its copy would wait for that block's compute to end);
- at most ``buffers - 1`` copies in flight hold staging buffers, so the engine always has one to
  stage the next block in while the link copies.

Three more follow CUDA's caching allocator and its streams:

- the slots come from the allocator on the stream current when they are made (on a pipeline's
  read-ahead thread, the default stream the running stage computes on), so their memory may be
  what that stream's queued kernels still read: the first copy into each slot waits for an event
  recorded there when they were made, as every later one waits for the compute that read it;
- a staging buffer goes back when its lease and every view of it are gone: the view a copy read
  from is dropped as the lease is returned, not kept until the block runs;
- from pageable memory (pinning declined), a copy holds the host until it is done: the copies
  ahead are then queued after the current block's kernels, so the device computes meanwhile.

The CUDA backend drives a :class:`CudaDevice`; tests drive simulated ones through the same
:class:`SlotCopies`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ... import _core
from ...errors import StreamError

if TYPE_CHECKING:
    import torch


class Device(Protocol):
    """What the device code needs of a device. "The current stream" is the calling thread's
    (``torch.cuda.current_stream()``: a caller's own under ``torch.cuda.stream(s)``); compute,
    waits and allocations go there, copies to the copy stream of the device object."""

    def empty(self, nbytes: int) -> torch.Tensor:
        """``nbytes`` of device memory (uint8), from the allocator on the current stream."""

    def empty_on_copy_stream(self, nbytes: int) -> torch.Tensor:
        """``nbytes`` of device memory from the allocator on the copy stream: memory no other
        stream's queued work still reads, for a copy on that stream to fill."""

    def free_memory(self) -> int:
        """Device memory free outside every cache (``cudaMemGetInfo``), without waiting."""

    def copy(self, dst: torch.Tensor, src: torch.Tensor, after: Any) -> Any:
        """Queues ``dst.copy_(src)`` on the copy stream once event ``after`` (or None) has
        happened; returns an event that happens when the copy is complete. ``dst``'s memory is
        not reused before the copy has run, wherever it is freed."""

    def compute_waits(self, event: Any) -> Any:
        """Makes the current stream wait for ``event``; returns a timing mark (or None)."""

    def compute_done(self) -> Any:
        """An event that happens once the work queued so far on the current stream has run."""

    def current_stream(self) -> Any:
        """The calling thread's current stream."""

    def record_stream(self, t: torch.Tensor, stream: Any) -> None:
        """``t``'s memory, once freed, is not reused before the work queued on ``stream`` by
        then has run (``Tensor.record_stream``)."""

    def side(self) -> Device:
        """A device object on the same device whose copies go on a copy stream of their own."""

    def pin(self, owner: object, ranges: list[tuple[int, int]], fallback: str) -> Any:
        """Registers host ranges (address, length) of ``owner``'s as pinned; a registration
        with ``close()``, or None and a warning naming ``fallback`` when that fails."""

    def pinned(self, t: torch.Tensor) -> bool:
        """Whether host tensor ``t`` is in pinned memory (a copy from it does not hold the host)."""

    def ready(self, event: Any) -> bool:
        """Whether ``event`` has happened (never blocks)."""

    def wait(self, event: Any) -> None:
        """Blocks the calling thread until ``event`` has happened."""

    def released(self, host: torch.Tensor, lease: Any) -> None:
        """A staging buffer goes back to the engine (the simulated device poisons it)."""

    def synchronize(self) -> None:
        """Waits until every queued copy and compute has run."""


class CudaDevice:
    """A CUDA GPU: one side stream for copies; events between it and the compute stream."""

    def __init__(self, device: torch.device, stream: Any = None) -> None:
        import torch

        self.device = device
        self.stream = stream if stream is not None else torch.cuda.Stream(device)

    def empty(self, nbytes: int) -> torch.Tensor:
        import torch

        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def empty_on_copy_stream(self, nbytes: int) -> torch.Tensor:
        import torch

        with torch.cuda.stream(self.stream):
            return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def free_memory(self) -> int:
        import torch

        return int(torch.cuda.mem_get_info(self.device)[0])

    def copy(self, dst: torch.Tensor, src: torch.Tensor, after: Any) -> CudaCopy:
        import torch

        with torch.cuda.stream(self.stream):
            if after is not None:
                self.stream.wait_event(after.done if isinstance(after, CudaCopy) else after)
            start = torch.cuda.Event(enable_timing=True)
            start.record(self.stream)
            dst.copy_(src, non_blocking=True)
            done = torch.cuda.Event(enable_timing=True)
            done.record(self.stream)
        if dst.is_cuda:
            # Freed before the copy ran (a stage released before its turn), the allocator would
            # otherwise hand the memory to the next allocation on its own stream at once.
            dst.record_stream(self.stream)
        return CudaCopy(start, done)

    def compute_waits(self, event: Any) -> Any:
        import torch

        stream = torch.cuda.current_stream(self.device)
        # Marks the moment the compute stream reaches the wait: the time from it to the copy's
        # end is how long the compute stream waited for the copy.
        mark = torch.cuda.Event(enable_timing=True)
        mark.record(stream)
        stream.wait_event(event.done if isinstance(event, CudaCopy) else event)
        return mark

    def compute_done(self) -> Any:
        import torch

        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(self.device))
        return done

    def current_stream(self) -> Any:
        import torch

        return torch.cuda.current_stream(self.device)

    def record_stream(self, t: torch.Tensor, stream: Any) -> None:
        t.record_stream(stream)

    def side(self) -> CudaDevice:
        # One loader stream per GPU, whoever loads: memory a loader allocated there and a stage
        # freed goes back to that stream's pool, where the next loader finds it.
        return CudaDevice(self.device, _loader_stream(self.device))

    def pin(self, owner: object, ranges: list[tuple[int, int]], fallback: str) -> Any:
        import torch

        from .pinning import register_ranges

        return register_ranges(torch.cuda.cudart(), owner, ranges, fallback)

    def pinned(self, t: torch.Tensor) -> bool:
        return bool(t.is_pinned())

    def ready(self, event: Any) -> bool:
        return bool((event.done if isinstance(event, CudaCopy) else event).query())

    def wait(self, event: Any) -> None:
        (event.done if isinstance(event, CudaCopy) else event).synchronize()

    def released(self, host: torch.Tensor, lease: Any) -> None:
        pass

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize(self.device)

    @staticmethod
    def waited(mark: Any, copied: CudaCopy) -> float:
        """Seconds the compute stream waited at ``mark`` for ``copied`` to end."""
        return max(0.0, float(mark.elapsed_time(copied.done)) / 1000.0)

    @staticmethod
    def copy_seconds(copied: CudaCopy) -> float:
        """The copy engine's seconds for ``copied``."""
        return max(0.0, float(copied.start.elapsed_time(copied.done)) / 1000.0)

    def link_bandwidth(self, nbytes: int = 64 << 20) -> float:
        """The pinned host-to-device bandwidth, bytes per second: the best of three copies of
        ``nbytes`` on the copy stream, timed by the device."""
        import torch

        host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
        dev = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        best = float("inf")
        for _ in range(3):
            copied = self.copy(dev, host, None)
            copied.done.synchronize()
            best = min(best, self.copy_seconds(copied))
        return nbytes / best if best > 0 else 0.0


_LOADER_STREAMS: dict[str, Any] = {}


def _loader_stream(device: torch.device) -> Any:
    import torch

    key = str(torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device()))
    stream = _LOADER_STREAMS.get(key)
    if stream is None:
        stream = _LOADER_STREAMS[key] = torch.cuda.Stream(torch.device(key))
    return stream


@dataclass
class CudaCopy:
    """A copy on the copy stream: events at its start and its end."""

    start: Any
    done: Any


@dataclass
class _Copy:
    block: int  # engine block
    lease: Any
    host: torch.Tensor | None  # the staged bytes; let go with the lease, once the copy landed
    nbytes: int  # their length, kept once ``host`` is let go
    slot: int
    event: Any


@dataclass
class Taken:
    """A block's bytes on the device, ready for its compute."""

    slot: torch.Tensor
    staged_wait: float  # seconds the compute thread waited for the engine to stage it
    copy_event: Any
    mark: Any  # the compute stream's timing mark at its wait for the copy
    nbytes: int


class SlotCopies:
    """Device slots and the copies into them, for the streamed blocks of one model."""

    def __init__(
        self,
        device: Device,
        engine: _core.Engine,
        slots: int,
        slot_bytes: int,
        buffers: int,
        lookahead: int,
        direct: bool = False,
    ) -> None:
        self.device = device
        self.engine = engine
        self.buffers = buffers  # the engine's staging buffers
        # With `direct`, blocks of the in-memory RAM tier are copied from it, not staged.
        self.direct = direct
        self.images: dict[int, torch.Tensor] = {}
        if direct:
            from torch.utils.dlpack import from_dlpack

            for b in engine.order():
                image = engine.ram_image(b)
                if image is not None:
                    self.images[b] = from_dlpack(image)
        self.slots = [device.empty(slot_bytes) for _ in range(slots)]
        self.lookahead = lookahead
        self.order = engine.order()
        self.pos = {b: i for i, b in enumerate(self.order)}
        # Per slot: the work that last read it; at first, what was queued where it was made.
        made = self._allocated()
        self.free_after: list[Any] = [made] * slots
        # Whether the staging buffers are pageable (learned at the first copy out of one).
        self.pageable: bool | None = None
        # From pageable memory, blocks copied ahead with their run counted then (their turn
        # does not count it again), and the seconds their staging was waited for, reported then.
        self.ahead: dict[int, float] = {}
        # Per slot: the count of finish() calls when it was last freed. The compute stream runs
        # in order, so the lowest is the free slot whose compute ends first.
        self.freed: list[int] = [0] * slots
        self.finished = 0
        self.holder: list[int | None] = [None] * slots  # the engine block a slot holds
        self.queued: dict[int, _Copy] = {}  # copies not yet used by their block
        self.running: dict[int, int] = {}  # engine block -> its slot while it runs
        self.returning: list[_Copy] = []  # copies whose leases go back once they completed
        # Copies in flight that may hold staging buffers: one buffer stays with the engine, which
        # stages the next block in it while the link copies (with one buffer, none is spare).
        self.in_flight = max(1, buffers - 1)

    def take(self, block: int) -> Taken:
        """The block's bytes in a slot, the compute stream waiting for their copy; queues the
        copies of the next blocks that are staged."""
        self._return_leases()
        copy = self.queued.get(block)
        staged_wait = 0.0
        if copy is None and block not in self.images:
            t0 = _core.clock()  # a part of the run the hooks time on this clock
            self._make_room(block)
            slot = self._slot_for(block)  # before the lease: a failure here holds nothing
            lease = self.engine.acquire(block)
            staged_wait = _core.clock() - t0
            try:
                copy = self._queue(block, lease, slot)
            except BaseException:
                lease.release()
                raise
        else:
            # First: an engine that may not stream now (another has the shared staging pool)
            # fails here with the copy still queued. A block copied ahead counted its run then.
            if block in self.ahead:
                staged_wait = self.ahead.pop(block)
            else:
                self.engine.advance(block)
            self.queued.pop(block, None)
            if copy is None:  # straight from the in-memory RAM tier
                copy = self._queue(block, None, self._slot_for(block))
        # Running from here on, so that finish() frees the slot whatever fails next.
        self.running[block] = copy.slot
        mark = self.device.compute_waits(copy.event)
        if not self._prefetch_after_kernels():
            self._prefetch(block)
        return Taken(self.slots[copy.slot], staged_wait, copy.event, mark, copy.nbytes)

    def finish(self, block: int) -> None:
        """The block's kernels are queued: its slot may be refilled after them."""
        slot = self.running.pop(block, None)
        if slot is None:
            return
        self.free_after[slot] = self.device.compute_done()
        self.finished += 1
        self.freed[slot] = self.finished
        self.holder[slot] = None
        self._return_leases()
        if self._prefetch_after_kernels():
            self._copy_next(block)

    def refresh_image(self, block: int) -> None:
        """``block``'s bytes changed (a merge written into its image, or taken back): a copy of
        it made ahead holds the bytes before, so it goes (its turn copies it again); and it is
        copied from the RAM tier's memory only while the engine still offers that (a patched
        block is staged from its image)."""
        from torch.utils.dlpack import from_dlpack

        stale = self.queued.pop(block, None)
        if stale is not None:
            # Its lease goes back once its copy completed, as every lease does.
            self.holder[stale.slot] = None
            self.ahead.pop(block, None)
        if not self.direct:
            return
        image = self.engine.ram_image(block)
        if image is None:
            self.images.pop(block, None)
        elif block not in self.images:
            self.images[block] = from_dlpack(image)

    def copy_from_images(self) -> None:
        """The in-memory RAM tier arrived and is pinned: its blocks are copied from it from the
        next one on (those copied ahead already stay where they are)."""
        from torch.utils.dlpack import from_dlpack

        self.direct = True
        for b in self.order:
            if b not in self.images:
                image = self.engine.ram_image(b)
                if image is not None:
                    self.images[b] = from_dlpack(image)

    def _prefetch_after_kernels(self) -> bool:
        """Whether the copies ahead are queued after a block's kernels, not before: from
        pageable memory each copy holds the host until it is done, and queued behind the
        kernels the device computes while the host waits."""
        return bool(self.pageable)

    def _allocated(self) -> Any:
        """An event after the work queued so far on the stream the slots were allocated on:
        memory that stream freed may be handed out again while its kernels still read it."""
        return self.device.compute_done()

    def held(self, block_name: Callable[[int], str]) -> Iterator[tuple[object, str]]:
        """(tensor, what it is) for its device slots, the RAM tier's images it keeps and the
        staging buffers of copies not yet returned; ``{owner}`` stands for the model's class."""
        for i, slot in enumerate(self.slots):
            yield slot, f"device slot {i} of {{owner}}"
        for b, image in self.images.items():
            yield image, f"in-memory RAM tier of {{owner}}.{block_name(b)}"
        for copy in [*self.queued.values(), *self.returning]:
            if copy.lease is not None:
                yield copy.host, f"staging buffer of {{owner}}.{block_name(copy.block)}"

    def close(self) -> None:
        self.device.synchronize()
        for copy in self.returning:
            copy.lease.release()
        self.returning.clear()
        self.queued.clear()
        self.running.clear()
        self.slots.clear()
        self.ahead.clear()

    def return_all(self) -> None:
        """Waits for every copy out of a staging buffer and returns its lease. The copies
        queued for the next blocks stay in their device slots; a turn that takes one asks the
        engine for it again (its pool may have gone to another stage meanwhile)."""
        if self.returning:
            self.device.synchronize()
            self._return_leases()
        self.ahead.clear()

    def _may_return(self, copy: _Copy) -> bool:
        return self.device.ready(copy.event)

    def _return_leases(self) -> None:
        keep = []
        for copy in self.returning:
            if self._may_return(copy):
                assert copy.host is not None
                self.device.released(copy.host, copy.lease)
                copy.lease.release()
                # The buffer goes back with its last view: a copy waiting for its block must
                # not keep it from the engine, which stages the next blocks in it.
                copy.host = None
            else:
                keep.append(copy)
        self.returning = keep

    def _slot_for(self, block: int) -> int:
        slot = self._free_slot()
        if slot is None:  # every slot holds a prefetched block: give up the farthest one
            slot = self._drop_farthest(block)
        return slot

    def _make_room(self, block: int) -> None:
        """Waits (on the host) for the oldest copies until fewer than ``in_flight`` hold staging
        buffers, and until none still reads ``block`` from an earlier run (the engine leases a
        block once at a time; with few blocks the host can come round to one before its last copy
        ended)."""
        while self.returning and (
            len(self.returning) >= self.in_flight or any(c.block == block for c in self.returning)
        ):
            self.device.wait(self.returning[0].event)
            self._return_leases()

    def _free_slot(self) -> int | None:
        free = [i for i, h in enumerate(self.holder) if h is None]
        return min(free, key=lambda i: self.freed[i]) if free else None

    def _drop_farthest(self, block: int) -> int:
        if not self.queued:
            raise StreamError(
                f"every one of the {len(self.slots)} device slots holds a block that is running: blocks "
                "that run inside one another need as many slots (plan a larger lookahead)"
            )
        # Distance forward from `block`, around the end of the order: a queued block behind it
        # runs in the next pass (or, in a last pass, not again), so it is the first to go.
        far = max(self.queued, key=lambda b: (self.pos[b] - self.pos[block]) % len(self.order))
        copy = self.queued.pop(far)
        # Its lease goes back once its copy completed, as every lease does; the next copy into
        # the slot is queued after it on the same stream. Copied ahead with its run counted, it
        # is asked for again at its turn, which counts it then.
        self.holder[copy.slot] = None
        self.ahead.pop(far, None)
        return copy.slot

    def _queue(self, block: int, lease: Any, slot: int) -> _Copy:
        """Queues the copy of a leased staging buffer, or (``lease`` None) of the block's image
        in the in-memory RAM tier, which stays where it is and needs no return."""
        from torch.utils.dlpack import from_dlpack

        host = self.images[block] if lease is None else from_dlpack(lease.block_bytes())
        if lease is not None and self.pageable is None:
            self.pageable = not self.device.pinned(host)
        event = self.device.copy(self.slots[slot][: host.numel()], host, self.free_after[slot])
        self.holder[slot] = block
        copy = _Copy(block, lease, host, host.numel(), slot, event)
        if lease is not None:
            # The staging buffer goes back as soon as the copy has landed, before the block runs
            # (from pageable memory, that is now: the copy held the host until it was done).
            self.returning.append(copy)
            if self.pageable:
                self._return_leases()
        return copy

    def _copy_next(self, block: int) -> None:
        """From pageable memory, behind ``block``'s kernels: the next block not copied yet is
        copied now, its staging waited for if need be. One copy per block, since each holds
        the host and the device has this block's kernels to run meanwhile; waiting here rather
        than at the block's own turn costs the host nothing, and asking the engine now moves its
        window, so the block after is staged while this copy holds the host."""
        for nxt in self.engine.next_blocks(block)[: self.lookahead]:
            if nxt in self.queued or nxt in self.running or nxt in self.images:
                continue
            slot = self._free_slot()
            if slot is None:
                return
            t0 = _core.clock()
            self._make_room(nxt)
            lease = self.engine.try_lease(nxt)
            if lease is None:
                lease = self.engine.acquire(nxt)
            else:
                self.engine.advance(nxt)
            # Its run is counted now, and the window moved past it: the block after is staged
            # while this copy holds the host.
            self.ahead[nxt] = _core.clock() - t0
            try:
                self.queued[nxt] = self._queue(nxt, lease, slot)
            except BaseException:
                lease.release()
                raise
            return

    def _prefetch(self, block: int) -> None:
        # The engine's window, not one of our own: it stops where the engine stops staging (at
        # the end of a last pass, whose first blocks have given their memory back).
        for nxt in self.engine.next_blocks(block)[: self.lookahead]:
            if nxt in self.queued or nxt in self.running:
                continue
            slot = self._free_slot()
            if slot is None:
                return
            if nxt not in self.images and len(self.returning) >= self.in_flight:
                return  # the engine keeps its buffer for the block after
            lease = None if nxt in self.images else self.engine.try_lease(nxt)
            if lease is None and nxt not in self.images:  # not staged yet: its run will wait
                return
            self.queued[nxt] = self._queue(nxt, lease, slot)
