"""install_offload and offload_blocks: hooks that make each block runnable just before it runs.

Every concern is a named block hook in the model's one :class:`~.registry.HookRegistry`, in the
order of the registry's rank table (:data:`~.registry.RANKS`; ``pre_forward`` top to bottom,
``post_forward`` bottom to top):

- ``release_guard``: refuses a block once the hooks were removed;
- ``final_pass``: while ``handle.final_pass()`` is open, frees each block after it runs, and refuses
  a block it freed (added by :mod:`.final_pass`);
- ``gpu_released``: only while ``handle.release_gpu()`` holds the weights in host memory: the
  model's next call (or a block's, or an outside module's) restores them first (added by
  :mod:`.gpu_swap`, before every hook that reads the weights);
- ``overlap_wait``: ``stage(overlap=True)`` waits for the loader to read the block (added by
  :mod:`.overlap`);
- ``timing``: each run's start, end and what staging waited for (``handle.runs``, the profile's);
- ``staging``: the backend brings the block's weights and gives them back after the run, and
  blocks used in place from the checkpoint's map forget each module's weights once it ran;
- ``order``: records each block's first run once it has its weights (``handle.ran``), and, by a
  pre-hook on each module outside the blocks, how many blocks had started before its first call
  (``handle.outside_ran``); warns once when the order given was not the one forward() runs.

The gates are ``gpu_released``, ``release_guard``, ``final_pass``, ``overlap_wait`` and
``staging``: a block whose gate raised did not start, and none of its post hooks run. The handle
it returns removes them all (the registry stays on the model, with the hooks named on their own:
see :mod:`.registry`).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .. import _core, settings
from ..errors import ArgumentError, StreamError
from .cleanup import Cleanup
from .cpu import CpuBackend
from .cuda import CudaBackend, DeviceBackend
from .registry import BlockHook, HookRegistry, model_hooks
from .state import BlockState, ModelState, TensorSpec, get_state
from .timing import Timing

# What makes a block runnable on its device: the CPU's, or a device with its own memory.
Backend = CpuBackend | DeviceBackend

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["OffloadHandle", "install_offload", "offload_blocks"]


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
            if block.engine_index is not None and engine.in_place(block.engine_index):
                self._forget_as_used(registry, backend, block)

    def _forget_as_used(self, registry: HookRegistry, backend: CpuBackend, block: BlockState) -> None:
        """A block used in place from the checkpoint's map gives each module's weights back to
        the page cache as soon as that module has run, not at the end of the block: the process
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


