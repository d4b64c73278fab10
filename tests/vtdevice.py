"""A device with CUDA's semantics in virtual time, for proving the schedule of
:mod:`trash_panda.offload.copy_pipeline` without a GPU (docs/architecture.md).

The host queues copies and compute and returns at once, as on CUDA: only ``wait`` (an event's
``synchronize``), ``synchronize`` and a blocking ``acquire`` hold it, besides small fixed costs
(queueing a block's kernels, queueing a copy, waking from a wait). The copy stream and the
compute stream each run their queue in order; an event completes when the work queued before it
on its stream has; ``compute_waits`` orders the compute stream after an event, ``copy(after=...)``
the copy stream. A copy takes bytes / link bandwidth. Nothing sleeps: every time is computed when
the work is queued, so a sweep of hundreds of schedules runs in seconds.

The host is the thread that made the device. Another thread (a loader beside the compute) has a
clock of its own, which only its waits move (:meth:`VirtualDevice.clock`): its waits never hold the
host, as on CUDA, where a thread blocked on an event blocks no other.

The rules the bookkeeping relies on are checked at the virtual moment they matter, and a broken
one is recorded in :attr:`VirtualDevice.violations` (the test asserts it is empty):

- a block computes on its slot only after the copy into it has landed, and on its own bytes;
- a staging buffer goes back to the engine (or is refilled) only after the copy reading it ended;
- a slot is refilled only after every compute that read it has ended.

Copies also move real bytes (at once, in the host's order), so a model run through the real hooks
computes on the bytes the bookkeeping chose; with ``poison`` a returned staging buffer is poisoned
and discarded, as the threaded simulated device does.

:class:`VirtualEngine` stands in for the core engine with its workers in virtual time (fill =
bytes / fill rate, shared by the fills under way). :func:`predict_step` runs one schedule and
returns its steady step; ``bench/gpu_stream.py`` can print it beside measured figures.

Importable with ``tests/`` on ``sys.path``; needs only torch and trash_panda.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from trash_panda.offload.copy_pipeline import CopyPipeline

POISON = 0xFF  # all-ones bytes: NaN in every float dtype
EPS = 1e-12  # seconds: float noise in sums of virtual times
# The host's costs, guessed (no GPU has measured them yet): queueing one block's kernels with
# the hooks' bookkeeping around them, and queueing one copy or waking from one wait.
LAUNCH_S = 100e-6
CALL_S = 10e-6


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
    slot: int
    tag: Any  # what the host bytes held when it was queued (a block index, POISON, or None)


@dataclass
class _Slot:
    addr: int
    nbytes: int
    last: VCopy | None = None  # the latest copy queued into it
    read_until: float = 0.0  # the end of the latest compute queued that read it


@dataclass
class Compute:
    start: float
    end: float
    block: Any


class VirtualDevice:
    """Implements the ``Device`` protocol of :mod:`trash_panda.offload.copy_pipeline` in virtual time.

    ``scale``: virtual bytes per real byte, so that tiny real tensors stand for blocks of
    gigabytes. ``launch_s``: the host's time to queue one block's compute (:meth:`run_compute`);
    ``call_s``: to queue a copy, or to wake from a :meth:`wait`.
    """

    def __init__(
        self,
        link_bps: float,
        scale: float = 1.0,
        launch_s: float = LAUNCH_S,
        call_s: float = CALL_S,
        poison: bool = True,
    ) -> None:
        self.link_bps = link_bps
        self.scale = scale
        self.launch_s = launch_s
        self.call_s = call_s
        self.poison = poison
        self.now = 0.0  # the host's clock
        self.host = threading.get_ident()
        self.side: dict[int, float] = {}  # the clocks of other threads, by thread
        self.copy_free = 0.0  # when the copy stream has run everything queued on it
        self.compute_free = 0.0
        self.slots: list[_Slot] = []
        self.tags: dict[int, Any] = {}  # host address -> what it holds, where known
        self.reading: dict[int, list[VCopy]] = {}  # host address -> copies queued from it
        self.copies: list[VCopy] = []
        self.computes: list[Compute] = []
        self.violations: list[str] = []

    # The Device protocol.

    def empty(self, nbytes: int) -> torch.Tensor:
        t = torch.full((nbytes,), POISON, dtype=torch.uint8)
        self.slots.append(_Slot(t.data_ptr(), nbytes))
        return t

    def copy(self, dst: torch.Tensor, src: torch.Tensor, after: Any) -> VCopy:
        slot = self._slot_of(dst)
        s = self.slots[slot]
        start = max(self.now, self.copy_free, _time(after))
        end = start + src.numel() * src.element_size() * self.scale / self.link_bps
        if s.read_until > start + EPS:
            self._broken(f"slot {slot} refilled at {start:.6f} s while a block reads it until {s.read_until:.6f} s")
        addr = src.data_ptr()
        c = VCopy(VEvent(start), VEvent(end), addr, slot, self.tags.get(addr))
        self.copy_free = end
        self.now += self.call_s
        s.last = c
        self.reading.setdefault(addr, []).append(c)
        self.copies.append(c)
        dst.copy_(src)
        return c

    def compute_waits(self, event: Any) -> VEvent:
        # Marks where the compute stream reaches the wait, as CudaDevice's mark does.
        mark = VEvent(max(self.compute_free, self.now))
        self.compute_free = max(self.compute_free, _time(event))
        return mark

    def compute_done(self) -> VEvent:
        return VEvent(max(self.compute_free, self.now), self)

    def ready(self, event: Any) -> bool:
        return _time(event) <= self.now + EPS

    def wait(self, event: Any) -> None:
        self.move_clock(max(self.clock(), _time(event)) + self.call_s)

    def released(self, host: torch.Tensor, lease: Any) -> None:
        self._host_written(host.data_ptr(), "returned to the engine")
        if self.poison:
            host.fill_(POISON)
            # Unknown from here: a real engine's workers refill it without telling the device.
            self.tags.pop(host.data_ptr(), None)
            lease.discard()  # the engine stages the block again rather than reuse the poison

    def synchronize(self) -> None:
        self.now = max(self.now, self.copy_free, self.compute_free)

    # The threads' clocks.

    def clock(self) -> float:
        """The calling thread's clock: the host's ``now``, or another thread's own, which starts
        at 0 (it may act as early as what it waits for lets it)."""
        me = threading.get_ident()
        return self.now if me == self.host else self.side.get(me, 0.0)

    def move_clock(self, at: float) -> None:
        """Sets the calling thread's clock to ``at``."""
        me = threading.get_ident()
        if me == self.host:
            self.now = at
        else:
            self.side[me] = at

    # What the model and the engine tell the device.

    def run_compute(self, seconds: float, reads: torch.Tensor | None = None, block: Any = None) -> Compute:
        """Queues a block's compute of ``seconds`` on the compute stream, reading the slot that
        holds ``reads`` (a slot or a view into one) and expecting it to hold ``block``'s bytes
        (None: not checked); the host pays the launch cost and goes on."""
        start = max(self.compute_free, self.now)
        end = start + seconds
        if reads is not None:
            slot = self._slot_of(reads)
            s = self.slots[slot]
            last = s.last
            if last is None:
                self._broken(f"block {block} computes on slot {slot}, which no copy filled")
            elif block is not None and last.tag is not None and last.tag != block:
                self._broken(f"block {block} computes on slot {slot}, refilled with {last.tag!r} before it ran")
            elif last.done.t > start + EPS:
                lands = f"the copy into it lands at {last.done.t:.6f} s"
                self._broken(f"block {block} computes on slot {slot} at {start:.6f} s; {lands}")
            s.read_until = max(s.read_until, end)
        self.compute_free = end
        self.now += self.launch_s
        c = Compute(start, end, block)
        self.computes.append(c)
        return c

    def write(self, host: torch.Tensor, tag: Any, at: float) -> None:
        """The engine writes ``host`` at virtual time ``at``: ``tag`` is what it holds after."""
        self._host_written(host.data_ptr(), f"written at {at:.6f} s", at)
        self.tags[host.data_ptr()] = tag

    def _host_written(self, addr: int, what: str, at: float | None = None) -> None:
        at = self.now if at is None else at
        keep = []
        for c in self.reading.get(addr, []):
            if c.done.t > at + EPS:
                self._broken(f"staging buffer {addr:#x} {what} while a copy reads it until {c.done.t:.6f} s")
            elif c.done.t > self.now:
                keep.append(c)
        self.reading[addr] = keep

    def _slot_of(self, t: torch.Tensor) -> int:
        addr = t.data_ptr()
        for i, s in enumerate(self.slots):
            if s.addr <= addr < s.addr + s.nbytes:
                return i
        raise AssertionError(f"{addr:#x} is in no device slot")

    def _broken(self, what: str) -> None:
        self.violations.append(what)


