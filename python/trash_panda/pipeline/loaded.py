"""One stage of a pipeline as the runner holds it: loaded ahead of its turn into the memory free
beside the running stage, started, fed by a final pass, stopped.

A stage loaded ahead has its plan made for the memory predicted free at its start. Its weights
outside the blocks and its resident blocks are read by a loader thread in its run order, each
taking its bytes from an allowance (``_core.Allowance``) that starts at what is free now and
grows as the running stage gives memory back; nothing of it is read on the caller's thread. At
its turn the allowance opens and the plan is checked against the memory really free
(``_core.replan``); a block called before its weights are in waits for them, as with
``overlap=True``.
"""

from __future__ import annotations

import functools
import os
import queue
import threading
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import _core
from ..errors import StreamError
from ..plan import free_vram

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch
    from torch import nn

    from ..checkpoint import Checkpoint
    from ..offload.final_pass import FinalPass
    from ..offload.handle import OffloadHandle
    from ..offload.order import OrderChoice
    from ..offload.overlap import ResidentLoader
    from ..offload.state import BlockState, ModelState
    from ..plan import Plan
    from .pace import Pacer

__all__ = ["LoadedStage", "free_now", "load_stage"]


def _to_system(free: Callable[[], int], pages: _core.PagePool | None) -> int:
    """Runs ``free`` (which returns the bytes it freed); returns those of them the system got
    back: less what ``pages`` kept for the next reads."""
    if pages is None:
        return free()
    kept = pages.idle_bytes
    freed = free()
    return max(0, freed - (pages.idle_bytes - kept))


def free_now(device: torch.device) -> _core.Free:
    """The memory free now, as a plan made now would count it."""
    return _core.Free.probe(free_vram(device))