class OffloadHandle:
    """What install_offload() returns: ``remove()`` takes the hooks off and restores the blocks
    (their weights stay loaded; :func:`release` frees them). ``hooks`` is the model's
    :class:`~.registry.HookRegistry` (:func:`~.registry.model_hooks`), where features add
    their block hooks.

    ``release_gpu()`` moves the model's weights in GPU memory (resident blocks, the weights
    outside the blocks, buffers) to host memory, pinned, and frees their GPU memory, keeping
    the hooks, the engine and the plan; ``restore_gpu()`` copies them back, bit for bit, and a
    call of the released model restores it first. Each returns a
    :class:`~.gpu_swap.GpuSwap` (bytes, seconds, host RAM held); each is a no-op when the
    model is already in that state, and on the CPU. See :mod:`.gpu_swap`."""

    def __init__(
        self,
        model: nn.Module,
        state: ModelState,
        backend: Backend,
        hooks: HookRegistry,
        installed: float,
        timing: RunTiming,
        order: RunOrder,
    ) -> None:
        self.model = model
        self.state = state
        self.backend = backend
        self.hooks = hooks
        self.installed = installed  # the profile draws the engine's stagings from here on
        self.removed = False
        self._timing = timing
        self._order = order

    @property
    def runs(self) -> list[tuple[int, float, float, Timing]]:
        """(block, start, end, timing) of each run, kept for the profile (see :class:`RunTiming`)."""
        return self._timing.runs

    @property
    def ran(self) -> list[str]:
        """Every block that ran, resident ones too, in the order of their first run."""
        return self._order.ran

    @property
    def outside_ran(self) -> dict[str, int]:
        """Each module outside the blocks that ran: how many blocks had started before its
        first call (0: before the first block)."""
        return self._order.outside_ran

    @property
    def recorded_order(self) -> list[str]:
        """The streamed blocks in the order they first ran."""
        engine = self.state.engine
        if engine is None or engine.closed:
            return []
        by_engine = {b.engine_index: b.prefix for b in self.state.blocks if b.engine_index is not None}
        return [by_engine[i] for i in engine.recorded_order()]

    def stats(self) -> _core.EngineStats | None:
        """The prefetch engine's counters (None without streamed blocks or once removed)."""
        engine = self.state.engine
        if engine is None or engine.closed:
            return None
        return engine.stats()

    def remove(self) -> None:
        """Takes the hooks off and restores the blocks, so the model runs plainly again (streamed
        blocks' weights become views of the mapped checkpoint on the CPU); with
        TRASH_PANDA_PROFILE=1 prints the profile of what ran."""
        snap = self.remove_hooks(profile=bool(settings.setting("profile")), restore=True)
        if snap is not None:
            from .profile import print_report

            print_report(snap)

    def final_pass(self, keep_prefixes: list[str] | None = None, *, keep_page_cache: bool = False) -> Any:
        """A context manager around the last call of the model: each block is freed right after
        it runs, except those under ``keep_prefixes``; ``.events`` is a queue of
        :class:`~trash_panda.offload.final_pass.FreedBlock`. ``keep_page_cache`` leaves a mapped
        RAM-tier block's pages in the page cache. See :mod:`.final_pass`."""
        from .final_pass import final_pass

        return final_pass(self, keep_prefixes, keep_page_cache)

    @property
    def gpu_released(self) -> bool:
        """Whether ``release_gpu()`` moved the weights to host memory (until they come back)."""
        from .gpu_swap import GPU_RELEASED

        return GPU_RELEASED in self.hooks

    def release_gpu(self) -> Any:
        """Moves the weights in GPU memory to host memory and frees their GPU memory; returns a
        :class:`~.gpu_swap.GpuSwap`. The model's next call (or ``restore_gpu()``) brings them
        back. A no-op on the CPU and when already released."""
        from .gpu_swap import release_gpu

        return release_gpu(self)

    def restore_gpu(self) -> Any:
        """Copies the weights ``release_gpu()`` moved back to the GPU, as they were; returns a
        :class:`~.gpu_swap.GpuSwap`. Raises :class:`StreamError` when they do not fit, leaving
        the model released. A no-op on the CPU and when not released."""
        from .gpu_swap import restore_gpu

        return restore_gpu(self)

    def remove_hooks(self, profile: bool, restore: bool = False) -> Any:
        """Takes the hooks off (restoring the blocks when asked), printing nothing: what
        :meth:`remove` and :func:`~.release.release` do. Returns the profile's snapshot when
        asked (None otherwise). Every step runs; the first error is raised after them."""
        if self.removed:
            return None
        if restore:
            from .restore import check_restore_fits

            # A model released from the GPU runs plainly only with its weights back there.
            self.restore_gpu()
            # Before anything changes: a restore that cannot fit leaves the hooks as they are.
            held = self.backend.device_bytes() if isinstance(self.backend, DeviceBackend) else 0
            check_restore_fits(self.state, held)
        steps = Cleanup()
        snap = None
        if profile:
            from .profile import snapshot

            snap = steps.run(snapshot, self)
        self.removed = True
        # Each hook closes (an overlap load's thread writes into resident blocks: it stops),
        # then the torch hooks on the blocks go, then the backend. The model's hooks named on
        # their own (the lookup tables' checks, a pipeline's) stay in its registry.
        steps.run(self.hooks.unwrap)
        steps.run(self.backend.close)
        self.state.uninstalled()
        if restore:
            from .restore import restore_blocks

            steps.run(restore_blocks, self.state)
        steps.done()
        return snap


def _set_order(state: ModelState, order: list[str] | None) -> None:
    """Gives the engine its run order (engine indices): the core's ``full_order`` raises for a
    name that is no block, or one named twice."""
    if state.engine is None and order is None:
        return
    run = _core.full_order(order or [], [b.prefix for b in state.blocks])
    state.share_reads(run)
    if state.engine is not None:
        streamed = [state.blocks[i].engine_index for i in run]
        state.engine.set_order([i for i in streamed if i is not None])