def _time(event: Any) -> float:
    if event is None:
        return 0.0
    return float(event.done.t if isinstance(event, VCopy) else event.t)


EMPTY, FILLING, READY, LEASED = "empty", "filling", "ready", "leased"


@dataclass
class _Buffer:
    data: torch.Tensor
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


class VirtualLease:
    def __init__(self, engine: VirtualEngine, buffer: int, block: int) -> None:
        self.engine = engine
        self.buffer = buffer
        self.block = block
        self.discarded = False
        self.live = True

    def block_bytes(self) -> torch.Tensor:
        return self.engine.buffers[self.buffer].data

    def discard(self) -> None:
        self.discarded = True

    def release(self) -> None:
        if self.live:
            self.live = False
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
    """The part of the core engine that :class:`CopyPipeline` uses, with its workers in virtual
    time. It follows the rules of ``crates/trash-panda/src/stream`` (pool.rs ``plan``,
    ``pick_slot``, ``next_after``; worker.rs's loop; mod.rs ``acquire``; early.rs ``try_lease`` and
    ``advance``; lease.rs's return), so the pipeline meets the engine it meets on a GPU.

    Simplified: no failed stagings, no last pass (``next_blocks`` always wraps), no statistics
    beyond :class:`EngineCounts`. Every block has ``block_bytes``; a fill takes
    ``block_bytes / fill_bps`` alone, and fills under way share the rate evenly (the drive or the
    host's memory bandwidth is one resource). ``fill_bps`` None: fills are instant. ``direct``:
    every block is in the in-memory RAM tier, which the device copies from (``ram_image``) and
    the engine never stages ahead.
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
        self.buffers = [_Buffer(torch.zeros(real_bytes, dtype=torch.uint8)) for _ in range(count)]
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
        self.t = 0.0  # the workers' clock: never ahead of the host's outside acquire
        self.clock = 0
        self.counts = EngineCounts()
        self._plan_start()  # as set_order does when the hooks are installed

    # What CopyPipeline calls.

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
    pipeline: type[CopyPipeline] = CopyPipeline,
) -> dict[str, Any]:
    """The steady step of :class:`CopyPipeline` on the virtual device, for ``blocks`` streamed
    blocks of ``block_bytes`` run ``passes`` times (the first pass is left out of the figures).

    ``fill_bps``: the staging fill rate (a mapped RAM tier or the disk tier: every block goes
    through a staging buffer); None: the RAM tier is in private pinned memory, copied directly.
    ``buffers``: staging buffers and device slots, by default ``lookahead + 1`` as the plan has
    them. ``pipeline``: the bookkeeping to run (another revision's, to compare). Returns the step,
    its ideal (the largest of copy, compute, fill and the host's fixed costs per block), their
    ratio, the share of the steady window the link was busy, and the counts."""
    real = 256
    direct = fill_bps is None
    dev = VirtualDevice(link_bps, scale=block_bytes / real, launch_s=launch_s, call_s=call_s, poison=False)
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
        "violations": list(dev.violations),
    }
