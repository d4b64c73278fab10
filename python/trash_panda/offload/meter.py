"""The peak memory of windows that may overlap: a stage's block, a measure_activation_vram() call.

torch's peak counter is one per device, and the private memory of the CPU is one per process,
so two windows open at once (``load_pipeline(chain=False)`` opens every component's stage) would
reset each other's peak, and each would count what the other's load added. One meter per device
instead folds the peak so far into every open window at each event (a window opening or closing,
a load or release starting or ending), and a load or a release moves the baseline of every open
window by what it left behind: another model's weights are not this one's activations. A load
made beside the windows, on another thread (``stage(overlap=True)``'s loader), cannot pause
them, since the activations go on meanwhile: it puts each tensor on the device through
:meth:`Meter.moved_in`, which moves the baselines by the tensor's bytes from then on.

On the CPU the meter reads private memory (anonymous pages), not the resident set: the pages of a
mapped checkpoint that a pass touches for the first time are the page cache's, which the system
takes back when it needs them, not memory the activations need.

On a GPU it reads torch's caching allocator, and counts what the allocator reserves as well as
what it hands out: the activations' segments are rounded up, and fragmentation can make it
reserve more than the allocated peak, memory the plan must leave free all the same. It reads the
allocator's host-side bookkeeping only, never waiting for the device: the counters are updated
when the host allocates and frees, so they are exact without draining the queued work (and a
loader's reading must not wait for the running model's compute). torch keeps one peak per
device, which a window could only read by resetting it, and a user measuring their own peak
around a pipeline would then read the meter's last window instead; so the windows' peaks come
from the allocator's history of its actions (:mod:`.allocator_history`), and torch's peak is left alone.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .. import _core
from .allocator_history import CudaGauge

if TYPE_CHECKING:
    import torch

__all__ = ["Meter", "Window", "measured", "meter_for", "paused"]


class Gauge(Protocol):
    """One device's memory counter."""

    # Whether a tensor put on the device adds its bytes to ``current`` exactly (torch's
    # allocator counts every tensor; the process's private memory grows only by the pages it
    # had to take from the system).
    exact: bool

    def current(self) -> int:
        """Bytes held now."""

    def peak(self) -> int:
        """The most bytes held since the last :meth:`reset`, now included. It never waits for
        the device: a loader reads it beside the running model, whose compute it must not wait
        for, and the meter's lock is held meanwhile."""

    def reset(self) -> None:
        """Starts a new peak from now."""

    def close(self) -> None:
        """Stops watching (no window is open)."""


class PrivateGauge:
    """The private memory of the process, sampled every millisecond on the core's thread."""

    exact = False

    def __init__(self) -> None:
        self.sampler: _core.RssSampler | None = None

    def current(self) -> int:
        return _core.private_memory()

    def peak(self) -> int:
        return self.sampler.peak() if self.sampler is not None else self.current()

    def reset(self) -> None:
        self.close()
        self.sampler = _core.RssSampler(1, private=True)

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None


@dataclass(eq=False)  # a window is itself: two with the same figures are not one
class Window:
    """One measured window: ``top`` is the most it needed above ``base`` so far.
    ``overlapped``: a load or release on another thread paused the meter while it was open
    (a pipeline sets its next stage up beside the running one): a peak of the window's own
    during that pause is not seen, so its ``top`` may be short of its real peak."""

    base: int
    top: int = 0
    thread: int = 0
    overlapped: bool = False