@dataclass
class LoadedStage:
    """A stage's model while the pipeline holds it."""

    name: str
    model: nn.Module
    plan: Plan
    handle: OffloadHandle
    choice: OrderChoice
    holds: _core.Holds  # what it holds once fully loaded, by its plan
    predicted: _core.Free  # the free memory its plan was made for
    allowance: _core.Allowance | None  # None: loaded at its turn, nothing to gate
    key: str = ""  # what its peak activation memory is remembered under
    file_bytes: int = 0  # its checkpoint's size
    cached_at_load: int = 0  # of those, in the page cache when its load began
    runs: int = 0  # runs it took part in
    last_used: int = 0  # the pipeline's count of stage starts at its last start
    freed: int = 0  # bytes its final pass handed to the next stage so far
    final: bool = False  # a final pass ran in its last run
    to_give: int = 0  # bytes of its blocks to give back at its end (the next stage needs them)
    release_after: bool = False  # released at its end: all of it is needed, or keeping is off
    given: list[BlockState] = field(default_factory=list)  # blocks given back, to read again
    given_back: int = 0  # their bytes, as its plan counts them
    read_again: int = 0  # bytes read again at its last start
    pacer: Pacer | None = None  # while it runs with the next stage read beside it (pace.py)
    _feeder: threading.Thread | None = field(default=None, repr=False)
    _final: FinalPass | None = field(default=None, repr=False)  # the pass fed from, while it counts

    @property
    def state(self) -> ModelState:
        """What its load left on the model (the hooks' view of it)."""
        from ..offload.state import get_state

        state = get_state(self.model)
        assert state is not None, f"stage {self.name} is not loaded"
        return state

    @property
    def loader(self) -> ResidentLoader | None:
        """Its overlap loader, while its hook is on (the model's state holds it)."""
        return self.state.loader

    def pending(self) -> _core.Holds:
        """What its loader has still to read, in the memory the blocks compute in (VRAM with
        a GPU, else RAM)."""
        left = 0 if self.loader is None else max(0, self.loader.remaining_bytes)
        return self.holds_in(left)

    def held_now(self) -> _core.Holds:
        """What it holds now: what it has :meth:`committed` less what its loader has still to
        read."""
        return self.committed().less(self.pending())

    def committed(self) -> _core.Holds:
        """What it holds once the reads it has begun are in: its plan's figures less what it
        gave back. The pipeline counts this, not :meth:`held_now`, as taken: a stage whose reads
        are still coming (read ahead for a turn a run skipped, say) has their memory promised."""
        return self.holds.less(self.holds_in(self.given_back))

    def holds_in(self, n: int) -> _core.Holds:
        """``n`` bytes of the memory its blocks compute in (the core's rule)."""
        return self.holds.in_compute_memory(n)

    def sheddable(self) -> int:
        """Bytes of its resident blocks it still holds and could give back."""
        gone = {b.index for b in self.given}
        return _core.resident_among(self.plan, [b.prefix for b in self.state.blocks if b.index not in gone]).bytes

    def give_back(self, nbytes: int) -> int:
        """Gives back resident blocks, those that run last first, until ``nbytes`` are free
        (the next run reads them again behind the first blocks' compute); returns the bytes
        given, as its plan counts them."""
        from ..offload.final_pass import free_idle_blocks
        from ..offload.meter import meter_for

        unread = self._stop_reading_ahead()
        total = unread
        if self.loader is not None:
            self.loader.finish()  # a block still to be read is not given back while it arrives
        # Which blocks go, as the core decides: those run last first, until the bytes are free.
        shed = _core.give_back(
            self.plan, [b.prefix for b in self._run_order()], [b.prefix for b in self.given], nbytes, counted=unread
        )
        by_prefix = {b.prefix: b for b in self.state.blocks}
        chosen = [by_prefix[p] for p in shed.blocks]
        total += shed.bytes
        # What it frees is not the running stage's: its window's baseline moves down by what
        # went back to the system (the pages a pipeline's pool keeps are still the process's).
        lane = self.state.lane
        free = functools.partial(free_idle_blocks, self.handle, chosen)
        meter_for(self.state.device).freed_beside(functools.partial(_to_system, free, lane.pages if lane else None))
        self.given += chosen
        self.given_back += total - unread
        return total

    def _stop_reading_ahead(self) -> int:
        """Stops reading given-back blocks again ahead of its turn when the reads wait for
        memory that has not come (its turn was skipped, and the stage that was to free it did
        not): waiting for them would never end. The blocks not read stay given back, to be
        read at its turn. Returns their bytes, as its plan counts them."""
        loader, allowance = self.loader, self.allowance
        if loader is None or loader.done or allowance is None or allowance.is_open:
            return 0
        loader.close()
        self.allowance = None
        unread = [b for b in loader.blocks if b.index in loader.errors]
        nbytes = _core.resident_among(self.plan, [b.prefix for b in unread]).bytes
        self.given += unread
        self.given_back += nbytes
        self.read_again -= nbytes
        return nbytes

    def passed(self) -> int:
        """The blocks its last final pass freed are given back; returns their bytes as its plan
        counts them."""
        prefixes = self._final.freed if self._final is not None else []
        self._final = None
        shed = _core.resident_among(self.plan, list(prefixes))
        by_prefix = {b.prefix: b for b in self.state.blocks}
        self.given += [by_prefix[p] for p in shed.blocks]
        self.given_back += shed.bytes
        return shed.bytes

    def refill(self, allowance: _core.Allowance | None) -> int:
        """Reads its given-back blocks again on a loader thread, in its run order, through
        ``allowance`` when it is read ahead of its turn (None: at its turn); a call waits for
        a block not read yet. Returns the bytes it reads."""
        from ..offload.final_pass import taken_back
        from ..offload.overlap import OverlapWait, start_loader

        taken_back(self.handle)  # a pass's freed blocks of the RAM tier map their pages again
        if not self.given:
            return 0
        self.handle.hooks.remove(OverlapWait.name)  # the first load's, done: stops nothing
        blocks, self.given = self.given, []
        # Every block given back was resident: the core's costs count each its stored bytes.
        read = _core.read_costs(
            self.plan, self.state.config, [b.prefix for b in blocks], outside=False, ram_tier=False, gpu=False
        )
        costs = {("block", b.index): n for b, n in zip(blocks, read.blocks, strict=True)}
        start_loader(self.handle, self.state, blocks, self.choice.first, allowance=allowance, costs=costs)
        self.allowance = allowance
        self.read_again, self.given_back = self.given_back, 0
        return self.read_again

    def _run_order(self) -> list[BlockState]:
        blocks = self.state.blocks
        order = _core.full_order(self.choice.first or [], [b.prefix for b in blocks])
        return [blocks[i] for i in order]

    def begin_turn(self, tick: int, keep: bool) -> None:
        """Its turn starts, the ``tick``-th stage start of the pipeline: nothing asked of it
        yet; ``keep``: it may stay loaded after the turn."""
        self.runs += 1
        self.last_used = tick
        self.to_give, self.release_after, self.final = 0, not keep, False

    def release_at_end(self) -> None:
        """All it holds is needed elsewhere (or it cannot stay): released as its turn ends."""
        self.release_after = True

    def give_at_end(self, nbytes: int) -> None:
        """``nbytes`` of its blocks go to the stage after it as its turn ends (its final pass
        frees them sooner)."""
        self.to_give = nbytes

    def take_read_again(self) -> int:
        """The bytes read again ahead of this turn (given back since its last run), once."""
        read, self.read_again = self.read_again, 0
        return read

    def start(self, free: _core.Free) -> tuple[_core.Free, _core.Replan | None]:
        """Its turn, with ``free`` free now: the allowance stops limiting, and the plan is
        checked against that memory with what it holds already counted as free, as its plan
        counted it. Returns that memory and why to plan again (None: keep the plan)."""
        if self.allowance is not None:
            self.allowance.open()
        if self.state.lane is not None:
            self.state.lane.priority = _core.Priority.RUN
        actual = free.after_release(self.held_now())
        return actual, _core.replan(self.predicted, actual)

    def feed(self, final: FinalPass, to: _core.Allowance | None) -> None:
        """During a final pass, gives each freed block's bytes to the next stage's allowance
        from a thread of its own, once the block's device work is done (its CUDA event), so
        the compute thread never waits for the next stage's reads."""
        self._final = final

        def run() -> None:
            while True:
                try:
                    freed = final.events.get(timeout=0.05)
                except queue.Empty:
                    if not final.active:
                        return
                    continue
                # Only what the stage's Holds counts moves: a resident block's memory. A mapped
                # RAM-tier block's pages are the page cache, which free memory counts already.
                if freed.tier != _core.Tier.DEVICE:
                    continue
                if freed.event is not None:
                    freed.event.synchronize()
                self.freed += freed.bytes
                if to is not None:
                    to.give(freed.bytes)

        self._feeder = threading.Thread(target=run, name=f"trash-panda-handover-{self.name}", daemon=True)
        self._feeder.start()

    def stop_feeding(self) -> None:
        """Waits for the feeder to hand over every event of the closed final pass."""
        if self._feeder is not None:
            self._feeder.join()
            self._feeder = None

    def park(self) -> bool:
        """Its turn ended: the copies out of the shared staging pool are waited for and their
        leases returned, and the engine gives the pool back for the next stage (what it staged
        ahead is staged again at its next turn). Nothing for an engine with buffers of its own.
        False (and a warning) when a lease is still out: the stage must be released, which
        gives the pool back with its last lease."""
        state = self.state
        if state.engine is None or state.staging_pool is None or state.engine.closed:
            return True
        park = getattr(self.handle.backend, "park", None) if self.handle is not None else None
        if park is not None:
            park()
        try:
            state.engine.park()
        except StreamError as e:
            warnings.warn(f"stage {self.name}: {e}; it is released", RuntimeWarning, stacklevel=3)
            return False
        return True

    def close(self) -> None:
        """Stops its loader before a release (which fails a read waiting for the allowance)."""
        self.stop_feeding()
        if self.loader is not None:
            self.loader.close()


