"""What makes a block runnable on its device: the CPU computes from the staging buffers
themselves (:mod:`.cpu`); a device with memory of its own gets each block copied into a slot
(:mod:`.cuda`, with the copies' bookkeeping in :mod:`.copies`, the loader's in
:mod:`.loader_copies` and pinned host memory in :mod:`.pinning`). Both write expanded tensors
into one buffer (:mod:`.expansion`) and put weights in and out of modules the same way
(:mod:`.swap`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import StreamError
from .cpu import CpuBackend
from .cuda import CudaBackend, DeviceBackend

if TYPE_CHECKING:
    from ..state import ModelState

__all__ = ["Backend", "CpuBackend", "DeviceBackend", "make_backend"]

# What makes a block runnable on its device: the CPU's, or a device with its own memory.
Backend = CpuBackend | DeviceBackend


def make_backend(state: ModelState) -> Backend:
    if state.device.type == "cuda":
        return CudaBackend(state)
    if state.device.type == "cpu":
        return CpuBackend(state)
    raise StreamError(f"device {state.device} is not supported: expected cuda or cpu")
