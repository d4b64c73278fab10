"""release() gives a model's memory back; measure_activation_vram() measures what a call needs."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _core
from ..errors import ArgumentError
from .backends.cuda import empty_cuda_caches
from .cleanup import Cleanup
from .handle import OffloadHandle
from .materialize import unload
from .meter import measured, paused
from .state import get_state, mark_released

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ..plan import Plan

__all__ = ["measure_activation_vram", "release"]


def release(model: nn.Module, handle: OffloadHandle | None = None) -> None:
    """Frees a model: removes the hooks, puts every weight on the meta device, closes the file
    maps and the staging pool, and empties torch's GPU and pinned-memory caches. The model
    cannot run afterwards (it raises instead of computing on empty weights) until it is loaded
    again with :func:`stream_load`.

    The hooks live on the model are removed whichever handle is passed (one that was removed
    and replaced by a new install_offload() too). Every step runs even when one fails, so the
    model is never left half-loaded; the first error is raised at the end."""
    from torch import nn

    if not isinstance(model, nn.Module):
        raise ArgumentError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if handle is not None and not isinstance(handle, OffloadHandle):
        raise ArgumentError(f"handle: expected what install_offload() returned, got {type(handle).__name__}")
    if handle is not None and handle.model is not model:
        raise ArgumentError("handle: it belongs to another model")
    with paused():
        _release(model)


def _release(model: nn.Module) -> None:
    """The hooks that go are those live on the model: every installed handle is its model's live
    one, so a handle release() was given that is not was removed already."""
    import torch

    from .. import settings
    from .profile import memory_point, print_report

    steps = Cleanup()
    profile = bool(settings.setting("profile"))
    points: list[dict[str, object]] = []

    def point(label: str) -> None:
        if profile:
            points.append(memory_point(label))

    steps.run(point, "before release")
    state = get_state(model)
    live = state.handle if state is not None else None
    snap = steps.run(live.remove_hooks, profile) if live is not None else None
    steps.run(point, "hooks removed")
    steps.run(unload, model)
    mark_released(model)
    steps.run(point, "weights on the meta device")
    # The young generations only: a full collection walks every object of the process (0.3 s
    # with transformers and diffusers imported, on each stage of a pipeline), and what the
    # runtime held is freed as its references go (tests/offload/test_release_memory.py).
    gc.collect(1)
    steps.run(point, "after garbage collection")
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        steps.run(empty_cuda_caches)
    _core.trim_heap()
    steps.run(point, "after release")
    if profile and snap is not None:
        snap.memory = points
        steps.run(print_report, snap)
    steps.done()


def measure_activation_vram(
    fn: Callable[[], Any], plan: Plan | None = None, *, device: torch.device | str | None = None
) -> int:
    """The peak memory a call needs beyond what was held before it, in bytes.

    On CUDA: what torch's caching allocator needed during ``fn()`` beyond what was allocated
    before: the allocated peak, or, when larger, what was allocated before plus the growth of
    the memory it reserved (segments are rounded up, and fragments it cannot reuse stay
    reserved). The cache of unused memory is emptied first, so the call's segments show as
    growth rather than hide in memory earlier work left cached. Everything the runtime holds for
    streaming (device slots, the expansion buffer) is allocated when the hooks are installed, so
    it is in that baseline and is not taken off again; the rest is the activations (and whatever
    else the call allocates). What the CUDA runtime holds outside torch (its context, the kernels
    it loads, library handles) is not in it: a plan for a GPU keeps a fixed floor for that,
    ``CUDA_CONTEXT_FLOOR`` (docs/plan-format.md). On the CPU: the growth of
    the process's peak private memory during the call (pages of a mapped checkpoint it reads
    are the page cache's, not the call's). What a model loaded or released meanwhile adds or
    frees is left out, and other measurements open at the same time do not disturb this one.
    Pass the result as ``activation_vram=`` to the next plan for the same model and input size.
    ``plan`` is accepted for symmetry with that call and checked, not used.
    """
    from ..device import resolve_device
    from ..plan import Plan

    if not callable(fn):
        raise ArgumentError(f"fn: expected a callable, got {type(fn).__name__}")
    if plan is not None and not isinstance(plan, Plan):
        raise ArgumentError(f"plan: expected a trash_panda.Plan, got {type(plan).__name__}")
    where = resolve_device(device)
    if where.type == "cuda":
        import torch

        torch.cuda.empty_cache()
    with measured(where) as peak:
        fn()
    return peak[0]
