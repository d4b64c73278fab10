"""release() gives a model's memory back; measure_activation_vram() measures what a call needs."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _core
from ..errors import ArgumentError, TrashPandaError
from .hooks import OffloadHandle
from .reading import unload
from .state import get_state

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ..plan import Plan

__all__ = ["measure_activation_vram", "release"]

_RELEASED_HOOK = "_trash_panda_released"


def _refuse_released(module: nn.Module, _args: Any) -> None:
    raise TrashPandaError(
        f"{type(module).__name__} was released by trash_panda.release() and cannot run; "
        "load it again with stream_load()"
    )


def release(model: nn.Module, handle: OffloadHandle | None = None) -> None:
    """Frees a model: removes the hooks, puts every weight on the meta device, closes the file
    maps and the staging pool, and empties torch's GPU and pinned-memory caches. The model
    cannot run afterwards (it raises instead of computing on empty weights)."""
    from torch import nn

    if not isinstance(model, nn.Module):
        raise ArgumentError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if handle is not None and not isinstance(handle, OffloadHandle):
        raise ArgumentError(f"handle: expected what install_offload() returned, got {type(handle).__name__}")
    if handle is not None and handle.model is not model:
        raise ArgumentError("handle: it belongs to another model")
    _release(model, handle)


def _release(model: nn.Module, handle: OffloadHandle | None) -> None:
    import torch

    from .. import config
    from .profile import memory_point, print_report

    profile = bool(config.setting("profile"))
    points = [memory_point("before release")] if profile else []
    state = get_state(model)
    active = handle or (state.handle if state is not None else None)
    snap = active._remove(profile) if active is not None else None
    if profile:
        points.append(memory_point("hooks removed"))
    unload(model)
    if not getattr(model, _RELEASED_HOOK, None):
        setattr(model, _RELEASED_HOOK, model.register_forward_pre_hook(_refuse_released))
    if profile:
        points.append(memory_point("weights on the meta device"))
    gc.collect()
    if profile:
        points.append(memory_point("after garbage collection"))
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        host_empty = getattr(torch._C, "_host_emptyCache", None)
        if host_empty is not None:
            host_empty()
    _core.trim_heap()
    if profile:
        points.append(memory_point("after release"))
        if snap is not None:
            snap.memory = points
            print_report(snap)


def measure_activation_vram(
    fn: Callable[[], Any], plan: Plan | None = None, *, device: torch.device | str | None = None
) -> int:
    """The peak memory a call needs beyond what was held before it, in bytes.

    On CUDA: the peak allocated device memory during ``fn()`` minus what was allocated before.
    Everything the runtime holds for streaming (device slots, the expansion buffer) is allocated
    when the hooks are installed, so it is in that baseline and is not taken off again; the
    rest is the activations (and whatever else the call allocates). On the CPU: the growth of
    the process's peak resident memory during the call. Pass the result as ``activation_vram=``
    to the next plan for the same model and input size. ``plan`` is accepted for symmetry with
    that call and checked, not used.
    """
    import torch

    from ..device import resolve_device
    from ..plan import Plan

    if not callable(fn):
        raise ArgumentError(f"fn: expected a callable, got {type(fn).__name__}")
    if plan is not None and not isinstance(plan, Plan):
        raise ArgumentError(f"plan: expected a trash_panda.Plan, got {type(plan).__name__}")
    dev = resolve_device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        fn()
        torch.cuda.synchronize(dev)
        return max(0, torch.cuda.max_memory_allocated(dev) - base)
    sampler = _core.RssSampler(1)
    try:
        fn()
    finally:
        start, peak, _end = sampler.stop()
    return max(0, peak - start)
