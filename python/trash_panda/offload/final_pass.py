"""handle.final_pass(): around the last call of a model, each block is freed right after it runs
and announced on a queue, so whoever loads the next model can use the memory as it appears.

A resident block gives back its weights (device memory on CUDA, private memory on the CPU). A
RAM-tier block mapped from the checkpoint gives back its pages of the map and, on Linux, their
page cache (the engine's ``release_pages``: ``madvise(DONTNEED)`` and ``posix_fadvise(DONTNEED)``
on its ranges), or with ``keep_page_cache=True`` only its pages of the map (a pipeline that runs
again finds them in the cache). A disk-tier block, or the in-memory RAM tier, holds nothing of its own between
runs (its staging buffer and device slot are shared by every streamed block), so its event says
0 bytes. The weights outside the blocks are
left alone, and so are the blocks under ``keep_prefixes``. The hook only puts the event on a
``queue.SimpleQueue``, which never blocks, so the compute thread never waits for the reader.
"""

from __future__ import annotations

import contextlib
import queue
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import _core
from ..errors import ArgumentError, StreamError
from .registry import BlockHook

if TYPE_CHECKING:
    import torch

    from .backends.copies import Device
    from .backends.cuda import DeviceBackend
    from .handle import OffloadHandle
    from .state import BlockState, ModelState

# What a block's tensor goes through before it is dropped (see DeviceBackend.retire).
Retire = Callable[["BlockState", "torch.Tensor"], None]

__all__ = ["FinalPass", "FreedBlock", "final_pass", "free_idle_blocks", "taken_back"]


@dataclass(frozen=True)
class FreedBlock:
    """One block freed by a final pass."""

    block: str  # its prefix
    bytes: int  # bytes given back
    tier: _core.Tier  # the plan's tier
    # On a device: happens once the block's queued work has run; reuse the memory after its
    # ``synchronize()`` returns. None on the CPU, which ran the work before the hook returned.
    event: Any


class FinalPass(BlockHook):
    """What ``with handle.final_pass() as fp:`` gives: ``fp.events``, the queue of freed blocks,
    and ``fp.freed``, the prefixes freed so far. It is the model's ``final_pass`` block hook:
    it frees each block after its run while the pass is open, and refuses, open or closed, to
    run a block it freed."""

    name = "final_pass"
    gate = True

    def __init__(
        self,
        state: ModelState,
        keep_prefixes: tuple[str, ...],
        keep_page_cache: bool = False,
        wanted: Callable[[], int] | None = None,
        backend: DeviceBackend | None = None,
        earlier: FinalPass | None = None,
    ) -> None:
        self.events: queue.SimpleQueue[FreedBlock] = queue.SimpleQueue()
        self._keep_cache = keep_page_cache
        self.freed: list[str] = []
        self.active = True
        self._state = state
        self._keep = keep_prefixes
        # A pipeline's stage that stays loaded for the next run frees only while the stage
        # after it still wants memory (bytes; None: every block).
        self._wanted = wanted
        # What an earlier pass freed or gave back stays gone.
        self._freed: set[int] = set(earlier._freed) if earlier is not None else set()
        # Blocks given back to other stages, not by a pass (shared with the earlier pass's).
        self._given: set[int] = earlier._given if earlier is not None else set()
        # The device the blocks' kernels are queued on (the backend's; None: the CPU, which
        # runs them before the hook returns). Its event, not one made here, so that a device
        # simulated in virtual time is asked too.
        self._device: Device | None = backend.device if backend is not None else None
        self._retire: Retire | None = backend.retire if backend is not None else None

    def pre_forward(self, block: BlockState) -> None:
        self.check(block)

    def post_forward(self, block: BlockState) -> None:
        self.after(block)

    def check(self, block: BlockState) -> None:
        """Refuses to run a block this pass freed (its weights are gone)."""
        if block.index in self._given:
            raise StreamError(
                f"block {block.prefix} was given back to make room for another stage of the pipeline; "
                "it is read again when its own stage starts (use the model inside run.stage(...))"
            )
        if block.index in self._freed:
            raise StreamError(
                f"block {block.prefix} was freed by final_pass() after its run and cannot run again; "
                "pass keep_prefixes=[...] for blocks that run more than once in the last call"
            )

    def after(self, block: BlockState) -> None:
        if not self.active or block.index in self.gone or block.prefix.startswith(self._keep):
            return
        if self._wanted is not None and (block.engine_index is not None or self._wanted() <= 0):
            return  # a stage kept for its next run keeps its streamed blocks' RAM tier
        # A kept stage's blocks are read again at its next turn: called before, they say so.
        (self._given if self._wanted is not None else self._freed).add(block.index)
        freed = _free(self._state, block, self._keep_cache, self._retire)
        if freed and self._state.device.type == "cpu":
            # glibc keeps freed chunks below its (growing) mmap threshold in the heap: hand the
            # block's pages back now, not at the release.
            _core.trim_heap()
        self.freed.append(block.prefix)
        event = _Done(self._device, self._device.compute_done()) if self._device is not None else None
        self.events.put_nowait(FreedBlock(block.prefix, freed, block.tier, event))

    def free_idle(self, block: BlockState) -> int:
        """Frees ``block`` outside a pass (its stage is idle); it refuses to run until its
        stage reads it again. Returns the bytes."""
        self._given.add(block.index)
        return _free(self._state, block, self._keep_cache, self._retire)

    @property
    def gone(self) -> set[int]:
        """The blocks it freed or gave back: they refuse to run."""
        return self._freed | self._given