class Meter:
    """The windows open on one device; see the module."""

    def __init__(self, gauge: Gauge) -> None:
        self.gauge = gauge
        self.windows: list[Window] = []
        self._lock = threading.RLock()
        self._pauses = 0
        self._pauses_begun = 0  # pauses so far: moved_in() learns whether one overlapped it
        self._paused_at = 0

    def start(self) -> Window:
        with self._lock:
            self._fold()
            window = Window(self.gauge.current(), thread=threading.get_ident(), overlapped=self._pauses > 0)
            self.windows.append(window)
            self.gauge.reset()
            return window

    def stop(self, window: Window) -> int:
        """Closes ``window``; returns the most memory it needed above its baseline."""
        with self._lock:
            self._fold()
            self.windows.remove(window)
            if self.windows:
                self.gauge.reset()
            else:
                self.gauge.close()
            return window.top

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Around a load or a release: what it allocates or frees is nobody's activation memory."""
        with self._lock:
            if self._pauses == 0 and self.windows:
                self._fold()
                self._paused_at = self.gauge.current()
            self._pauses += 1
            self._pauses_begun += 1
            me = threading.get_ident()
            for w in self.windows:
                w.overlapped = w.overlapped or w.thread != me
        try:
            yield
        finally:
            with self._lock:
                self._pauses -= 1
                if self._pauses == 0 and self.windows:
                    moved = self.gauge.current() - self._paused_at
                    for w in self.windows:
                        w.base += moved
                    self.gauge.reset()

    def moved_in(self, put: Callable[[], int]) -> int:
        """Runs ``put``, which puts weights on the device and returns their bytes, from a thread
        that runs beside the open windows (``stage(overlap=True)``'s loader, one tensor at a
        time): the windows' peaks leave those bytes out. Returns what ``put`` returned.

        The bytes are subtracted, not the windows restarted once the loader is done: a restart
        would lose the activations of everything that ran while blocks were still being read
        (all of a model called once), and the next plan would keep too little memory free. They
        are subtracted from the readings after they arrived only: the peak so far is read
        first, then each window's baseline moves by them, and the peak of ``put``'s own time is
        read against the moved baseline. Weights that arrived before a window opened are in
        that window's baseline already and are not subtracted again.

        ``put`` runs outside the meter's lock: it may wait for the drive behind the running
        model's reads, and a window opening or closing on the compute thread must not wait for
        it. What can happen meanwhile only ever counts more, never less: a window that closes
        during ``put`` keeps the part of it that had arrived, one opened during it counts the
        part that arrives after, and when a pause (another model's load or release) overlaps
        it, the pause moves the windows by what arrived during it and the rest is counted; and
        any window's event during ``put`` reads the peak into every open window with what had
        arrived by then. That is one group of tensors (64 MiB, or one larger tensor) at most,
        and only at such an event; a put with no event during it is taken off exactly. The
        tensor counts as there for all of ``put``: exact when it is allocated at once and then
        filled (a copy to a GPU); where it arrives page by page (a read into the CPU's memory),
        activations that peak during the read are under-counted by what had not arrived yet,
        one tensor's bytes at most."""
        with self._lock:
            counting = bool(self.windows) and not self._pauses
            if counting:
                self._fold()
                self.gauge.reset()
            open_at_start = list(self.windows) if counting else []
            pauses_at_start = self._pauses_begun
            level = None if self.gauge.exact or not counting else self.gauge.current()
        nbytes = put()
        with self._lock:
            if open_at_start and not self._pauses and self._pauses_begun == pauses_at_start:
                # Private memory may grow by less than the tensors' bytes: glibc hands out pages
                # freed earlier and kept in its heap. Moving by more than it grew would take the
                # difference off the activations.
                moved = nbytes if level is None else max(0, min(nbytes, self.gauge.current() - level))
                for w in open_at_start:
                    if w in self.windows:
                        w.base += moved
                self._fold()
                self.gauge.reset()
        return nbytes

    def freed_beside(self, free: Callable[[], int]) -> int:
        """Runs ``free``, which frees weights of a model that is not the one computing (a
        pipeline's idle stage giving back blocks, from the thread that sets the next stage up)
        and returns their bytes on this device: the windows' baselines move down by them. A
        pause would instead move them by all that changed meanwhile, the computing stage's own
        activations with it. The peak of ``free``'s own time is not read (it starts above
        where it ends); it takes milliseconds, and runs under the meter's lock."""
        with self._lock:
            # Under the lock (a free takes milliseconds): a window opening meanwhile would read
            # its baseline before the drop and miss its activations by the bytes freed.
            self._fold()
            open_at_start = list(self.windows)
            nbytes = free()
            for w in open_at_start:
                w.base -= nbytes
            if self.windows:
                self.gauge.reset()
        return nbytes

    def _fold(self) -> None:
        if not self.windows or self._pauses:
            return
        peak = self.gauge.peak()
        for w in self.windows:
            w.top = max(w.top, peak - w.base)


_METERS: dict[str, Meter] = {}
_METERS_LOCK = threading.Lock()


def meter_for(device: torch.device) -> Meter:
    """The one meter of ``device`` (each GPU its own; the CPU one for the process)."""
    import torch

    key = "cpu" if device.type != "cuda" else str(torch.device("cuda", device.index or 0))
    with _METERS_LOCK:
        meter = _METERS.get(key)
        if meter is None:
            gauge: Gauge = PrivateGauge() if key == "cpu" else CudaGauge(torch.device(key))
            meter = _METERS[key] = Meter(gauge)
        return meter


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Pauses every device's meter (a load or release touches host and device memory both)."""
    with _METERS_LOCK:
        meters = list(_METERS.values())
    with contextlib.ExitStack() as stack:
        for meter in meters:
            stack.enter_context(meter.paused())
        yield


@contextlib.contextmanager
def measured(device: torch.device) -> Iterator[list[int]]:
    """A window on ``device``: its peak above the start, in ``[0]`` once it closes, and in
    ``[1]`` (1 or 0) whether a load or release on another thread overlapped it (see
    :class:`Window`)."""
    meter = meter_for(device)
    window = meter.start()
    out = [0, 0]
    try:
        yield out
    finally:
        out[0] = meter.stop(window)
        out[1] = int(window.overlapped)