def install_offload(model: nn.Module, *, order: list[str] | None = None) -> OffloadHandle:
    """Installs the hooks that stream the blocks of a model loaded by :func:`stream_load`.

    ``order`` names the blocks that run first, in that order (the others follow in the plan's
    order): the prefetcher stages blocks in that order from the first call on.
    """
    from torch import nn

    if not isinstance(model, nn.Module):
        raise ArgumentError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    state = get_state(model)
    if state is None:
        raise ArgumentError("model: load it with stream_load() before install_offload()")
    if state.handle is not None:
        raise ArgumentError("model: its hooks are already installed; remove() the handle first")
    if order is not None and (isinstance(order, str) or not all(isinstance(n, str) for n in order)):
        raise ArgumentError("order: expected a list of block names")
    return _install(model, state, state.blocks, order)


def make_backend(state: ModelState) -> Backend:
    if state.device.type == "cuda":
        return CudaBackend(state)
    if state.device.type == "cpu":
        return CpuBackend(state)
    raise StreamError(f"device {state.device} is not supported: expected cuda or cpu")


def _install(
    model: nn.Module,
    state: ModelState,
    blocks: Iterable[BlockState],
    order: list[str] | None,
    backend_for: Callable[[ModelState], Backend] | None = None,
) -> OffloadHandle:
    """Installs the hooks; ``backend_for`` makes the backend (the device's by default; tests
    pass a simulated device's)."""
    installed = _core.clock()  # before set_order, which starts the first stagings
    if state.engine is not None:
        # Hooks installed again after remove() check and record their own runs.
        state.engine.clear_recorded_order()
    _set_order(state, order)
    blocks = list(blocks)
    names = [b.prefix for b in blocks]
    # Every first run is checked against the order given (then the model's): it drives the
    # stagings of streamed blocks and, with overlap, the loader of the resident ones.
    keys = {n.rstrip(".") for n in names}
    first = [n for n in order or [] if n.rstrip(".") in keys]
    expected = [names[i] for i in _core.full_order(first, names)]
    backend = (backend_for or make_backend)(state)
    hooks = model_hooks(model)
    hooks.wrap(blocks)
    staging = Staging(backend, blocks, state.engine)
    timing, run_order = RunTiming(staging), RunOrder(expected, state.outside_modules)
    handle = OffloadHandle(model, state, backend, hooks, installed, timing, run_order)
    try:
        for hook in (ReleaseGuard(handle), timing, staging, run_order):
            hooks.add(hook)
    except BaseException:
        # The registry outlives this install: one that failed leaves nothing on the blocks.
        Cleanup().run(hooks.unwrap)
        raise
    state.installed(handle)
    return handle


def offload_blocks(
    blocks: Iterable[nn.Module] | nn.ModuleList,
    device: str | torch.device = "cuda",
    compute_dtype: torch.dtype | str | None = None,
) -> OffloadHandle:
    """Installs the offload hooks on the given blocks only.

    The blocks must belong to a model loaded by :func:`stream_load` (the low-level form
    ``stream_load(model, path, offload_prefixes=[...], ...)`` is the usual pairing); ``device``
    and ``compute_dtype`` must match what it loaded for.
    """
    import torch

    from .._dtypes import resolve

    modules = list(blocks)
    if not modules:
        raise ArgumentError("blocks: expected one or more modules")
    owner = None
    chosen: list[BlockState] = []
    for m in modules:
        owner, block = _find_owner(m)
        chosen.append(block)
    assert owner is not None
    model, state = owner
    if torch.device(device) != state.device and not (torch.device(device).type == state.device.type == "cuda"):
        raise ArgumentError(f"device: the model was loaded for {state.device}, not {device}")
    if compute_dtype is not None and resolve(compute_dtype) != state.compute_dtype:
        raise ArgumentError(
            f"compute_dtype: the model was loaded to compute in {state.compute_dtype}, not {compute_dtype}"
        )
    if state.handle is not None:
        raise ArgumentError("the model's hooks are already installed; remove() the handle first")
    return _install(model, state, chosen, None)


def _find_owner(module: nn.Module) -> tuple[tuple[nn.Module, ModelState], BlockState]:
    from .state import live_models

    for candidate in live_models():
        state = get_state(candidate)
        if state is None:
            continue
        for b in state.blocks:
            if b.module is module:
                return (candidate, state), b
    raise ArgumentError(
        f"{type(module).__name__} is not a block of a model loaded by stream_load(): load the model with "
        "stream_load(model, path, offload_prefixes=[...]) first"
    )
