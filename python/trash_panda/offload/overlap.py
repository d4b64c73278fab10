"""stage(overlap=True): the resident blocks are read on a worker thread, one at a time in run
order, while the model starts; a block that starts before its weights arrive waits for them.

Each block is read by large calls of the core (``_core.read_block``: the block's tensors and
scales, grouped by file, without the GIL), then kept as stream_load's ``materialize`` keeps it.
The reads wait in the model's lane of its drive's read queue with the engine's
(``_core.ReadLane``, made by stream_load), ranked by when their block runs: a block the model
needs now is never read behind one it needs later. With an order
file that places the weights outside the blocks (:mod:`.outside`), those needed after the first
block are read here too, before the block at their place, and the module that needs them waits
for them as a block does.

What is read is put on the device through the device's meter (:meth:`.meter.Meter.moved_in`):
a stage's measured peak is its activations without the weights read meanwhile, and the next plan
of its key uses it, as without overlap. On a device with memory of its own the copies go on the
loader's own stream from pinned memory (:mod:`.loader_copies`), and a block's first compute waits
for its copies' event. A block whose load failed raises, in the call that needs it, an error
naming the block and the cause.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from ..errors import StreamError
from ..settings import setting
from .meter import meter_for
from .outside import load_now, load_outside
from .reads import block_groups, read_group, through_host
from .registry import BlockHook

if TYPE_CHECKING:
    import torch
    from torch import nn

    from .. import _core
    from .backends.loader_copies import LoaderCopies
    from .handle import OffloadHandle
    from .registry import HookRegistry
    from .state import BlockState, ModelState, TensorSpec

__all__ = ["OverlapWait", "ResidentLoader", "load_block", "start_loader"]


def load_block(
    block: BlockState,
    device: torch.device,
    storage: str | None,
    threads: int,
    lane: _core.ReadLane | None = None,
    position: int | None = None,
    copies: LoaderCopies | None = None,
) -> None:
    """Reads one resident block to the device in its stored form (or the storage dtype), as
    stream_load does, in large reads of the core through ``lane`` as the block at ``position``
    of the run order, each put on the device through its meter.

    On the CPU the tensors read are the block's weights: one read for the whole block, inside
    the meter's window. On a device with memory of its own (``copies``) they pass through host
    memory on their way, so the reads are grouped to hold at most the block's largest tensor (or
    64 MiB) there at once, and the meter's window around each tensor is only its copy, for which
    the tensor is allocated at once; the block's event is its last copy's."""
    meter = meter_for(device)
    for group in block_groups(block, copies):
        if copies is None:
            meter.moved_in(functools.partial(read_group, group, device, storage, threads, lane, position))
        else:
            through_host(group, device, storage, threads, lane, position, copies)
    if copies is not None:
        copies.done(("block", block.index))


@dataclasses.dataclass(frozen=True)
class LoaderReads:
    """What the loading of a staged model calls to read: a resident block (:func:`load_block`),
    the outside weights of a position in the run order (:func:`.outside.load_outside`), and those
    needed before the first call (:func:`.outside.load_now`). A loader takes the ones current as
    it is made; :func:`reading_with` puts others in (a test's slow or failing read)."""

    block: Callable[..., None] = load_block
    outside: Callable[..., None] = load_outside
    now: Callable[..., None] = load_now


_reads = LoaderReads()


def loader_reads() -> LoaderReads:
    """The reads a loader made now takes."""
    return _reads


@contextlib.contextmanager
def reading_with(**replaced: Callable[..., None]) -> Iterator[LoaderReads]:
    """Within the block, loaders made (and loads begun) read with ``replaced`` (``block``,
    ``outside``, ``now``) instead of the current ones."""
    global _reads
    before = _reads
    _reads = dataclasses.replace(before, **replaced)
    try:
        yield _reads
    finally:
        _reads = before


class ResidentLoader:
    """The worker thread and one ready mark per block it loads (and per position of the run
    order where outside weights are loaded: ``outside``, see :mod:`.outside`)."""

    def __init__(
        self,
        blocks: list[BlockState],
        device: torch.device,
        storage: str | None,
        lane: _core.ReadLane | None = None,
        positions: dict[int, int] | None = None,
        outside: dict[int, list[TensorSpec]] | None = None,
        allowance: _core.Allowance | None = None,
        costs: dict[tuple[str, int], int] | None = None,
        engine: _core.Engine | None = None,
        copies: LoaderCopies | None = None,
        ram_tier_arrived: Callable[[], None] | None = None,
        reads: LoaderReads | None = None,
    ) -> None:
        self.blocks = blocks
        self.reads = reads or loader_reads()
        self.lane = lane  # the model's, shared with the engine: one order for the drive
        self.positions = positions or {}  # a block's index -> its position in the run order
        self.device = device
        self.storage = storage
        self.threads = max(1, int(setting("ram_threads")))
        self.ready = {b.index: threading.Event() for b in blocks}
        self.errors: dict[int, BaseException] = {}
        # Outside weights by the position of the run order before which they are needed.
        self.outside = dict(sorted((outside or {}).items()))
        self.outside_ready = {at: threading.Event() for at in self.outside}
        self.outside_errors: dict[int, BaseException] = {}
        self.stopping = threading.Event()
        # What each block (("block", index)) and group of outside weights (("outside",
        # position)) holds once read, by the plan; a stage read ahead of its turn takes it from
        # the allowance before the read.
        self.allowance = allowance
        self.costs = costs or {}
        self.remaining_bytes = sum(self.costs.values())  # of the costs, those not read yet
        # A stage read ahead: its RAM tier held in memory is read last, here (None: read by
        # the load, or mapped).
        self.engine = engine
        # A device with memory of its own: the copies there, and what to tell once the RAM
        # tier read last is in memory (the device pins it then).
        self.copies = copies
        self.ram_tier_arrived = ram_tier_arrived
        self.load_seconds = 0.0  # the loader's time, first block to last
        self.waited_seconds = 0.0  # the main thread's waits for blocks not yet loaded
        self.loaded_bytes = 0
        # Reads begun and ended: one was in flight during a span of time when, at its end, more
        # had begun than had ended at its start (a pipeline times the running stage's blocks
        # with and without reads beside them: pipeline/pace.py).
        self.reads_begun = 0
        self.reads_ended = 0
        self._thread = threading.Thread(target=self._run, name="trash-panda-loader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        start = time.perf_counter()
        pending = list(self.outside)  # positions, in run order
        for block in self.blocks:
            position = self.positions.get(block.index)
            # Outside weights needed before this block (or one before it) are read first.
            while pending and position is not None and pending[0] <= position:
                self._load_outside(pending.pop(0))
            try:
                if self.stopping.is_set():
                    raise StreamError("the stage ended before it was loaded")
                self._take(("block", block.index))
                with self._reading():
                    self.reads.block(block, self.device, self.storage, self.threads, self.lane, position, self.copies)
                # `work` is fixed by the load (resident weights to expand each run, or none).
                block.mark_loaded()
                self.loaded_bytes += sum(s.info.nbytes for s in block.tensors)
            except BaseException as e:  # reported in the call that needs the block
                self.errors[block.index] = _detached(e)
            finally:
                self.remaining_bytes -= self.costs.get(("block", block.index), 0)
                self.ready[block.index].set()
        for at in pending:
            self._load_outside(at)
        if self.engine is not None and not self.stopping.is_set():
            self._load_ram_tier(self.engine)
        if self.copies is not None:
            # Done means on the device: whoever waits for the thread (a release, a give-back)
            # may then free or move what it copied.
            try:
                self.copies.finish()
            except BaseException as e:  # the device failed: the blocks' own waits raise it
                for index in self.ready:
                    self.errors.setdefault(index, _detached(e))
        self.load_seconds = time.perf_counter() - start

    def _load_ram_tier(self, engine: _core.Engine) -> None:
        """Reads the RAM tier into memory through the engine's lane; a failure is left to the
        first block that needs it, whose staging reads it again and raises there."""
        try:
            self._take(("ram_tier", 0))
            if not engine.closed:
                with self._reading():
                    engine.load_ram_tier()
        except Exception:  # the block that needs it reads it again and raises there
            return
        finally:
            self.remaining_bytes -= self.costs.get(("ram_tier", 0), 0)
        if self.ram_tier_arrived is not None:
            self.ram_tier_arrived()

    def _load_outside(self, at: int) -> None:
        specs = self.outside[at]
        try:
            if self.stopping.is_set():
                raise StreamError("the stage ended before they were loaded")
            self._take(("outside", at))
            with self._reading():
                self.reads.outside(specs, self.device, self.threads, self.lane, at, self.copies)
            self.loaded_bytes += sum(s.info.nbytes for s in specs)
        except BaseException as e:  # reported in the call that needs them
            self.outside_errors[at] = _detached(e)
        finally:
            self.remaining_bytes -= self.costs.get(("outside", at), 0)
            self.outside_ready[at].set()

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        self.reads_begun += 1
        try:
            yield
        finally:
            self.reads_ended += 1

    def _take(self, what: tuple[str, int]) -> None:
        """Waits (without the GIL) for the memory of ``what`` in the allowance, if it has one."""
        cost = self.costs.get(what, 0)
        if self.allowance is not None and cost:
            self.allowance.take(cost)

    def _until(self, ready: threading.Event) -> None:
        """Waits for ``ready``, counting the wait as the main thread's."""
        if not ready.is_set():
            start = time.perf_counter()
            ready.wait()
            self.waited_seconds += time.perf_counter() - start

    def wait_outside(self, name: str, at: int) -> None:
        """Blocks the caller until the outside weights needed at position ``at`` (and so every
        one before) are loaded, for module ``name``; raises if their load failed."""
        ready = self.outside_ready.get(at)
        if ready is None:
            return
        self._until(ready)
        error = next((e for p, e in self.outside_errors.items() if p <= at), None)
        if error is not None:
            raise StreamError(
                f"module {name} could not be loaded by stage(overlap=True)'s loader thread: {error}"
            ) from error
        if self.copies is not None:  # the copies of every position up to it, on one stream
            self.copies.waits(("outside", at))

    def advance(self, block: BlockState) -> None:
        """``block`` runs now: the reads waiting in the lane rank from it."""
        position = self.positions.get(block.index)
        if self.lane is not None and position is not None:
            self.lane.advance(position)

    def wait(self, block: BlockState) -> None:
        """Blocks the caller until ``block`` is loaded; raises if its load failed. Blocks the
        loader does not hold return at once."""
        ready = self.ready.get(block.index)
        if ready is None:
            return
        self._until(ready)
        error = self.errors.get(block.index)
        if error is not None:
            raise StreamError(
                f"block {block.prefix} could not be loaded by stage(overlap=True)'s loader thread: {error}"
            ) from error
        if self.copies is not None:  # on the caller's stream: its kernels come after the copies
            self.copies.waits(("block", block.index))

    @property
    def done(self) -> bool:
        """Whether the thread has ended (everything read, or stopped)."""
        return not self._thread.is_alive()

    def join(self) -> None:
        """Waits until everything is read."""
        self._thread.join()

    def finish(self) -> None:
        """Waits until every read is done (its allowance must be open or filled)."""
        self._thread.join()

    def close(self) -> None:
        """Stops after the block being read and waits for the thread (before a release); a
        wait for the allowance fails."""
        self.stopping.set()
        if self.allowance is not None:
            self.allowance.close()
        if self._thread.is_alive():
            self._thread.join()


class OverlapWait(BlockHook):
    """The ``overlap_wait`` block hook: a block waits for the loader to read it before it runs;
    removing the hook stops the loader."""

    name = "overlap_wait"
    gate = True

    def __init__(
        self, loader: ResidentLoader, state: ModelState, modules: dict[str, tuple[nn.Module, int]] | None = None
    ) -> None:
        self.loader = loader
        self.state = state
        self.modules = modules or {}  # outside modules loaded later: name -> (module, position)

    def attach(self, registry: HookRegistry) -> None:
        # An outside module loaded later waits for its weights as a block does, at this hook's
        # rank: before the hooks that see the module's weights.
        for name, (module, at) in self.modules.items():
            registry.on_module_start(self, module, functools.partial(self.loader.wait_outside, name, at))

    def pre_forward(self, block: BlockState) -> None:
        self.loader.advance(block)
        self.loader.wait(block)

    def close(self) -> None:
        self.loader.close()
        if self.state.loader is self.loader:
            self.state.loader = None


def start_loader(
    handle: OffloadHandle,
    state: ModelState,
    deferred: list[BlockState],
    first: list[str] | None,
    outside: dict[int, list[TensorSpec]] | None = None,
    waits: dict[str, int] | None = None,
    allowance: _core.Allowance | None = None,
    costs: dict[tuple[str, int], int] | None = None,
    ram_tier: bool = False,
) -> ResidentLoader:
    """Starts reading the ``deferred`` resident blocks in run order (``first``, the order given
    to install_offload, then model order), and the ``outside`` weights each before the block
    at its position (after the last: at the end); the hooks wait for a block not read yet, the
    outside modules of ``waits`` (name -> position) for theirs, and taking them off stops the
    thread."""
    from .. import _core

    run_order = _core.full_order(first or [], [b.prefix for b in state.blocks])
    positions = {index: at for at, index in enumerate(run_order)}
    # The model's lane for the loader's reads and the engine's: the drive serves the block
    # needed soonest.
    state.share_reads(run_order)
    by_index = {b.index: b for b in deferred}
    from .backends.cuda import DeviceBackend

    backend = handle.backend
    copies = None
    if isinstance(backend, DeviceBackend):
        from .backends.loader_copies import LoaderCopies
        from .materialize import GROUP_BYTES

        copies = LoaderCopies(backend.device, GROUP_BYTES)
    loader = ResidentLoader(
        [by_index[i] for i in run_order if i in by_index],
        state.device,
        state.config.storage_dtype,
        state.lane,
        positions,
        outside,
        allowance,
        costs,
        state.engine if ram_tier else None,
        copies=copies,
        ram_tier_arrived=backend.ram_tier_arrived if isinstance(backend, DeviceBackend) else None,
    )
    modules = state.outside_modules
    gates = {name: (modules[name], at) for name, at in (waits or {}).items()}
    # At its rank (see the registry); the handle's removal closes it (the thread stops before
    # the hooks go).
    state.loader = loader
    handle.hooks.add(OverlapWait(loader, state, gates))
    loader.start()
    return loader


def _detached(error: BaseException) -> BaseException:
    """``error`` as the call that needs the block raises it: its message (which names the file
    and tensor) and its causes, without their tracebacks. A traceback holds the loader thread's
    frames, which hold the loader, which holds the error: a cycle, with whatever tensors those
    frames held, that only a full garbage collection frees, and release() does not run one."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        e.__traceback__ = None
        e = e.__cause__ or e.__context__
    return error
