"""install_offload and offload_blocks put the block hooks (:mod:`.block_hooks`) on a model's
blocks; :class:`OffloadHandle` is what the caller holds. The handle is the facade of the features
(a final pass, a GPU release and restore, the profile, restoring the blocks on removal): it
imports them, and none of them imports it. Each feature adds its block hook to the model's
:class:`~.registry.HookRegistry`, whose rank table (:data:`~.registry.RANKS`) places it.

A block whose gate raised did not start, and none of its post hooks run. The handle removes
every block hook (the registry stays on the model, with the hooks named on their own: see
:mod:`.registry`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .. import _core, settings
from ..errors import ArgumentError
from ..options import check_order
from .backends import Backend, make_backend
from .backends.cuda import DeviceBackend
from .block_hooks import ReleaseGuard, RunOrder, RunTiming, Staging
from .cleanup import Cleanup
from .registry import HookRegistry, model_hooks
from .state import BlockState, ModelState, get_state

if TYPE_CHECKING:
    import torch
    from torch import nn

    from .timing import Timing

__all__ = ["OffloadHandle", "install_offload", "offload_blocks"]


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
    check_order(order)
    return _install(model, state, state.blocks, order)


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
