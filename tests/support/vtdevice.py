"""A device with CUDA's semantics in virtual time, for proving the schedules of the device code
(:mod:`trash_panda.offload.backends.copies`, the loader's copies, the memory a stage hands to the
next) without a GPU (docs/architecture.md).

What it models, each rule with a unit test of its own in tests/device/test_vtdevice.py:

- **Streams.** The host queues work on streams and goes on at once. Each stream runs its queue in
  order; an event is the end of the work queued before it on its stream; a stream made to wait
  for an event starts nothing queued after the wait before it. A copy takes bytes / link
  bandwidth, a compute what the caller says. Only an event's wait, :meth:`VirtualDevice.synchronize`,
  a blocking engine ``acquire`` and a copy from pageable memory hold the calling thread, besides
  small fixed costs (queueing a block's kernels, queueing a copy, waking from a wait).
- **The current stream of each host thread.** Compute, waits and allocations go to the calling
  thread's current stream: the default stream unless the thread entered :meth:`VirtualDevice.use`
  (``torch.cuda.stream(s)``). A copy goes to the copy stream of the device object it is asked of:
  :meth:`VirtualDevice.side` gives a device object with a copy stream of its own (a loader's).
- **One copy engine.** Host-to-device copies from every stream share it: a copy runs when its
  stream lets it start and the engine is free, in the first gap long enough for it.
- **Pageable memory.** A ``non_blocking`` copy from host memory that is not pinned holds the
  calling thread until the copy is done (``pinned=False``, or memory not :meth:`pin`-ned).
- **The caching allocator.** Device memory is allocated on the calling thread's current stream.
  Freed (its last tensor, view or DLPack capsule gone), it goes back to that stream's pool and
  is handed to the next allocation on that stream at once, in host order, while work already
  queued may still read it; a fresh allocation carries those pending accesses. A stream recorded
  on the memory (:meth:`VirtualDevice.record_stream`, and every copy into it) keeps it from the
  pool until the work queued on that stream by the free has run, as the allocator's events do.
- **Hazards.** Every access of device memory (a copy into it, a compute reading or writing it) is
  checked against the earlier ones on the same bytes: an access that runs before an earlier one,
  in host order, has ended, where either writes, is a race, recorded in
  :attr:`VirtualDevice.violations` at its virtual moment (the test asserts the list is empty).
  On the host side, a staging buffer given back to the engine (or refilled) while a copy still
  reads it, and a block computing on a slot that another block's bytes refilled, are recorded too.

Copies also move real bytes (at once, in the host's order), so a model run through the real hooks
computes on the bytes the bookkeeping chose; with ``poison`` a returned staging buffer is poisoned
and discarded, as the threaded simulated device does.

The host is the thread that made the device. Another thread (a loader beside the compute) has a
clock of its own, which only its waits and blocking copies move (:meth:`VirtualDevice.clock`):
its waits never hold the host, as on CUDA, where a thread blocked on an event blocks no other.

:class:`VirtualEngine` stands in for the core engine with its workers in virtual time (fill =
bytes / fill rate, shared by the fills under way); a lease's buffer goes back only once the
lease and every view of its bytes are gone, as the core's does. :func:`predict_step` runs one
schedule and returns its steady step; ``bench/gpu_stream.py`` can print it beside measured
figures.

Importable with ``tests/`` on ``sys.path``; needs only torch and trash_panda.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from trash_panda.offload.backends.copies import SlotCopies

POISON = 0xFF  # all-ones bytes: NaN in every float dtype
EPS = 1e-12  # seconds: float noise in sums of virtual times
# The host's costs, guessed (no GPU has measured them yet): queueing one block's kernels with
# the hooks' bookkeeping around them, and queueing one copy or waking from one wait.
LAUNCH_S = 100e-6
CALL_S = 10e-6
# The caching allocator's rounding.
ALLOC_ALIGN = 512


@dataclass(eq=False)
class VStream:
    """A stream: ``free`` is when the work queued on it so far has run."""

    name: str
    free: float = 0.0

    def __repr__(self) -> str:
        return f"stream {self.name}"


@dataclass
class VEvent:
    """A point on a stream's timeline, with the part of the CUDA event API the backends use."""

    t: float
    # The device that made it: a wait depends on the waiting thread's clock, which it keeps.
    device: VirtualDevice | None = field(default=None, repr=False, compare=False)

    def elapsed_time(self, end: VEvent) -> float:
        return (end.t - self.t) * 1000.0  # milliseconds, as torch.cuda.Event

    def query(self) -> bool:
        raise AssertionError("ask the device: VirtualDevice.ready(event)")

    def synchronize(self) -> None:
        assert self.device is not None, "an event no device made: ask the device, VirtualDevice.wait(event)"
        self.device.wait(self)


