"""``handle.release_gpu()`` and ``handle.restore_gpu()``: a loaded model's weights leave the GPU
for host memory and come back, while the hooks, the engine and the plan stay as they are.

What moves is every tensor of the model held in the device's memory: the resident blocks (the
weights their modules hold, and the stored forms the hooks expand before each run), the weights
outside the blocks, and the buffers. They move storage by storage, so weights tied together,
views of one storage and fp8 stored forms with their scales come back exactly as they were
(same device, dtype, storage, offsets and strides), and each tensor object keeps its identity:
only its ``.data`` changes. The device slots and the expansion buffer of the streamed blocks stay
(``kept_device_bytes``): they are the hooks' working memory, sized by the plan, and small beside
the weights.

The host copy is one buffer, registered as pinned memory on CUDA (like the staging buffers), so
the way back is one fast copy per storage; when it cannot be pinned it is pageable, with a
warning, and the copies are slower. Copies run on the device's copy stream, after the compute
queued so far, and the device is synchronized before any side is used or freed.

A model released from the GPU restores itself on its next call: a gate named
:data:`GPU_RELEASED` in the model's registry, there only while it is released, runs
``restore_gpu()`` first, from the model's own pre-hook, those of the modules outside the blocks,
or a block's (a block called on its own). A restore that does not fit raises there, naming the
model, and leaves it released. ``handle.remove()`` restores first; ``release()`` drops the host
copy instead. Restoring on the call rather than refusing it: the gate is one more named hook,
there only while released (nothing on the hot path otherwise), and a caller who needs to know
the cost, or to restore at a moment of its choosing, calls ``restore_gpu()`` first.

Call them between calls of the model, not from inside one. Tensors a model keeps as plain
attributes (neither parameters nor buffers: a cache made on first use, say) are not seen, and stay
where they are.

Both are no-ops where nothing is in device memory of its own (the CPU: its "device" memory is
RAM already), and when the model is already in the state asked for. The moves themselves take
the two sides as a :class:`Memory`, so the CPU test suite runs them through a simulated device
(tests/offload/test_gpu_swap.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from .. import _core
from ..errors import ArgumentError, StreamError
from ..log import logger
from .meter import paused
from .registry import BlockHook

if TYPE_CHECKING:
    import torch
    from torch import nn

    from .backends.copies import Device
    from .backends.pinning import PinnedRegistration
    from .handle import OffloadHandle
    from .registry import HookRegistry
    from .state import BlockState, ModelState

__all__ = ["GPU_RELEASED", "GpuSwap", "HostCopy", "Memory", "release_gpu", "restore_gpu", "weights_on_device"]

# The name, in the model's hook registry, of the gate that restores a model released from the GPU.
GPU_RELEASED = "gpu_released"
# Each storage's place in the host buffer: 64-byte aligned, so every dtype's view of it is valid
# and CPU kernels reading a host copy take their aligned paths.
ALIGN = 64
PAGE = 4096


@dataclass(frozen=True)
class GpuSwap:
    """What one ``release_gpu()`` or ``restore_gpu()`` did, for a runner or a benchmark to report.

    ``changed`` is False for a no-op (the CPU, or already in that state): then nothing moved."""

    action: str  # "release_gpu" or "restore_gpu"
    changed: bool
    bytes: int = 0  # bytes copied (each storage once)
    storages: int = 0
    seconds: float = 0.0
    host_bytes: int = 0  # host RAM holding the weights from now on (0 once restored)
    pinned: bool = False  # the host copy is pinned memory (the fast way back)
    device_bytes: int = 0  # the model's weights in device memory after it
    kept_device_bytes: int = 0  # the device slots and the expansion buffer, which stay

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


class HostCopy:
    """The host buffer the weights live in while released; :meth:`close` unpins it (the tensors
    that view it keep its memory alive until they are moved or dropped)."""

    def __init__(
        self, data: torch.Tensor, registration: PinnedRegistration | None = None, pinned: bool = False
    ) -> None:
        self.data = data  # uint8
        self.registration = registration
        self.pinned = pinned or registration is not None

    def close(self) -> None:
        if self.registration is not None:
            self.registration.close()
            self.registration = None


class Memory(Protocol):
    """The two sides a swap moves bytes between, and the device that copies them."""

    device: Device  # copy(), compute_done(), synchronize() (copy_pipeline's protocol)

    def holds(self, t: torch.Tensor) -> bool:
        """Whether ``t`` is in the device's memory."""

    def device_buffer(self, nbytes: int) -> torch.Tensor:
        """``nbytes`` of device memory (uint8); raises when it has not that much."""

    def host_buffer(self, nbytes: int) -> HostCopy:
        """``nbytes`` of host memory (uint8), pinned where it can be."""

    def empty_cache(self) -> None:
        """Returns the device memory just freed to the device (torch's cache of it)."""


