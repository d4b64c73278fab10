"""install_offload and offload_blocks: hooks that make each block runnable just before it runs.

Every hook goes through one registry, and the handle it returns removes them all.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .. import _core, config
from ..errors import ArgumentError, StreamError
from .cpu import CpuBackend
from .cuda import CudaBackend, DeviceBackend
from .state import BlockState, ModelState, TensorSpec, get_state
from .work import Timing

# What makes a block runnable on its device: the CPU's, or a device with its own memory.
Backend = CpuBackend | DeviceBackend

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.utils.hooks import RemovableHandle

__all__ = ["OffloadHandle", "install_offload", "offload_blocks"]


# Block runs kept for the profile; a server that runs for days must not grow without bound.
MAX_RUNS = 200_000
# The timing of every run that brings nothing; shared, since no one writes to it.
NOTHING_BROUGHT = Timing()


class HookRegistry:
    """The hooks of one model: installed together, removed together."""

    def __init__(self) -> None:
        self._handles: list[RemovableHandle] = []

    def around(self, module: nn.Module, before: Callable[[], None], after: Callable[[], None]) -> None:
        self._handles.append(module.register_forward_pre_hook(lambda _m, _args: before()))
        self._handles.append(module.register_forward_hook(lambda _m, _args, _out: after(), always_call=True))

    def after(self, module: nn.Module, after: Callable[[], None]) -> None:
        self._handles.append(module.register_forward_hook(lambda _m, _args, _out: after(), always_call=True))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


class OffloadHandle:
    """What install_offload() returns: ``remove()`` takes the hooks off and restores the blocks
    (their weights stay loaded; :func:`release` frees them)."""

    def __init__(
        self,
        model: nn.Module,
        state: ModelState,
        backend: Backend,
        registry: HookRegistry,
        installed: float,
        expected: list[str] | None = None,
    ) -> None:
        self.model = model
        self._state = state
        self._backend = backend
        self._registry = registry
        # (block, start, end, timing), times on _core.clock(): the engine's workers time their
        # stagings on it, so the profile's trace draws both on one timeline.
        self.runs: list[tuple[int, float, float, Timing]] = []
        self.installed = installed  # the profile draws the engine's stagings from here on
        self.removed = False
        self._expected = expected or []  # the first runs' order given (then the model's)
        self._order_warned = False
        # Every block that ran, resident ones too, in the order of their first run: the order
        # file holds it.
        self.ran: list[str] = []
        self._seen: set[int] = set()
        self._started: set[int] = set()  # blocks whose before-hook completed (for after)
        self._waiter: Callable[[BlockState], None] | None = None  # stage(overlap=True)
        self._loader: Any = None  # stage(overlap=True)'s ResidentLoader, for the profile
        self._final: Any = None  # the FinalPass while handle.final_pass() is open

    def _first_run(self, block: BlockState) -> None:
        """Records a block's first run, and warns once when it is not the one the order given
        says comes next."""
        at = len(self.ran)
        self._seen.add(block.index)
        self.ran.append(block.prefix)
        if self._order_warned or at >= len(self._expected) or self._expected[at] == block.prefix:
            return
        self._order_warned = True
        warnings.warn(
            f"block {block.prefix} ran before the order given ({self._expected[at]} ...): pass order= so "
            "blocks are staged (and with overlap=True loaded) in the order forward() runs them",
            stacklevel=5,
        )

    @property
    def recorded_order(self) -> list[str]:
        """The streamed blocks in the order they first ran."""
        engine = self._state.engine
        if engine is None or engine.closed:
            return []
        by_engine = {b.engine_index: b.prefix for b in self._state.blocks if b.engine_index is not None}
        return [by_engine[i] for i in engine.recorded_order()]

    def stats(self) -> _core.EngineStats | None:
        """The prefetch engine's counters (None without streamed blocks or once removed)."""
        engine = self._state.engine
        if engine is None or engine.closed:
            return None
        return engine.stats()

    def remove(self) -> None:
        """Takes the hooks off and restores the blocks, so the model runs plainly again (streamed
        blocks' weights become views of the mapped checkpoint on the CPU); with
        TRASH_PANDA_PROFILE=1 prints the profile of what ran."""
        snap = self._remove(profile=bool(config.setting("profile")), restore=True)
        if snap is not None:
            from .profile import print_report

            print_report(snap)

    def final_pass(self, keep_prefixes: list[str] | None = None) -> Any:
        """A context manager around the last call of the model: each block is freed right after
        it runs, except those under ``keep_prefixes``; ``.events`` is a queue of
        :class:`~trash_panda.offload.final_pass.FreedBlock`. See :mod:`.final_pass`."""
        from .final_pass import final_pass

        return final_pass(self, keep_prefixes)

    def _remove(self, profile: bool, restore: bool = False) -> Any:
        """Takes the hooks off (restoring the blocks when asked); returns the profile's snapshot
        when asked (None otherwise). Every step runs; the first error is raised after them."""
        if self.removed:
            return None
        from .cleanup import Cleanup

        if restore:
            from .restore import check_restore_fits

            # Before anything changes: a restore that cannot fit leaves the hooks as they are.
            held = self._backend.device_bytes() if isinstance(self._backend, DeviceBackend) else 0
            check_restore_fits(self._state, held)
        steps = Cleanup()
        snap = None
        if profile:
            from .profile import snapshot

            snap = steps.run(snapshot, self)
        self.removed = True
        if self._loader is not None:
            # overlap=True: the loader thread writes into resident blocks; it stops first.
            steps.run(self._loader.close)
        steps.run(self._registry.remove)
        steps.run(self._backend.close)
        self._state.handle = None
        if restore:
            from .restore import restore_blocks

            steps.run(restore_blocks, self._state)
        steps.done()
        return snap


