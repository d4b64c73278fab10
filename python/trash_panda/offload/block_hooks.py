"""The block hooks every install puts on a model; the features add theirs (a final pass, an
overlap load's wait, a GPU release). Their places are the registry's rank table
(:data:`~.registry.RANKS`).

- ``release_guard`` (a gate): refuses a block once the hooks were removed;
- ``timing``: each run's start, end and what staging waited for (``handle.runs``, the profile's);
- ``staging`` (a gate): the backend brings the block's weights and gives them back after the
  run, and blocks used in place from the checkpoint's map forget each module's weights once it
  ran;
- ``order``: records each block's first run once it has its weights (``handle.ran``), and, by a
  pre-hook on each module outside the blocks, how many blocks had started before its first call
  (``handle.outside_ran``); warns once when the order given was not the one forward() runs.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import _core
from ..errors import StreamError
from .backends import Backend
from .backends.cpu import CpuBackend
from .backends.cuda import DeviceBackend
from .registry import BlockHook, HookRegistry
from .timing import Timing

if TYPE_CHECKING:
    from torch import nn

    from .handle import OffloadHandle
    from .state import BlockState, TensorSpec

__all__ = ["ReleaseGuard", "RunOrder", "RunTiming", "Staging"]
# Block runs kept for the profile; a server that runs for days must not grow without bound.
MAX_RUNS = 200_000


# The timing of every run that brings nothing; shared, since no one writes to it.
NOTHING_BROUGHT = Timing()


class ReleaseGuard(BlockHook):
    """Refuses to run a block once the handle's hooks were removed."""

    name = "release_guard"
    gate = True

    def __init__(self, handle: OffloadHandle) -> None:
        self.handle = handle

    def pre_forward(self, block: BlockState) -> None:
        if self.handle.removed:
            raise StreamError("the offload hooks were removed")


class Staging(BlockHook):
    """Brings a block's weights before its run and gives them back after it."""

    name = "staging"
    gate = True

    def __init__(self, backend: Backend, blocks: list[BlockState], engine: _core.Engine | None) -> None:
        self.backend = backend
        self.blocks = blocks
        self.engine = engine
        self._timings: dict[int, Timing] = {}
        # On a device with streams, which ones each block runs on (what its memory waits for).
        self._starts = backend.starts if isinstance(backend, DeviceBackend) else None

    def timing(self, block: BlockState) -> Timing:
        """What the last bring of ``block`` waited for (nothing, for a block with nothing to
        bring)."""
        return self._timings.get(block.index, NOTHING_BROUGHT)

    def pre_forward(self, block: BlockState) -> None:
        if self._starts is not None:
            self._starts(block)
        # Resident in the compute dtype: nothing to bring, but its run still counts in the pass
        # (a first block's warm-up shows there).
        if block.work:
            self._timings[block.index] = self.backend.bring(block)

    def post_forward(self, block: BlockState) -> None:
        if block.work:
            self.backend.done(block)

    def attach(self, registry: HookRegistry) -> None:
        backend, engine = self.backend, self.engine
        if not isinstance(backend, CpuBackend) or engine is None:
            return
        for block in self.blocks:
            if block.engine_index is not None and engine.unmaps_as_used(block.engine_index):
                self._forget_as_used(registry, backend, block)

    def _forget_as_used(self, registry: HookRegistry, backend: CpuBackend, block: BlockState) -> None:
        """A disk-tier block used in place from the checkpoint's map gives each module's weights
        back to the page cache as soon as that module has run, not at the end of the block: the process
        then maps one module's weights at a time, not the whole block's. A later use in the same
        run maps them again."""
        by_module: dict[int, tuple[nn.Module, list[TensorSpec]]] = {}
        for spec in block.work:
            if spec.staged_index is not None and spec.module is not block.module:
                by_module.setdefault(id(spec.module), (spec.module, []))[1].append(spec)
        for module, specs in by_module.values():
            indices = [s.staged_index for s in specs if s.staged_index is not None]
            registry.on_module_end(self, module, _forgetter(backend, block, indices))


def _forgetter(backend: CpuBackend, block: BlockState, indices: list[int]) -> Callable[[], None]:
    def forget() -> None:
        backend.forget_used(block, indices)

    return forget


class RunTiming(BlockHook):
    """Each run of a block: ``runs`` holds (block, start, end, timing), times on
    ``_core.clock()`` (the engine's workers time their stagings on it, so the profile's trace
    draws both on one timeline); ``timing`` is what staging waited for."""

    name = "timing"

    def __init__(self, staging: Staging) -> None:
        self.staging = staging
        self.runs: list[tuple[int, float, float, Timing]] = []
        self._start: dict[int, float] = {}

    def pre_forward(self, block: BlockState) -> None:
        self._start[block.index] = _core.clock()

    def post_forward(self, block: BlockState) -> None:
        runs = self.runs
        if len(runs) >= MAX_RUNS:  # a long generation: keep the recent half
            del runs[: MAX_RUNS // 2]
        runs.append((block.index, self._start[block.index], _core.clock(), self.staging.timing(block)))


class RunOrder(BlockHook):
    """Every block that ran, resident ones too, in the order of their first run, and for each
    module outside the blocks how many of them had started before its first call (the order
    file holds both); warns once when a block is not the one the order given says comes next."""

    name = "order"

    def __init__(self, expected: list[str], outside: dict[str, nn.Module] | None = None) -> None:
        self.expected = expected  # the first runs' order given (then the model's)
        self.ran: list[str] = []
        self.outside_ran: dict[str, int] = {}  # outside module -> blocks started before its first call
        self._outside = outside or {}
        self._seen: set[int] = set()
        self._warned = False

    def attach(self, registry: HookRegistry) -> None:
        for name, module in self._outside.items():
            registry.on_module_start(self, module, functools.partial(self._outside_start, name))

    def _outside_start(self, name: str) -> None:
        if name not in self.outside_ran:
            self.outside_ran[name] = len(self.ran)

    def pre_forward(self, block: BlockState) -> None:
        # After staging: a block is recorded only once it has its weights, as it then runs.
        if block.index in self._seen:
            return
        at = len(self.ran)
        self._seen.add(block.index)
        self.ran.append(block.prefix)
        if self._warned or at >= len(self.expected) or self.expected[at] == block.prefix:
            return
        self._warned = True
        warnings.warn(
            f"block {block.prefix} ran before the order given ({self.expected[at]} ...): pass order= so "
            "blocks are staged (and with overlap=True loaded) in the order forward() runs them",
            stacklevel=5,
        )
