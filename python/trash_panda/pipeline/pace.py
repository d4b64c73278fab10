"""Reading ahead only where it pays: the ``pace`` hook on a pipeline's running stage times each
block's compute, with the next stage's reads in flight and without, and the core's
:class:`~trash_panda._core.Pace` weighs the compute they cost against what the same bytes take
to read with nothing beside them. Where reading ahead loses, the hook holds the read-ahead's
allowance: the rest of that stage is read at its start, as without read-ahead.

Until it has one quiet pass of the running stage to compare with (at most :data:`QUIET_WAIT`
seconds of quiet runs, or :data:`QUIET_LIMIT` in all), the read-ahead waits: once it reads,
every run is beside it. Runs beside the running stage's own loads are not counted either way.
What a read takes alone is the rate its own load reached, read at its start while little
computed beside it. On the CPU only: on a GPU a block's time on the host is its kernels' launch,
not their compute.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from .. import _core
from ..offload.registry import BlockHook

if TYPE_CHECKING:
    from ..offload.overlap import ResidentLoader
    from ..offload.state import BlockState

__all__ = ["QUIET_LIMIT", "QUIET_WAIT", "Pacer", "Rates"]

# Seconds of quiet runs the read-ahead waits for, at most, before it reads.
QUIET_WAIT = 0.5
# Seconds it waits in all for quiet runs (the running stage's own load may be under way).
QUIET_LIMIT = 3.0


class Rates:
    """The loads at a stage's start in this pipeline, (bytes, seconds) each: what a read takes
    with (almost) nothing beside it, as each pacer's ``Pace`` weighs them."""

    def __init__(self) -> None:
        self.loads: list[tuple[int, float]] = []


def _spans(loader: ResidentLoader | None) -> tuple[int, int]:
    return (0, 0) if loader is None else (loader.reads_begun, loader.reads_ended)


class Pacer(BlockHook):
    """The ``pace`` block hook of a running stage of ``blocks`` blocks, ``own`` its loader (None
    once everything of it was read); ``measures_drive``: it was read at its start, so its
    load's rate is what a read takes with little beside it. :meth:`watch` adds the read-ahead."""

    name = "pace"

    def __init__(self, blocks: int, own: ResidentLoader | None, rates: Rates, *, measures_drive: bool = True) -> None:
        self.pace = _core.Pace(blocks)
        self.own = own
        self.rates = rates
        self.measures_drive = measures_drive
        for nbytes, seconds in rates.loads:
            self.pace.note_load(nbytes, seconds)
        self.ahead: ResidentLoader | None = None
        self.allowance: _core.Allowance | None = None
        self.verdict: _core.PaceVerdict | None = None
        self.paused = False
        self._quiet_hold = False  # held until a quiet pass is known
        self._quiet_since: float | None = None
        self._started = 0.0
        self._own0 = (0, 0)
        self._ahead0 = (0, 0)
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self.clock = time.perf_counter

    def watch(self, ahead: ResidentLoader, allowance: _core.Allowance) -> None:
        """From the read-ahead's thread, before its reads get memory: times from now on are
        weighed against ``ahead``'s reads, and it waits for a quiet pass if none is known."""
        with self._lock:
            self.ahead, self.allowance = ahead, allowance
            if self.pace.wants_quiet:
                allowance.hold()
                self._quiet_hold = True
                self._timer = threading.Timer(QUIET_LIMIT, self._end_quiet_hold)
                self._timer.daemon = True
                self._timer.start()

    def pre_forward(self, block: BlockState) -> None:
        self._own0, self._ahead0 = _spans(self.own), _spans(self.ahead)
        self._started = self.clock()

    def post_forward(self, block: BlockState) -> None:
        seconds = self.clock() - self._started
        own, ahead = _spans(self.own), _spans(self.ahead)
        if own[0] > self._own0[1]:
            return  # its own load read beside it: neither quiet nor the read-ahead's cost
        if self.measures_drive and self.own is not None and self.own.done:
            load = (self.own.loaded_bytes, self.own.load_seconds)
            self.rates.loads.append(load)
            self.pace.note_load(*load)
            self.measures_drive = False  # once: its load is over
        busy = ahead[0] > self._ahead0[1]
        self.pace.ran(block.index, seconds, busy)
        if self._quiet_hold:
            self._after_quiet_run()
            return
        if not busy or self.ahead is None or self.paused:
            return
        self.pace.set_read(self.ahead.loaded_bytes)
        if self.pace.choice == _core.PaceChoice.PAUSE and self.allowance is not None:
            self.verdict = self.pace.verdict()
            self.paused = True
            self.allowance.hold()

    def _after_quiet_run(self) -> None:
        now = self.clock()
        if self._quiet_since is None:
            self._quiet_since = self._started  # from the first quiet run's start
        if not self.pace.wants_quiet or now - self._quiet_since > QUIET_WAIT:
            self._end_quiet_hold()

    def _end_quiet_hold(self) -> None:
        with self._lock:
            if self._quiet_hold and self.allowance is not None:
                self._quiet_hold = False
                self.allowance.resume()

    def close(self) -> None:
        # The stage's turn is over: a hold for quiet runs must not outlast it (a pause stays
        # until the next stage's start opens its allowance), nor its timer: a timer thread still
        # waiting when the interpreter exits is woken into a finalizing runtime, which aborts
        # the process.
        self._end_quiet_hold()
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
            timer.join()

    def beside(self) -> _core.PaceVerdict | None:
        """What the read-ahead cost this stage's compute, for its record (None: nothing was
        read beside it)."""
        if self.ahead is None or self.ahead.loaded_bytes == 0:
            return None
        if self.verdict is None:  # not paused: what it weighs now
            self.pace.set_read(self.ahead.loaded_bytes)
            return self.pace.verdict()
        return self.verdict