def free_idle_blocks(handle: OffloadHandle, blocks: list[BlockState]) -> int:
    """Frees ``blocks`` of an idle model whose hooks stay (a pipeline's stage kept in part, its
    file pages left to the page cache); they refuse to run until read again (:func:`taken_back`).
    Returns the bytes freed."""
    from .backends.cuda import DeviceBackend

    fp = handle.hooks.get(FinalPass.name)
    if not isinstance(fp, FinalPass):
        backend = handle.backend if isinstance(handle.backend, DeviceBackend) else None
        fp = FinalPass(handle.state, (), keep_page_cache=True, backend=backend)
        fp.active = False
        handle.hooks.add(fp)
    freed = sum(fp.free_idle(b) for b in blocks)
    if freed and handle.state.device.type == "cpu":
        _core.trim_heap()  # once for them all: glibc keeps freed chunks below its threshold
    return freed


def taken_back(handle: OffloadHandle) -> None:
    """The blocks a pass freed or :func:`give_back` gave back are being read again: they may
    run once read (the loader's hook makes them wait for it)."""
    fp = handle.hooks.get(FinalPass.name)
    if isinstance(fp, FinalPass):
        assert not fp.active, "a final pass is open"
        handle.hooks.remove(FinalPass.name)


def _free(state: ModelState, block: BlockState, keep_cache: bool, retire: Retire | None) -> int:
    """Drops what a block holds of its own (a mapped RAM-tier block's page cache too, unless
    ``keep_cache``), each tensor through ``retire`` first (a device backend's: the kernels
    queued that read it may not have run yet); returns the bytes."""
    import torch
    from torch import nn

    from .patches import drop_image

    engine = state.engine
    if block.engine_index is not None:
        if engine is None:
            return 0
        # A merge kept in the block's image goes with it.
        return drop_image(state, block.engine_index) + engine.release_pages(block.engine_index, keep_cache)
    freed = 0
    for spec in block.tensors:
        if spec.resident is not None:  # stored form, expanded on each run
            for t in (spec.resident, spec.resident_scale):
                if t is not None:
                    freed += _retire(block, t, retire)
            spec.drop_stored()
            continue
        param = spec.held()
        if param is None or param.is_meta:
            continue
        freed += _retire(block, param, retire)
        spec.put(nn.Parameter(torch.empty_like(param, device="meta"), requires_grad=False))
    return freed


def _retire(block: BlockState, t: torch.Tensor, retire: Retire | None) -> int:
    if retire is not None:
        retire(block, t)
    return int(t.nbytes)


@dataclass(frozen=True)
class _Done:
    """A freed block's event as the feeder uses it: ``synchronize()`` waits through the device
    that made it (on CUDA the event's own wait; a simulated device keeps its own time)."""

    device: Device
    event: Any

    def synchronize(self) -> None:
        self.device.wait(self.event)


@contextlib.contextmanager
def final_pass(
    handle: OffloadHandle,
    keep_prefixes: list[str] | None = None,
    keep_page_cache: bool = False,
    wanted: Callable[[], int] | None = None,
) -> Iterator[FinalPass]:
    """See the module: frees each block right after it runs, inside the ``with`` block."""
    if not isinstance(keep_page_cache, bool):
        raise ArgumentError(f"keep_page_cache: expected True or False, got {keep_page_cache!r}")
    if keep_prefixes is not None and (
        isinstance(keep_prefixes, str) or not all(isinstance(p, str) for p in keep_prefixes)
    ):
        raise ArgumentError("keep_prefixes: expected a list of block name prefixes")
    if handle.removed:
        raise ArgumentError("handle: its hooks were removed; final_pass() needs installed hooks")
    from .backends.cuda import DeviceBackend

    current = handle.hooks.get(FinalPass.name)
    if isinstance(current, FinalPass) and current.active:
        raise ArgumentError("handle: a final_pass() is already open")
    backend = handle.backend if isinstance(handle.backend, DeviceBackend) else None
    earlier = current if isinstance(current, FinalPass) else None
    fp = FinalPass(handle.state, tuple(keep_prefixes or ()), keep_page_cache, wanted, backend, earlier)
    # A closed pass's hook is replaced by this one (at its rank: see the registry).
    handle.hooks.remove(FinalPass.name)
    handle.hooks.add(fp)
    engine = handle.state.engine
    _last_pass(engine, True)
    try:
        yield fp
    finally:
        fp.active = False  # kept in the registry: the freed blocks still refuse to run
        # Kept blocks that run again are staged as usual from their next run on.
        _last_pass(engine, False)


def _last_pass(engine: _core.Engine | None, last: bool) -> None:
    """In the final pass the engine stages nothing past the last block: its look-ahead would
    wrap into the first blocks and read again the pages they just gave back."""
    if engine is not None and not engine.closed:
        engine.set_last_pass(last)