@dataclass
class VCopy:
    """A queued copy: events at its start and end (read as a CudaCopy by the backend's timing)."""

    start: VEvent
    done: VEvent
    src: int  # address of the host bytes it reads
    slot: int  # the allocation it writes
    tag: Any  # what the host bytes held when it was queued (a block index, POISON, or None)
    stream: str = ""


@dataclass
class Access:
    """One piece of queued device work on device memory."""

    lo: int  # real addresses, [lo, hi)
    hi: int
    start: float
    end: float
    stream: VStream
    write: bool
    what: str


@dataclass(eq=False)
class Allocation:
    """A piece of device memory as the caching allocator handed it out."""

    index: int
    addr: int
    nbytes: int
    stream: VStream  # where it was allocated: the pool it goes back to
    uses: set[VStream] = field(default_factory=set)  # streams recorded on it
    last: VCopy | None = None  # the latest copy into it
    live: bool = True


@dataclass(eq=False)
class _FreeBlock:
    segment: bytearray
    offset: int
    nbytes: int
    addr: int
    available: float  # when the events of the streams recorded on it have happened


@dataclass
class Compute:
    start: float
    end: float
    block: Any
    stream: str = ""


class VirtualDevice:
    """Implements the ``Device`` protocol of :mod:`trash_panda.offload.backends.copies` in virtual time.

    ``scale``: virtual bytes per real byte, so that tiny real tensors stand for blocks of
    gigabytes. ``launch_s``: the host's time to queue one block's compute (:meth:`run_compute`);
    ``call_s``: to queue a copy, or to wake from a :meth:`wait`. ``pinned``: whether host memory
    is pinned unless said otherwise (False: only what :meth:`pin` registered is).
    """

    def __init__(
        self,
        link_bps: float,
        scale: float = 1.0,
        launch_s: float = LAUNCH_S,
        call_s: float = CALL_S,
        poison: bool = True,
        pinned: bool = True,
        capacity: int | None = None,
    ) -> None:
        self.link_bps = link_bps
        self.capacity = capacity  # real bytes of device memory (None: as much as asked for)
        self.reserved = 0  # real bytes the allocator took from the device (its segments)
        self.scale = scale
        self.launch_s = launch_s
        self.call_s = call_s
        self.poison = poison
        self.all_pinned = pinned
        self.lock = threading.RLock()  # the host, loaders and feeders call in
        self.now = 0.0  # the host's clock
        self.host = threading.get_ident()
        self.side_clocks: dict[int, float] = {}  # the clocks of other threads, by thread
        self.default_stream = VStream("default")
        self.copy_stream = VStream("copy")
        self.streams = [self.default_stream, self.copy_stream]
        self._current: dict[int, list[VStream]] = {}  # a thread's stream stack (use())
        self.engine_busy: list[tuple[float, float]] = []  # the copy engine's copies, by start
        self.pinned_ranges: list[tuple[int, int]] = []
        self.allocs: list[Allocation] = []
        self.pools: dict[VStream, list[_FreeBlock]] = {}
        self.accesses: dict[int, list[Access]] = {}  # allocation index -> accesses not yet pruned
        self.tags: dict[int, Any] = {}  # host address -> what it holds, where known
        self.host_reads: dict[int, list[VCopy]] = {}  # host address -> copies queued from it
        self.copies: list[VCopy] = []
        self.computes: list[Compute] = []
        self.violations: list[str] = []

    # -- compatibility: the stream a thread computes on, the copy stream ------------------------

    @property
    def compute_free(self) -> float:
        """When the default stream has run everything queued on it."""
        return self.default_stream.free

    # -- streams and threads ------------------------------------------------------------------

    def new_stream(self, name: str) -> VStream:
        """A stream of the caller's (``torch.cuda.Stream()``)."""
        s = VStream(name)
        self.streams.append(s)
        return s

    def current_stream(self) -> VStream:
        stack = self._current.get(threading.get_ident())
        return stack[-1] if stack else self.default_stream

    @contextlib.contextmanager
    def use(self, stream: VStream) -> Iterator[VStream]:
        """``with torch.cuda.stream(stream)``: the calling thread's work goes there."""
        stack = self._current.setdefault(threading.get_ident(), [])
        stack.append(stream)
        try:
            yield stream
        finally:
            stack.pop()

    def side(self) -> SideDevice:
        """A device object on the same device whose copies go on a stream of their own."""
        with self.lock:
            return SideDevice(self, self.new_stream(f"side {len(self.streams) - 1}"))

    def clock(self) -> float:
        """The calling thread's clock: the host's ``now``, or another thread's own, which starts
        at 0 (it may act as early as what it waits for lets it)."""
        me = threading.get_ident()
        return self.now if me == self.host else self.side_clocks.get(me, 0.0)

    def move_clock(self, at: float) -> None:
        """Sets the calling thread's clock to ``at``."""
        me = threading.get_ident()
        if me == self.host:
            self.now = at
        else:
            self.side_clocks[me] = at

    # -- the Device protocol ------------------------------------------------------------------

    def empty(self, nbytes: int) -> torch.Tensor:
        """Device memory from the caching allocator, on the calling thread's current stream."""
        return self.allocate(self.current_stream(), nbytes)

    def empty_on_copy_stream(self, nbytes: int) -> torch.Tensor:
        return self.allocate(self.copy_stream, nbytes)

    def free_memory(self) -> int:
        """What the device has outside the allocator's segments (virtual bytes)."""
        if self.capacity is None:
            return 1 << 62
        return int(max(0, self.capacity - self.reserved) * self.scale)

    def allocate(self, stream: VStream, nbytes: int) -> torch.Tensor:
        """Device memory from the caching allocator on ``stream``: a block of its pool freed
        long enough ago, else a fresh segment; with none left on the device, the allocator
        waits for the whole device and gives every cached block back first (as CUDA's does
        before it reports out of memory)."""
        with self.lock:
            size = max(ALLOC_ALIGN, -(-nbytes // ALLOC_ALIGN) * ALLOC_ALIGN)
            now = self.clock()
            pool = self.pools.setdefault(stream, [])
            fits = [b for b in pool if b.nbytes >= size and b.available <= now + EPS]
            if not fits and self.capacity is not None and self.reserved + size > self.capacity:
                self.synchronize()
                for blocks in self.pools.values():
                    whole = [b for b in blocks if b.offset == 0 and b.nbytes == len(b.segment)]
                    self.reserved -= sum(b.nbytes for b in whole)
                    for b in whole:
                        blocks.remove(b)
                if self.reserved + size > self.capacity:
                    raise torch.OutOfMemoryError(f"virtual device: {size} bytes do not fit")
            if fits:
                block = min(fits, key=lambda b: b.nbytes)
                pool.remove(block)
                if block.nbytes > size:  # the rest stays in the pool, as the allocator splits
                    rest = _FreeBlock(
                        block.segment, block.offset + size, block.nbytes - size, block.addr + size, block.available
                    )
                    pool.append(rest)
                segment, offset, fresh = block.segment, block.offset, False
            else:
                segment, offset, fresh = bytearray(size), 0, True
                self.reserved += size
            view = memoryview(segment)[offset : offset + size]
            t = torch.frombuffer(view, dtype=torch.uint8)
            if fresh:
                t.fill_(POISON)
            a = Allocation(len(self.allocs), t.data_ptr(), size, stream)
            self.allocs.append(a)
            # The tensor's storage holds the memoryview: every view of the tensor, and every
            # DLPack capsule of one, keeps it. Its end is the free, on whichever thread.
            weakref.finalize(view, self._freed, a, segment, offset)
            if not fresh:
                # The memory carries the accesses queued on it before: whoever uses it next on
                # another stream must come after them.
                self.accesses[a.index] = [x for i, xs in self._overlapping(a.addr, a.addr + size) for x in xs]
            return t[:nbytes]

    def copy(self, dst: torch.Tensor, src: torch.Tensor, after: Any) -> VCopy:
        return self.copy_on(self.copy_stream, dst, src, after)

    def copy_on(self, stream: VStream, dst: torch.Tensor, src: torch.Tensor, after: Any) -> VCopy:
        """Queues ``dst.copy_(src, non_blocking=True)`` on ``stream`` after event ``after``."""
        with self.lock:
            a = self._alloc_of(dst)
            nbytes = src.numel() * src.element_size()
            dur = nbytes * self.scale / self.link_bps
            start = self._engine_slot(max(self.clock(), stream.free, _time(after)), dur)
            end = start + dur
            addr = src.data_ptr()
            c = VCopy(VEvent(start), VEvent(end, self), addr, a.index, self.tags.get(addr), stream.name)
            what = f"the copy into allocation {a.index}"
            self._access(a, dst, start, end, stream, True, what, copy=True)
            stream.free = end
            a.uses.add(stream)  # the allocator keeps it from reuse until the copy has run
            a.last = c
            self.host_reads.setdefault(addr, []).append(c)
            self.copies.append(c)
            if self.pinned(src):
                self.move_clock(self.clock() + self.call_s)
            else:  # a copy from pageable memory holds the host until it is done
                self.move_clock(max(self.clock(), end) + self.call_s)
            dst.copy_(src)
            return c

    def compute_waits(self, event: Any) -> VEvent:
        # Marks where the stream reaches the wait, as CudaDevice's mark does.
        with self.lock:
            stream = self.current_stream()
            mark = VEvent(max(stream.free, self.clock()))
            stream.free = max(stream.free, _time(event))
            return mark

    def compute_done(self) -> VEvent:
        with self.lock:
            return VEvent(max(self.current_stream().free, self.clock()), self)

    def record_stream(self, t: torch.Tensor, stream: Any) -> None:
        with self.lock:
            a = self._alloc_of(t, None)
            if a is not None:
                a.uses.add(stream)

    def ready(self, event: Any) -> bool:
        return _time(event) <= self.clock() + EPS

    def wait(self, event: Any) -> None:
        self.move_clock(max(self.clock(), _time(event)) + self.call_s)

    def released(self, host: torch.Tensor, lease: Any) -> None:
        with self.lock:
            self._host_written(host.data_ptr(), "returned to the engine")
            if self.poison:
                host.fill_(POISON)
                # Unknown from here: a real engine's workers refill it without telling the device.
                self.tags.pop(host.data_ptr(), None)
                lease.discard()  # the engine stages the block again rather than reuse the poison

    def synchronize(self) -> None:
        with self.lock:
            self.move_clock(max([self.clock()] + [s.free for s in self.streams]))

    def pin(self, owner: object, ranges: list[tuple[int, int]], fallback: str) -> Any:
        """Registers host ranges as pinned; a registration (``close()`` unpins them)."""
        with self.lock:
            self.pinned_ranges += [(a, a + n) for a, n in ranges]
        return _Pinned(self, [(a, a + n) for a, n in ranges])

    # -- what the model and the engine tell the device ----------------------------------------

    def run_compute(
        self,
        seconds: float,
        reads: torch.Tensor | list[torch.Tensor] | None = None,
        block: Any = None,
        writes: torch.Tensor | list[torch.Tensor] | None = None,
        what: str | None = None,
    ) -> Compute:
        """Queues a block's compute of ``seconds`` on the calling thread's current stream,
        reading ``reads`` (device memory, or views into it) and writing ``writes``; where
        ``block`` is given, the first of ``reads`` must be a slot holding that block's bytes.
        ``what`` names it in violations. The host pays the launch cost and goes on."""
        with self.lock:
            stream = self.current_stream()
            start = max(stream.free, self.clock())
            end = start + seconds
            read = [] if reads is None else [reads] if isinstance(reads, torch.Tensor) else list(reads)
            wrote = [] if writes is None else [writes] if isinstance(writes, torch.Tensor) else list(writes)
            what = what or (f"block {block}" if block is not None else "a compute")
            if read and block is not None:
                a = self._alloc_of(read[0])
                last = a.last
                if last is None:
                    self._broken(f"block {block} computes on slot {a.index}, which no copy filled")
                elif last.tag is not None and last.tag != block:
                    self._broken(f"block {block} computes on slot {a.index}, refilled with {last.tag!r} before it ran")
            for t in read:
                a = self._alloc_of(t, None)
                if a is not None:
                    self._access(a, t, start, end, stream, False, what)
            for t in wrote:
                a = self._alloc_of(t, None)
                if a is not None:
                    self._access(a, t, start, end, stream, True, what)
            stream.free = end
            self.move_clock(self.clock() + self.launch_s)
            c = Compute(start, end, block, stream.name)
            self.computes.append(c)
            return c

    def write(self, host: torch.Tensor, tag: Any, at: float) -> None:
        """The engine writes ``host`` at virtual time ``at``: ``tag`` is what it holds after."""
        with self.lock:
            self._host_written(host.data_ptr(), f"written at {at:.6f} s", at)
            self.tags[host.data_ptr()] = tag

    def allocation(self, t: torch.Tensor) -> Allocation | None:
        """The allocation that holds ``t`` (live or freed), or None."""
        with self.lock:
            return self._alloc_of(t, None)

    # -- the rules ----------------------------------------------------------------------------

    def _freed(self, a: Allocation, segment: bytearray, offset: int) -> None:
        with self.lock:
            a.live = False
            # The events the allocator records at the free, on each other stream that used it.
            available = max([0.0] + [s.free for s in a.uses if s is not a.stream])
            self.pools.setdefault(a.stream, []).append(_FreeBlock(segment, offset, a.nbytes, a.addr, available))

    def _engine_slot(self, earliest: float, dur: float) -> float:
        """The first time from ``earliest`` the copy engine is free for ``dur``; booked."""
        t = earliest
        busy = self.engine_busy
        for s, e in busy:
            if e <= t + EPS:
                continue
            if s >= t + dur - EPS:
                break
            t = e
        busy.append((t, t + dur))
        busy.sort()
        floor = min([self.now, *self.side_clocks.values()])
        if len(busy) > 64:  # what ended before every thread's clock can no longer be in the way
            self.engine_busy = [b for b in busy if b[1] > floor]
        return t

    def _access(
        self,
        a: Allocation,
        t: torch.Tensor,
        start: float,
        end: float,
        stream: VStream,
        write: bool,
        what: str,
        copy: bool = False,
    ) -> None:
        lo = t.data_ptr()
        hi = lo + max(1, t.numel() * t.element_size())
        mine = self.accesses.setdefault(a.index, [])
        for old in mine:
            if old.hi <= lo or hi <= old.lo or not (old.write or write) or old.stream is stream:
                continue
            if start < old.end - EPS:
                self._broken(self._hazard(a, old, start, stream, write, what, copy))
                break
        mine.append(Access(lo, hi, start, end, stream, write, what))
        if len(mine) > 64:
            floor = min([self.now, *self.side_clocks.values()])
            self.accesses[a.index] = [x for x in mine if x.end > floor]

    @staticmethod
    def _hazard(a: Allocation, old: Access, start: float, stream: VStream, write: bool, what: str, copy: bool) -> str:
        if copy and not old.write:
            return (
                f"allocation {a.index} refilled at {start:.6f} s while {old.what} on {old.stream} reads it "
                f"until {old.end:.6f} s"
            )
        if not write and old.write and old.what.startswith("the copy into"):
            return (
                f"{what} computes on allocation {a.index} at {start:.6f} s; the copy into it lands at {old.end:.6f} s"
            )
        verb = "writes" if write else "reads"
        was = "writes" if old.write else "reads"
        return (
            f"{what} on {stream} {verb} allocation {a.index} at {start:.6f} s while {old.what} on "
            f"{old.stream} {was} it until {old.end:.6f} s"
        )

    def _overlapping(self, lo: int, hi: int) -> list[tuple[int, list[Access]]]:
        return [
            (i, xs)
            for i, xs in self.accesses.items()
            if xs and self.allocs[i].addr < hi and lo < self.allocs[i].addr + self.allocs[i].nbytes
        ]

    def _alloc_of(self, t: torch.Tensor, missing: str | None = "") -> Any:
        addr = t.data_ptr()
        # The newest first: freed memory handed out again belongs to its latest allocation.
        for a in reversed(self.allocs):
            if a.addr <= addr < a.addr + a.nbytes:
                return a
        if missing is None:
            return None
        raise AssertionError(f"{addr:#x} is in no device allocation")

    def pinned(self, t: torch.Tensor) -> bool:
        if self.all_pinned:
            return True
        addr = t.data_ptr()
        return any(lo <= addr < hi for lo, hi in self.pinned_ranges)

    def _host_written(self, addr: int, what: str, at: float | None = None) -> None:
        at = self.clock() if at is None else at
        keep = []
        for c in self.host_reads.get(addr, []):
            if c.done.t > at + EPS:
                self._broken(f"staging buffer {addr:#x} {what} while a copy reads it until {c.done.t:.6f} s")
            elif c.done.t > self.now:
                keep.append(c)
        self.host_reads[addr] = keep

    def _broken(self, what: str) -> None:
        self.violations.append(what)


class SideDevice:
    """A device object on a :class:`VirtualDevice` whose copies go on a stream of its own (what
    ``CudaDevice(device)`` beside another is on a GPU: a loader's copies); all else is the
    device's."""

    def __init__(self, main: VirtualDevice, stream: VStream) -> None:
        self.main = main
        self.stream = stream

    def copy(self, dst: torch.Tensor, src: torch.Tensor, after: Any) -> VCopy:
        return self.main.copy_on(self.stream, dst, src, after)

    def empty_on_copy_stream(self, nbytes: int) -> torch.Tensor:
        return self.main.allocate(self.stream, nbytes)

    def side(self) -> SideDevice:
        return self.main.side()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.main, name)


class _Pinned:
    def __init__(self, dev: VirtualDevice, ranges: list[tuple[int, int]]) -> None:
        self.dev, self.ranges = dev, ranges

    def close(self) -> None:
        with self.dev.lock:
            for r in self.ranges:
                if r in self.dev.pinned_ranges:
                    self.dev.pinned_ranges.remove(r)
        self.ranges = []


def _time(event: Any) -> float:
    if event is None:
        return 0.0
    return float(event.done.t if isinstance(event, VCopy) else event.t)


EMPTY, FILLING, READY, LEASED = "empty", "filling", "ready", "leased"


@dataclass
class _Buffer:
    data: torch.Tensor
    raw: bytearray
    state: str = EMPTY
    block: int | None = None
    stamp: int = 0  # when it last became ready: the stalest is reclaimed first
    used: bool = False


@dataclass
class _Fill:
    buffer: int
    block: int
    left: float  # virtual bytes still to read
    start: float


@dataclass
class Filled:
    """A finished staging, as the core's ``Engine.stagings()`` records one."""

    block: int
    start: float
    end: float
    bytes: int


class VirtualLease:
    """A lease of a staging buffer. As the core's lease, its buffer goes back to the engine once
    the lease is released and every view of its bytes (``block_bytes``, and what was made from
    them: slices, DLPack tensors) is gone."""

    def __init__(self, engine: VirtualEngine, buffer: int, block: int) -> None:
        self.engine = engine
        self.buffer = buffer
        self.block = block
        self.discarded = False
        self.live = True  # not released
        self.views = 0  # views of its bytes still alive
        self.back = False

    def block_bytes(self) -> torch.Tensor:
        buf = self.engine.buffers[self.buffer]
        view = memoryview(buf.raw)
        t = torch.frombuffer(view, dtype=torch.uint8)
        self.views += 1
        weakref.finalize(view, self._view_gone)
        return t

    def discard(self) -> None:
        self.discarded = True

    def release(self) -> None:
        if self.live:
            self.live = False
            self._maybe_back()

    def _view_gone(self) -> None:
        self.views -= 1
        self._maybe_back()

    def _maybe_back(self) -> None:
        if not self.live and self.views == 0 and not self.back:
            self.back = True
            self.engine._give_back(self)


@dataclass
class EngineCounts:
    acquires: int = 0
    hits: int = 0  # blocks found staged (try_lease, or acquire without a wait)
    waits: int = 0  # acquires that waited for a fill
    wait_s: float = 0.0
    fills: int = 0
    reclaimed_unused: int = 0  # staged blocks whose buffer was taken before they were used


class VirtualEngine:
    """The part of the core engine that :class:`SlotCopies` uses, with its workers in virtual
    time. It follows the rules of ``crates/trash-panda/src/stream`` (pool.rs ``plan``,
    ``pick_slot``, ``next_after``; worker.rs's loop; mod.rs ``acquire``; early.rs ``try_lease`` and
    ``advance``; lease.rs's return once every view is gone), so the pipeline meets the engine it
    meets on a GPU.

    Simplified: no failed stagings, no last pass (``next_blocks`` always wraps), no statistics
    beyond :class:`EngineCounts` and :attr:`stagings`. Every block has ``block_bytes``; a fill
    takes ``block_bytes / fill_bps`` alone, and fills under way share the rate evenly (the drive
    or the host's memory bandwidth is one resource). ``fill_bps`` None: fills are instant.
    ``direct``: every block is in the in-memory RAM tier, which the device copies from
    (``ram_image``) and the engine never stages ahead.
    """

    def __init__(
        self,
        device: VirtualDevice,
        blocks: int,
        block_bytes: int,
        lookahead: int,
        buffers: int | None = None,
        workers: int = 2,
        fill_bps: float | None = None,
        direct: bool = False,
        real_bytes: int = 256,
    ) -> None:
        self.device = device
        self.block_bytes = block_bytes
        self.lookahead = lookahead
        self.fill_bps = fill_bps
        self.idle = max(1, workers)
        count = max(1, lookahead + 1 if buffers is None else buffers)
        raws = [bytearray(real_bytes) for _ in range(count)]
        self.buffers = [_Buffer(torch.frombuffer(r, dtype=torch.uint8), r) for r in raws]
        self.direct = [direct] * blocks
        self.images: dict[int, torch.Tensor] = {}
        if direct:
            for b in range(blocks):
                image = torch.full((real_bytes,), b % 251, dtype=torch.uint8)
                device.write(image, b, 0.0)
                self.images[b] = image
        self._order = list(range(blocks))
        self.pos = list(range(blocks))
        self.queue: deque[int] = deque()
        self.window: list[int] = []
        self.demanded: list[int] = []
        self.fills: list[_Fill] = []
        self.stagings: list[Filled] = []
        self.t = 0.0  # the workers' clock: never ahead of the host's outside acquire
        self.clock = 0
        self.counts = EngineCounts()
        self._plan_start()  # as set_order does when the hooks are installed

    # What SlotCopies calls.

    def order(self) -> list[int]:
        return list(self._order)

    def ram_image(self, block: int) -> torch.Tensor | None:
        return self.images.get(block)

    def next_blocks(self, block: int) -> list[int]:
        return self._next_after(block, self.lookahead)

    def try_lease(self, block: int) -> VirtualLease | None:
        self._catch_up()
        i = self._find(block)
        if i is None or self.buffers[i].state != READY:
            return None
        self.counts.hits += 1
        return self._lease(i, block)

    def advance(self, block: int) -> None:
        self._catch_up()
        self._plan(block, include_first=False)
        self._dispatch()

    def acquire(self, block: int) -> VirtualLease:
        self._catch_up()
        self.counts.acquires += 1
        i = self._find(block)
        if i is not None and self.buffers[i].state == LEASED:
            raise RuntimeError(f"block {block} is already leased")
        hit = i is not None and self.buffers[i].state == READY
        asked = self.t
        self.demanded.append(block)
        self._plan(block, include_first=True)
        while True:
            self._dispatch()
            i = self._find(block)
            if i is not None and self.buffers[i].state == READY:
                break
            if i is None and all(b.state == LEASED for b in self.buffers):
                held = [b.block for b in self.buffers]
                raise RuntimeError(f"block {block}: every staging buffer is leased (blocks {held})")
            if i is None and block not in self.queue:
                self.queue.appendleft(block)  # a plan dropped it: first again
                continue
            if not self.fills:
                raise RuntimeError(f"block {block} can never be staged: nothing is being filled")
            self._step(float("inf"))
        self.demanded.remove(block)
        self.counts.hits += hit
        if self.t > asked:
            self.counts.waits += 1
            self.counts.wait_s += self.t - asked
        self.device.now = max(self.device.now, self.t)  # the host was blocked until now
        return self._lease(i, block)

    # The pool's rules (pool.rs).

    def _find(self, block: int) -> int | None:
        return next((i for i, b in enumerate(self.buffers) if b.state != EMPTY and b.block == block), None)

    def _next_after(self, block: int, lookahead: int) -> list[int]:
        n = len(self._order)
        at = self.pos[block]
        return [self._order[(at + k) % n] for k in range(1, min(lookahead, n - 1) + 1)]

    def _plan_start(self) -> None:
        if self.lookahead and self._order:
            first, last = self._order[0], self._order[-1]
            self._plan(last, include_first=first == last)
            self._dispatch()

    def _plan(self, first: int, include_first: bool) -> None:
        window = ([first] if include_first else []) + self._next_after(first, self.lookahead)
        window = [b for b in window if not self.direct[b] or (include_first and b == first)]
        queue: deque[int] = deque()
        for b in self.demanded + window:
            if self._find(b) is None and b not in queue:
                queue.append(b)
        self.window = window
        self.queue = queue

    def _pick_slot(self, block: int) -> int | None:
        for i, b in enumerate(self.buffers):
            if b.state == EMPTY:
                return i
        free = [i for i, b in enumerate(self.buffers) if b.state == READY and b.block not in self.demanded]
        outside = [i for i in free if self.buffers[i].block not in self.window]
        if outside:
            return min(outside, key=lambda i: self.buffers[i].stamp)
        if block not in self.demanded or not free:
            return None
        return max(free, key=lambda i: self.window.index(self.buffers[i].block))

    # The workers (worker.rs), in virtual time.

    def _dispatch(self) -> None:
        while self.idle and self.queue:
            block = self.queue[0]
            if self._find(block) is not None:
                self.queue.popleft()
                continue
            i = self._pick_slot(block)
            if i is None:
                return  # every worker waits for a buffer
            self.queue.popleft()
            buf = self.buffers[i]
            self.counts.reclaimed_unused += buf.state == READY and not buf.used
            buf.state, buf.block = FILLING, block
            self.idle -= 1
            self.device.write(buf.data, POISON, self.t)
            self.fills.append(_Fill(i, block, float(self.block_bytes), self.t))

    def _step(self, until: float) -> bool:
        """Runs the fills under way up to the next one's end, or to ``until`` if sooner; returns
        whether one ended."""
        if not self.fills or self.fill_bps is None:
            done = bool(self.fills)
            for f in self.fills:
                f.left = 0.0
        else:
            rate = self.fill_bps / len(self.fills)
            dt = min(f.left for f in self.fills) / rate
            done = self.t + dt <= until
            if not done:
                dt = max(0.0, until - self.t)
            self.t += dt
            for f in self.fills:
                f.left -= dt * rate
        for f in [f for f in self.fills if f.left <= self.block_bytes * 1e-9]:
            self.fills.remove(f)
            self._filled(f)
        return done

    def _filled(self, f: _Fill) -> None:
        buf = self.buffers[f.buffer]
        self.clock += 1
        buf.state, buf.stamp, buf.used = READY, self.clock, False
        buf.data.fill_(f.block % 251)
        self.device.write(buf.data, f.block, self.t)
        self.counts.fills += 1
        self.stagings.append(Filled(f.block, f.start, self.t, self.block_bytes))
        self.idle += 1

    def _catch_up(self) -> None:
        """Runs the workers up to the host's clock: what they did while the host queued work."""
        while True:
            self._dispatch()
            if not self._step(self.device.now):
                break
        self.t = max(self.t, self.device.now)
        self._dispatch()

    def _lease(self, i: int, block: int) -> VirtualLease:
        buf = self.buffers[i]
        buf.state, buf.used = LEASED, True
        return VirtualLease(self, i, block)

    def _give_back(self, lease: VirtualLease) -> None:
        self._catch_up()
        buf = self.buffers[lease.buffer]
        self.clock += 1
        buf.stamp = self.clock
        if lease.discarded:
            buf.state, buf.block = EMPTY, None
        else:
            buf.state = READY
        self._dispatch()


def predict_step(
    block_bytes: int,
    compute_s: float,
    lookahead: int,
    link_bps: float,
    fill_bps: float | None,
    buffers: int | None = None,
    blocks: int = 16,
    passes: int = 4,
    workers: int = 2,
    launch_s: float = LAUNCH_S,
    call_s: float = CALL_S,
    pipeline: type[SlotCopies] = SlotCopies,
    pinned: bool = True,
) -> dict[str, Any]:
    """The steady step of :class:`SlotCopies` on the virtual device, for ``blocks`` streamed
    blocks of ``block_bytes`` run ``passes`` times (the first pass is left out of the figures).

    ``fill_bps``: the staging fill rate, the total over the ``workers`` (a mapped RAM tier or the
    disk tier: every block goes through a staging buffer); None: the RAM tier is in private
    pinned memory, copied directly. ``buffers``: staging buffers and device slots, by default
    ``lookahead + 1`` as the plan has them. ``pipeline``: the bookkeeping to run (another
    revision's, to compare). ``pinned``: False, the staging buffers are pageable (their pinning
    was declined). Returns the step, its ideal (the largest of copy, compute, fill and the host's
    fixed costs per block; with pageable staging, the host holds for each copy, so compute and
    copy cannot both be hidden behind each other: their largest plus the queueing), their ratio,
    the share of the steady window the link was busy, and the counts."""
    real = 256
    direct = fill_bps is None
    dev = VirtualDevice(
        link_bps, scale=block_bytes / real, launch_s=launch_s, call_s=call_s, poison=False, pinned=pinned
    )
    eng = VirtualEngine(dev, blocks, block_bytes, lookahead, buffers, workers, fill_bps, direct, real)
    count = len(eng.buffers)
    pipe = pipeline(dev, eng, count, real, count, lookahead, direct=direct)
    ends: list[float] = []  # per run: its compute's end
    landed: list[float] = []  # per run: when its copy ended
    for _ in range(passes):
        for b in eng.order():
            taken = pipe.take(b)
            ends.append(dev.run_compute(compute_s, reads=taken.slot, block=b).end)
            landed.append(_time(taken.copy_event))
            del taken
            pipe.finish(b)
    pipe.close()
    steady = len(ends) - blocks
    step = (ends[-1] - ends[blocks - 1]) / steady
    copy_s = block_bytes / link_bps
    fill_s = 0.0 if fill_bps is None else block_bytes / fill_bps
    host_s = launch_s + call_s  # at the least: one block queued, one copy queued
    ideal = max(copy_s, compute_s, fill_s, host_s)
    lo, hi = landed[blocks - 1], landed[-1]
    busy = sum(max(0.0, min(c.done.t, hi) - max(c.start.t, lo)) for c in dev.copies)
    return {
        "step_s": step,
        "ideal_s": ideal,
        "ratio": step / ideal,
        "link_busy": busy / (hi - lo) if hi > lo else 0.0,
        "copy_s": copy_s,
        "compute_s": compute_s,
        "fill_s": fill_s,
        "host_s": host_s,
        "copies": len(dev.copies),
        "runs": len(ends),
        "hits": eng.counts.hits,
        "acquire_waits": eng.counts.waits,
        "stagings": list(eng.stagings),
        "violations": list(dev.violations),
    }