def _cuda(where: torch.device) -> torch.device:
    """``where`` with its index: a tensor's device always has one."""
    import torch

    return torch.device("cuda", where.index if where.index is not None else torch.cuda.current_device())


class CudaMemory:
    """A CUDA GPU and pinned host memory."""

    def __init__(self, where: torch.device, device: Device) -> None:
        self.where = _cuda(where)
        self.device = device

    def holds(self, t: torch.Tensor) -> bool:
        return t.device == self.where

    def device_buffer(self, nbytes: int) -> torch.Tensor:
        import torch

        return torch.empty(nbytes, dtype=torch.uint8, device=self.where)

    def host_buffer(self, nbytes: int) -> HostCopy:
        import torch

        from .backends.pinning import register_ranges

        # Page-aligned, as cudaHostRegister is happiest with: a page more, and a view from the
        # first page boundary.
        size = -(-max(nbytes, 1) // PAGE) * PAGE
        raw = torch.empty(size + PAGE, dtype=torch.uint8)
        at = -raw.data_ptr() % PAGE
        data = raw[at : at + size]
        fallback = "the weights wait in pageable memory, and restore_gpu() copies them back more slowly"
        registration = register_ranges(torch.cuda.cudart(), data, [(data.data_ptr(), size)], fallback)
        return HostCopy(data[:nbytes], registration)

    def empty_cache(self) -> None:
        from .backends.cuda import empty_cuda_caches

        empty_cuda_caches()


@dataclass
class _Storage:
    """One storage the model's tensors view, and those tensors."""

    nbytes: int
    raw: torch.Tensor  # uint8 over the whole storage, on the side it is on now
    users: list[tuple[torch.Tensor, int]] = field(default_factory=list)  # and its offset in the storage
    at: int = 0  # offset in the host buffer


def _tensors(model: nn.Module, state: ModelState) -> list[torch.Tensor]:
    """Every tensor the model and its hooks hold, each once: parameters, buffers, and the stored
    forms of resident blocks expanded before each run."""
    found: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for t in (*module._parameters.values(), *module._buffers.values()):
            if t is not None:
                found.setdefault(id(t), t)
    for block in state.blocks:
        for spec in block.tensors:
            for t in (spec.resident, spec.resident_scale):
                if t is not None:
                    found.setdefault(id(t), t)
    return [t for t in found.values() if not t.is_meta]


def _storages(model: nn.Module, state: ModelState, holds: Callable[[torch.Tensor], bool]) -> list[_Storage]:
    import torch

    by_storage: dict[tuple[int, int], _Storage] = {}
    for t in _tensors(model, state):
        if not holds(t):
            continue
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        key = (ptr, storage.nbytes()) if ptr else (id(t), 0)  # empty storages share address 0
        found = by_storage.get(key)
        if found is None:
            raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
            found = by_storage[key] = _Storage(storage.nbytes(), raw)
        found.users.append((t, int(t.storage_offset())))
    return list(by_storage.values())


def weights_on_device(model: nn.Module, memory: Memory | None = None) -> int:
    """The bytes of the model's tensors (see the module) in the device's memory, each storage
    once: what ``release_gpu()`` moves and ``restore_gpu()`` brings back (0 on the CPU)."""
    from .state import get_state

    state = get_state(model)
    if state is None:
        return 0
    holds = memory.holds if memory is not None else None
    if holds is None and state.device.type == "cuda":
        where = _cuda(state.device)

        def holds(t: torch.Tensor) -> bool:
            return t.device == where

    if holds is None:
        return 0
    return sum(s.nbytes for s in _storages(model, state, holds))


def _rebind(storages: list[_Storage], to: list[torch.Tensor]) -> None:
    """Points every user of each storage at the same place in its new storage."""
    import torch

    for s, new in zip(storages, to, strict=True):
        target = new.untyped_storage()
        base = new.storage_offset()  # bytes: `new` is uint8
        for t, offset in s.users:
            # set_ grows a storage too small for the view it is asked for, silently: the offset
            # is the one in the original storage, never the one in the storage it views now.
            t.data = torch.empty(0, dtype=t.dtype, device=new.device).set_(
                target, base // t.element_size() + offset, t.size(), t.stride()
            )


def _copy_all(memory: Memory, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Copies each (dst, src) on the copy stream after the compute queued so far (a storage
    freed by it may be the one just allocated), then waits for them all."""
    after = memory.device.compute_done()
    for dst, src in pairs:
        memory.device.copy(dst, src, after)
    memory.device.synchronize()


class GpuReleased(BlockHook):
    """The gate of a model released from the GPU: its next call (the model's, an outside
    module's, or a block's on its own) restores it first. It holds the host copy."""

    name = GPU_RELEASED
    gate = True

    def __init__(
        self, handle: OffloadHandle, memory: Memory, storages: list[_Storage], host: HostCopy, kept: int
    ) -> None:
        self.handle = handle
        self.memory = memory
        self.storages = storages
        self.host: HostCopy | None = host
        self.kept = kept

    def attach(self, registry: HookRegistry) -> None:
        state = self.handle.state
        for module in (self.handle.model, *state.outside_modules.values()):
            registry.on_module_start(self, module, self.restore)

    def pre_forward(self, block: BlockState) -> None:
        self.restore()

    def restore(self) -> None:
        result = restore_gpu(self.handle)
        logger.info(
            "%s restored to the GPU on its call: %d bytes in %.3f s",
            type(self.handle.model).__name__,
            result.bytes,
            result.seconds,
        )

    @property
    def host_bytes(self) -> int:
        return 0 if self.host is None else int(self.host.data.numel())

    @property
    def pinned(self) -> bool:
        return self.host is not None and self.host.pinned

    def close(self) -> None:
        # Taken off once restored, or without a restore by release(), which unloads the model:
        # the host copy is unpinned and forgotten here (tensors still viewing it keep it alive).
        if self.host is not None:
            self.host.close()
        self.host = None
        self.storages = []


def _memory_for(state: ModelState, handle: OffloadHandle | None) -> Memory | None:
    """The CUDA device's two sides; None where the device's memory is the host's."""
    if state.device.type != "cuda":
        return None
    from .backends.copies import CudaDevice
    from .backends.cuda import DeviceBackend

    backend = handle.backend if handle is not None else None
    device = backend.device if isinstance(backend, DeviceBackend) else CudaDevice(state.device)
    return CudaMemory(state.device, device)


def _check(handle: OffloadHandle, what: str) -> None:
    if handle.removed:
        raise ArgumentError(f"handle: its hooks were removed; {what}() needs installed hooks")


def _wait_for_loader(handle: OffloadHandle) -> None:
    """A model still read by ``stage(overlap=True)``'s loader would get weights on the device
    after they moved: the loader finishes first, unless it waits for memory a pipeline gives it,
    which a release must not wait for."""
    loader = handle.state.loader
    if loader is None or loader.done:
        return
    if loader.allowance is not None:
        raise StreamError(
            f"{type(handle.model).__name__} is still being loaded ahead of its turn; release_gpu() can run "
            "once its load is done (after its first run)"
        )
    loader.join()


def release_gpu(handle: OffloadHandle, memory: Memory | None = None) -> GpuSwap:
    """``handle.release_gpu()`` (see the module); ``memory``: the two sides (the device's by
    default; tests pass a simulated device's)."""
    _check(handle, "release_gpu")
    released = handle.hooks.get(GPU_RELEASED)
    if isinstance(released, GpuReleased):
        return GpuSwap("release_gpu", False, host_bytes=released.host_bytes, pinned=released.pinned)
    memory = memory if memory is not None else _memory_for(handle.state, handle)
    if memory is None:
        return GpuSwap("release_gpu", False)
    _wait_for_loader(handle)
    import torch

    # Normal tensors even when the model is called under inference_mode (an automatic restore):
    # the model's weights must stay usable outside it. Weights moved are no open measurement's
    # activations.
    with paused(), torch.inference_mode(False):
        return _release(handle, memory)


def _release(handle: OffloadHandle, memory: Memory) -> GpuSwap:
    from .backends.cuda import DeviceBackend

    start = time.perf_counter()
    storages = _storages(handle.model, handle.state, memory.holds)
    at = 0
    for s in storages:
        s.at = at
        at += -(-s.nbytes // ALIGN) * ALIGN
    host = memory.host_buffer(at)
    try:
        views = [host.data[s.at : s.at + s.nbytes] for s in storages]
        _copy_all(memory, [(v, s.raw) for v, s in zip(views, storages, strict=True)])
        # The bytes are on the host: every user views them there, and the device's go.
        _rebind(storages, views)
    except BaseException:
        host.close()
        raise
    for s, v in zip(storages, views, strict=True):
        s.raw = v
    memory.empty_cache()
    backend = handle.backend
    kept = backend.device_bytes() if isinstance(backend, DeviceBackend) else 0
    hook = GpuReleased(handle, memory, storages, host, kept)
    handle.hooks.add(hook)  # at its rank: before every hook that reads the weights
    return GpuSwap(
        "release_gpu",
        True,
        bytes=sum(s.nbytes for s in storages),
        storages=len(storages),
        seconds=time.perf_counter() - start,
        host_bytes=hook.host_bytes,
        pinned=hook.pinned,
        device_bytes=weights_on_device(handle.model, memory),
        kept_device_bytes=kept,
    )


def restore_gpu(handle: OffloadHandle) -> GpuSwap:
    """``handle.restore_gpu()`` (see the module)."""
    _check(handle, "restore_gpu")
    hook = handle.hooks.get(GPU_RELEASED)
    if not isinstance(hook, GpuReleased):
        return GpuSwap("restore_gpu", False)
    import torch

    with paused(), torch.inference_mode(False):
        return _restore(handle, hook)


def _restore(handle: OffloadHandle, hook: GpuReleased) -> GpuSwap:
    start = time.perf_counter()
    assert hook.host is not None
    memory, storages, host = hook.memory, hook.storages, hook.host.data
    moved = sum(s.nbytes for s in storages)
    # Every allocation first: one that fails leaves the model released, nothing half back.
    device: list[torch.Tensor] = []
    try:
        for s in storages:
            device.append(memory.device_buffer(s.nbytes))
    except Exception as e:
        device.clear()
        memory.empty_cache()
        raise StreamError(
            f"{type(handle.model).__name__} cannot go back to the GPU: its {moved / 1e9:.2f} GB of weights do "
            f"not fit beside what the device holds now ({e}); free memory (release another model, or "
            "release_gpu() it) and call restore_gpu() again; the model stays in host memory meanwhile"
        ) from e
    _copy_all(memory, [(d, host[s.at : s.at + s.nbytes]) for s, d in zip(storages, device, strict=True)])
    _rebind(storages, device)
    del host
    # The copies are done: the gate goes, and with it the host copy (unpinned, then freed).
    handle.hooks.remove(GPU_RELEASED)
    _core.trim_heap()
    return GpuSwap(
        "restore_gpu",
        True,
        bytes=moved,
        storages=len(storages),
        seconds=time.perf_counter() - start,
        device_bytes=weights_on_device(handle.model, memory),
        kept_device_bytes=hook.kept,
    )
