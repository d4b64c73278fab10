"""What the device memory meter reads on a GPU (:class:`CudaGauge`): torch's caching allocator,
by its host-side counters and its history of alloc and free actions, never waiting for the
device and never resetting the peak a user may be measuring.

torch keeps one peak per device, which a window could only read by resetting it; a user
measuring their own peak around a pipeline would then read the meter's last window instead. So
the peak since a window's last event is replayed from the allocator's history: recorded by the
meter while a window is open (cleared at each reading, and read every half second by a thread of
its own so a long window does not overflow it), or read as the user records it, left as it is.
Where there is no history to read, a window's peak falls back to the counters read at its events
and to torch's peak where it rose, with a warning saying what that misses.
"""

from __future__ import annotations

import inspect
import threading
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["CudaGauge"]


def _block(size: int) -> int:
    """The bytes torch's caching allocator hands out for a request of ``size``: blocks of 512
    bytes at least. Its history records the request, its counters the block."""
    return max(512, -(-size // 512) * 512)


def _counters(index: int) -> tuple[int, int, int, int]:
    """Allocated and reserved bytes of GPU ``index`` now, and torch's peaks of both: the
    allocator's host-side bookkeeping, updated as the host allocates and frees, so exact
    without waiting for the device."""
    import torch

    stats = torch.cuda.memory_stats(index)
    return (
        int(stats.get("allocated_bytes.all.current", 0)),
        int(stats.get("reserved_bytes.all.current", 0)),
        int(stats.get("allocated_bytes.all.peak", 0)),
        int(stats.get("reserved_bytes.all.peak", 0)),
    )


def _parameters(fn: Callable[..., Any]) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def _fingerprint(entry: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(entry.get(k) for k in ("action", "addr", "size", "stream", "time_us"))


class _Replay:
    """One device's allocated and reserved bytes since its last mark, replayed from the
    allocator's history, and the most of each."""

    def __init__(self) -> None:
        self.allocated_at_mark = self.reserved_at_mark = 0
        self.allocated = self.reserved = 0
        self.top_allocated = self.top_reserved = 0
        self.peaks_at_mark = (0, 0)

    def mark(self, counters: tuple[int, int, int, int]) -> None:
        allocated, reserved, peak_allocated, peak_reserved = counters
        self.allocated_at_mark = self.allocated = self.top_allocated = allocated
        self.reserved_at_mark = self.reserved = self.top_reserved = reserved
        self.peaks_at_mark = (peak_allocated, peak_reserved)

    def replay(self, entries: list[dict[str, Any]]) -> None:
        allocated, reserved = self.allocated, self.reserved
        top_allocated, top_reserved = self.top_allocated, self.top_reserved
        for entry in entries:
            action = entry.get("action")
            if action == "alloc":
                allocated += _block(int(entry["size"]))
                top_allocated = max(top_allocated, allocated)
            elif action == "free_requested":
                # The block leaves the allocated bytes at the free call; "free_completed" only
                # puts it back in the pool once the other streams that used it are done.
                allocated -= _block(int(entry["size"]))
            elif action in ("segment_alloc", "segment_map"):
                reserved += int(entry["size"])
                top_reserved = max(top_reserved, reserved)
            elif action in ("segment_free", "segment_unmap"):
                reserved -= int(entry["size"])
        self.allocated, self.reserved = allocated, reserved
        self.top_allocated, self.top_reserved = top_allocated, top_reserved

    def anchor(self, counters: tuple[int, int, int, int]) -> None:
        """Goes on from the counters read right after the history: what the history does not
        say (a cached block handed out whole is larger than its request) does not pile up from
        one read to the next."""
        allocated, reserved, peak_allocated, peak_reserved = counters
        self.allocated, self.reserved = allocated, reserved
        self.top_allocated = max(self.top_allocated, allocated)
        self.top_reserved = max(self.top_reserved, reserved)
        # torch's peak above its level at the mark was reached since: it is the window's peak
        # as the allocator counts it (the only sight of one where the history was lost).
        if peak_allocated > self.peaks_at_mark[0]:
            self.top_allocated = max(self.top_allocated, peak_allocated)
        if peak_reserved > self.peaks_at_mark[1]:
            self.top_reserved = max(self.top_reserved, peak_reserved)

    def peak(self) -> int:
        return max(self.top_allocated, self.allocated_at_mark + self.top_reserved - self.reserved_at_mark)


_OFF, _OWN, _USER, _BLIND = "off", "own", "user", "blind"
_UNSET: Any = object()


class _History:
    """torch's caching allocator's history of its actions (``_record_memory_history``), read
    for every CUDA gauge at once.

    The recording is the process's, for every device, and so is clearing it: each read replays
    the new actions of every device into its open gauge, so that a read for one GPU loses
    nothing of another's. Where nobody records, the meter records while a window is open:
    without stack traces (the allocator then keeps a few bytes an action and calls no Python),
    leaving out the actions that do not move the counters where torch can, and clearing what it
    read after each read, and every ``drain_seconds`` on a thread besides, so that a long window
    keeps a short history; it stops at the last window's close. Where the user records their
    own, it is neither cleared nor stopped: each read takes the actions after the last one
    read, found again by its fingerprint (its ring of ``max_entries`` only drops its oldest).

    A read converts every action it gets to a Python dict, some microseconds each: those since
    the last read where the meter records, the user's whole history where they record, which is
    why a user's history longer than ``user_limit`` is not read at all.

    The counters are read right after the history, and the next replay starts from them: the
    allocator's rounding, which the history does not record, cannot drift the replay from one
    read to the next, and an action on another thread between the two reads is counted twice
    for a moment (an over-count), never lost.

    Where the history cannot be read (an allocator that keeps none, cudaMallocAsync; the user's
    wrapped past the last action read, cleared, or too long; the meter's own past
    ``max_entries`` between two reads), a window's peak is the highest of the counters read at
    its events and of torch's peak where it rose during the window: a transient that stays
    below an earlier peak of the process is missed, and a warning says so, once.
    """

    max_entries = 1 << 19  # the actions held between two reads at most, some hundred bytes each
    user_limit = 1 << 16
    drain_seconds = 0.5
    skipped = ("free_completed", "snapshot")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open: dict[int, _Replay] = {}
        self.mode = _OFF
        # The user's history: for each device, how many actions it held at the last read and
        # the fingerprint of the last.
        self.after: dict[int, tuple[int, tuple[Any, ...] | None]] = {}
        self.warned: set[str] = set()
        self.query: Any = _UNSET
        self.pool: Any = None
        self.drain: threading.Event | None = None

    def mark(self, index: int) -> None:
        """Starts GPU ``index``'s peak from now, opening it if it was not."""
        with self.lock:
            self.open.setdefault(index, _Replay())
            self._catch_up()
            self._record()
            self.open[index].mark(_counters(index))
            if self.mode == _OWN and self.drain is None and self.drain_seconds:
                stop = self.drain = threading.Event()
                threading.Thread(target=self._drain, args=(stop,), name="trash-panda meter", daemon=True).start()

    def peak(self, index: int) -> int:
        with self.lock:
            replay = self.open.get(index)
            if replay is None:
                return _counters(index)[0]
            self._catch_up()
            return replay.peak()

    def close(self, index: int) -> None:
        import torch

        with self.lock:
            self.open.pop(index, None)
            if self.open:
                return
            if self.drain is not None:
                self.drain.set()
                self.drain = None
            if self.mode == _OWN:
                torch.cuda.memory._record_memory_history(enabled=None)
            self.mode = _OFF
            self.after.clear()

    def _record(self) -> None:
        """Makes sure the history is recorded for the open windows, or says once why it cannot be."""
        import torch

        if self.mode == _BLIND:
            return
        get_backend = getattr(torch.cuda, "get_allocator_backend", None)
        backend = "native" if get_backend is None else str(get_backend())
        if backend != "native":
            self._blind("backend", f"the {backend} allocator keeps no history of its actions")
            return
        enabled = getattr(torch._C, "_cuda_isHistoryEnabled", None)
        if enabled is None:
            self._blind("unknown", "this torch does not say whether the history is being recorded")
            return
        if enabled():
            if self.mode == _OFF:  # the user's: read from its end on
                self.mode = _USER
                self._read_user()
            return
        try:
            self._restart()
        except Exception as e:  # an allocator that cannot record says so by raising
            self._blind("failed", f"recording it failed ({e})")
            return
        self.mode = _OWN

    def _restart(self) -> None:
        """Records the history from empty, without stack traces."""
        import torch

        record = torch.cuda.memory._record_memory_history
        options: dict[str, Any] = {
            "context": None,
            "stacks": "python",
            "max_entries": self.max_entries,
            "clear_history": True,
        }
        if "skip_actions" in _parameters(record):
            options["skip_actions"] = list(self.skipped)
        record("all", **options)

    def _catch_up(self) -> None:
        if not self.open:
            return
        got: dict[int, list[dict[str, Any]]] = {}
        if self.mode == _OWN:
            got = self._read_own()
        elif self.mode == _USER:
            got = self._read_user()
        for index, replay in self.open.items():
            replay.replay(got.get(index, []))
            replay.anchor(_counters(index))

    def _read_own(self) -> dict[int, list[dict[str, Any]]]:
        import torch

        if not torch._C._cuda_isHistoryEnabled():
            self._warn(
                "stopped",
                "the allocator's history that the device memory meter records was stopped by another caller; "
                + _MISSED
                + " (the meter records it again from the next window event)",
            )
            self.mode = _OFF
            return {}
        traces = self._traces()
        self._restart()
        got = {}
        for index, entries in enumerate(traces):
            if len(entries) >= self.max_entries:
                self._warn(
                    "wrapped",
                    f"more than {self.max_entries} allocator actions between two readings of the meter; " + _MISSED,
                )
                continue
            got[index] = entries
        return got

    def _read_user(self) -> dict[int, list[dict[str, Any]]]:
        import torch

        if not torch._C._cuda_isHistoryEnabled():
            self._warn(
                "user stopped",
                "the allocator's history recorded with torch.cuda.memory._record_memory_history() was stopped; "
                + _MISSED
                + " (the meter records its own from the next window event)",
            )
            self.mode = _OFF
            self.after.clear()
            return {}
        traces = self._traces()
        held = sum(len(t) for t in traces)
        if held > self.user_limit:
            self._blind(
                "long",
                f"the history recorded with torch.cuda.memory._record_memory_history() holds {held} actions, "
                f"too many to read at each window event (over {self.user_limit}; its max_entries keeps it shorter)",
            )
            return {}
        got = {}
        for index, entries in enumerate(traces):
            count, last = self.after.get(index, (0, None))
            start = 0
            if last is not None:
                if count <= len(entries) and _fingerprint(entries[count - 1]) == last:
                    start = count
                else:  # its ring wrapped: the last action read is further back, if still there
                    start = next(
                        (i + 1 for i in range(len(entries) - 1, -1, -1) if _fingerprint(entries[i]) == last), -1
                    )
            self.after[index] = (len(entries), _fingerprint(entries[-1]) if entries else None)
            if start < 0:
                self._warn(
                    "user wrapped",
                    "the allocator's history recorded with torch.cuda.memory._record_memory_history() dropped "
                    "actions the device memory meter had not read (its max_entries, or it was cleared); " + _MISSED,
                )
                continue
            got[index] = entries[start:]
        return got

    def _traces(self) -> list[list[dict[str, Any]]]:
        """Every device's recorded actions, oldest first."""
        import torch

        if self.query is _UNSET:
            self.query = self._query()
        query = self.query
        snapshot = torch.cuda.memory._snapshot() if query is None else torch._C._cuda_memorySnapshot(query)
        return list(snapshot.get("device_traces") or [])

    def _query(self) -> Any:
        """The snapshot's filter to an empty private pool: the history comes whole (its actions
        are not filtered by pool), without the segments of every allocation, which a snapshot
        otherwise converts to Python as well. None where this torch has no such filter."""
        import torch

        accepted = _parameters(torch.cuda.memory_snapshot)
        if "mempool_id" not in accepted or not hasattr(torch.cuda, "MemPool"):
            return None
        try:
            self.pool = torch.cuda.MemPool()
        except Exception:  # no pool, no filter: the whole snapshot is read
            return None
        ident = tuple(self.pool.id)
        return (*ident, True) if "include_traces" in accepted else ident

    def _drain(self, stop: threading.Event) -> None:
        while not stop.wait(self.drain_seconds):
            with self.lock:
                if stop.is_set() or self.mode != _OWN:
                    continue
                try:
                    self._catch_up()
                except Exception:  # the next window event makes the same read, and raises it there
                    return

    def _blind(self, key: str, why: str) -> None:
        self.mode = _BLIND
        self._warn(key, f"the device memory meter cannot read the allocator's history: {why}; " + _MISSED)

    def _warn(self, key: str, message: str) -> None:
        if key not in self.warned:
            self.warned.add(key)
            warnings.warn(f"the device memory meter's peaks may be low: {message}", stacklevel=2)


_MISSED = (
    "a window's peak is then the highest of the allocator's counters read at its events and of "
    "torch's peak where it rose during the window, which misses a transient below an earlier peak "
    "of the process (a plan from it may keep too little memory free)"
)
_HISTORY = _History()


class CudaGauge:
    """Memory of torch's caching allocator on one GPU, read without waiting for the device.

    ``current`` is what is allocated: a load or a release moves the windows' baselines by the
    tensors it left, exactly. ``peak`` is the larger of the allocated peak and what was
    allocated at the last reset plus the growth of reserved memory since: memory the allocator
    had cached at the reset and the window reused is in the allocated peak, and what it had to
    reserve on top (segments rounded up, fragments it could not reuse) in the growth. Both are
    replayed from the allocator's history since the reset (:class:`_History`): torch's own peak
    restarts only where it is reset, and it is the user's.

    The history records what each call asked for, and the replay counts the 512-byte blocks the
    allocator hands out for it; a cached block handed out whole because what would be left of
    it is small is larger still (by up to 1 MiB for a large one): that part of a transient
    inside a window is not in its allocated peak, though the reserved growth has it where the
    cache had to grow for it, and torch's peak where the window set a new one."""

    exact = True

    def __init__(self, device: torch.device, history: _History | None = None) -> None:
        self.device = device
        self.index = device.index or 0
        self.history = history if history is not None else _HISTORY

    def current(self) -> int:
        import torch

        return int(torch.cuda.memory_allocated(self.device))

    def peak(self) -> int:
        return self.history.peak(self.index)

    def reset(self) -> None:
        self.history.mark(self.index)

    def close(self) -> None:
        self.history.close(self.index)