def load_stage(
    name: str,
    model: nn.Module,
    ckpt: Checkpoint,
    plan: Plan,
    predicted: _core.Free,
    *,
    device: torch.device,
    order: list[str] | None,
    destination: str | os.PathLike[str] | None,
    shared: dict[str, object],
    key: str,
    ahead: bool,
    staging_pool: _core.StagingPool | None = None,
    direct: bool = False,
    pages: _core.PagePool | None = None,
) -> LoadedStage:
    """Loads ``model`` by ``plan`` with its resident blocks on a loader thread, as
    ``stage(overlap=True)`` does; ``ahead`` (a stage read while another runs) puts every read
    behind an allowance that starts empty, for the caller to fill. On an error the model is
    left unloaded. ``staging_pool`` (the pipeline's) is its engine's staging buffers where its
    plan counted it. ``direct``: its reads go past the page cache. ``pages``: the pipeline's
    pool its tensors are read into."""
    from ..offload.hooked import load_and_hook

    path = ckpt.files[0] if len(ckpt.files) == 1 else os.path.dirname(ckpt.files[0])
    file_bytes = sum(os.path.getsize(f) for f in ckpt.files)
    cached = sum(_core.cached_bytes(f) for f in ckpt.files)
    gate = _core.Allowance(name, 0) if ahead else None
    loaded = load_and_hook(
        model,
        ckpt,
        plan,
        path,
        order=order,
        destination=destination,
        overlap=True,
        load_kwargs={
            "device": device,
            **shared,
            **({} if staging_pool is None else {"staging_pool": staging_pool, "holder": name}),
            "direct": direct,  # the pipeline's rule, not one stage's plan's
            "pages": pages,
        },
        allowance=gate,
    )
    holds = plan.holds(name)
    return LoadedStage(name, model, plan, loaded.handle, loaded.choice, holds, predicted, gate, key, file_bytes, cached)