def _set_order(state: ModelState, order: list[str] | None) -> None:
    """Gives the engine its run order (engine indices); a name that is no block is an error."""
    if state.engine is None and order is None:
        return
    streamed = [b for b in state.blocks if b.engine_index is not None]
    if order is None:
        assert state.engine is not None
        state.engine.set_order([b.engine_index for b in streamed if b.engine_index is not None])
        return
    by_name = {b.prefix.rstrip("."): b for b in state.blocks}
    first: list[int] = []
    for name in order:
        b = by_name.get(name.rstrip("."))
        if b is None:
            raise ArgumentError(
                f"order names {name!r}, which is not a block of the model (blocks: {', '.join(list(by_name)[:4])}, ...)"
            )
        if b.engine_index is not None and b.engine_index not in first:
            first.append(b.engine_index)
    if state.engine is not None:
        rest = [b.engine_index for b in streamed if b.engine_index is not None and b.engine_index not in first]
        state.engine.set_order(first + rest)


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
    registry = HookRegistry()
    handle = OffloadHandle(model, state, backend, registry, installed, expected)

    for block in blocks:

        def before(block: BlockState = block) -> None:
            if handle.removed:
                raise StreamError("the offload hooks were removed")
            if handle._final is not None:
                handle._final.check(block)
            if handle._waiter is not None:
                handle._waiter(block)
            handle._started.add(block.index)
            if len(handle.runs) >= MAX_RUNS:  # a long generation: keep the recent half
                del handle.runs[: MAX_RUNS // 2]
            start = brought = _core.clock()
            # Resident in the compute dtype: nothing to bring, but its run still counts in the
            # pass (a first block's warm-up shows there); the after-hook ends it.
            timing = NOTHING_BROUGHT
            if block.work:
                try:
                    timing = backend.bring(block)
                except BaseException:
                    handle._started.discard(block.index)
                    raise
                brought = _core.clock()
            if block.index not in handle._seen:  # only now that it has its weights: it runs
                handle._first_run(block)
            handle.runs.append((block.index, start, brought, timing))

        def after(block: BlockState = block) -> None:
            if block.index not in handle._started:  # its before-hook raised: nothing to undo
                return
            handle._started.discard(block.index)
            if block.work:
                backend.done(block)
            if handle.runs and handle.runs[-1][0] == block.index:
                idx, start, _brought, timing = handle.runs[-1]
                handle.runs[-1] = (idx, start, _core.clock(), timing)
            if handle._final is not None:
                handle._final.after(block)

        registry.around(block.module, before, after)
        index, engine = block.engine_index, state.engine
        if isinstance(backend, CpuBackend) and index is not None and engine is not None and engine.in_place(index):
            _forget_as_used(registry, backend, block)
    state.handle = handle
    return handle


def _forget_as_used(registry: HookRegistry, backend: CpuBackend, block: BlockState) -> None:
    """A block used in place from the checkpoint's map gives each module's weights back to the
    page cache as soon as that module has run, not at the end of the block: the process then
    maps one module's weights at a time, not the whole block's. A later use in the same run
    maps them again."""
    by_module: dict[int, tuple[nn.Module, list[TensorSpec]]] = {}
    for spec in block.work:
        if spec.staged_index is not None and spec.module is not block.module:
            by_module.setdefault(id(spec.module), (spec.module, []))[1].append(spec)
    for module, specs in by_module.values():
        indices = [s.staged_index for s in specs if s.staged_index is not None]
        registry.after(module, _forgetter(backend, block, indices))


def _forgetter(backend: CpuBackend, block: BlockState, indices: list[int]) -> Callable[[], None]:
    def forget() -> None:
        backend.forget_used(block, indices)

    return forget


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
