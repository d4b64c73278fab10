"""Device backends: how a block's weights become runnable before it runs and go after.

Both backends take a staged block from the engine (streamed blocks) or the block's stored tensors
(resident blocks whose stored dtype differs from the compute dtype), expand them into tensors of
the compute dtype, and put those into the block's modules; after the block they put the meta
placeholders back, so only the running block (and the staged look-ahead) is expanded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._dtypes import core_name, torch_dtype
from ..errors import StreamError

if TYPE_CHECKING:
    import torch

    from .state import BlockState, ModelState, TensorSpec


# The alignment of torch's CPU allocations, and a safe one for CUDA kernels (its caching
# allocator hands out 512-byte aligned blocks).
TORCH_ALIGN = 64
CUDA_ALIGN = 512


@dataclass
class Timing:
    """Where the main thread's time went for one block."""

    staged_wait: float = 0.0  # waiting for the engine to stage the block
    gpu_wait: float = 0.0  # waiting for a host-to-device copy
    bytes: int = 0


def _swap(spec: TensorSpec, tensor: torch.Tensor | None) -> None:
    from torch import nn

    param = spec.placeholder if tensor is None else nn.Parameter(tensor, requires_grad=False)
    for module, attr in spec.owners:
        module._parameters[attr] = param


class SlotPool:
    """Reusable compute-dtype tensors for expanded blocks.

    Memory touched for the first time is slow to write, so expansions go into tensors that are
    kept and reused; the free ones are capped at ``cap`` bytes, oldest dropped first, so a model
    whose blocks all differ in shape does not end up with every block expanded.
    """

    def __init__(self, device: torch.device, cap: int) -> None:
        self.device = device
        self.cap = cap
        self.free: list[tuple[Any, list[torch.Tensor], int]] = []

    def take(self, signature: Any) -> list[torch.Tensor]:
        import torch

        for i, (sig, tensors, _n) in enumerate(self.free):
            if sig == signature:
                del self.free[i]
                return tensors
        return [torch.empty(shape, dtype=dtype, device=self.device) for shape, dtype in signature]

    def give(self, signature: Any, tensors: list[torch.Tensor]) -> None:
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        self.free.append((signature, tensors, nbytes))
        while sum(n for _s, _t, n in self.free) > self.cap and len(self.free) > 1:
            self.free.pop(0)

    def clear(self) -> None:
        self.free.clear()


class CpuBackend:
    """The CPU computes. A streamed tensor already in the compute dtype is used in place, as a view
    of its staging buffer (the lease is held until the block has run); the others are expanded by
    the core straight into reused tensors of the compute dtype."""

    def __init__(self, state: ModelState) -> None:
        self.state = state
        biggest = max((_expanded_bytes(b) for b in state.blocks if b.needs_hooks), default=0)
        self.pool = SlotPool(state.device, cap=2 * biggest)
        self.live: dict[int, tuple[Any, list[torch.Tensor], Any]] = {}
        self.split: dict[int, tuple[list[TensorSpec], list[TensorSpec], Any]] = {}

    def _split(self, block: BlockState) -> tuple[list[TensorSpec], list[TensorSpec], Any]:
        """(tensors used in place, tensors to expand, the slot signature of those) of a block."""
        found = self.split.get(block.index)
        if found is None:
            views: list[TensorSpec] = []
            expand: list[TensorSpec] = []
            layout = None
            if block.engine_index is not None and self.state.engine is not None:
                layout = self.state.engine.layout(block.engine_index)
            for spec in block.work:
                in_place = False
                if layout is not None and spec.staged_index is not None and spec.scale is None:
                    _n, offset, _l, staged_dtype, _shape, own_scale = layout[spec.staged_index]
                    # CPU kernels pick their code path by the weight's alignment (a Linear on an
                    # 8-byte aligned weight rounds differently), so only a view aligned like torch's
                    # own allocations is used in place. Staging buffers start page-aligned.
                    in_place = (own_scale is None and torch_dtype(staged_dtype) == spec.target
                                and offset % TORCH_ALIGN == 0)
                (views if in_place else expand).append(spec)
            signature = tuple((t.shape, t.target) for t in expand)
            found = self.split[block.index] = (views, expand, signature)
        return found

    def bring(self, block: BlockState) -> Timing:
        from torch.utils.dlpack import from_dlpack

        timing = Timing()
        views, expand, signature = self._split(block)
        slots = self.pool.take(signature)
        lease = None
        try:
            if block.engine_index is not None:
                assert self.state.engine is not None
                lease = self.state.engine.acquire(block.engine_index)
                timing.staged_wait = lease.waited
                if expand:
                    lease.expand_into([_item(spec, out) for spec, out in zip(expand, slots)])
                for spec in views:
                    assert spec.staged_index is not None
                    raw = from_dlpack(lease.view(spec.staged_index))
                    _swap(spec, raw.view(spec.target).reshape(spec.shape))
                timing.bytes = sum(s.info.nbytes for s in block.work)
                if not views:
                    lease.release()
                    lease = None
            else:
                from .. import dtype as kernels

                for spec, out in zip(expand, slots):
                    assert spec.resident is not None
                    scale = spec.resident_scale
                    if scale is not None and spec.scale_kind == "row":
                        scale = scale.reshape(-1, 1)
                    kernels.expand(spec.resident, spec.target, scale, out=out)
        except BaseException:
            for spec in views:
                _swap(spec, None)
            if lease is not None:
                lease.release()
            self.pool.give(signature, slots)
            raise
        for spec, out in zip(expand, slots):
            _swap(spec, out)
        self.live[block.index] = (signature, slots, lease)
        return timing

    def done(self, block: BlockState) -> None:
        for spec in block.work:
            _swap(spec, None)
        entry = self.live.pop(block.index, None)
        if entry is not None:
            signature, slots, lease = entry
            self.pool.give(signature, slots)
            if lease is not None:
                lease.release()  # the views are gone with the placeholders back

    def close(self) -> None:
        for index in list(self.live):
            self.done(self.state.blocks[index])
        self.pool.clear()


def _expanded_bytes(block: BlockState) -> int:
    import math

    return sum(math.prod(t.shape) * t.target.itemsize for t in block.work)


def _item(spec: TensorSpec, out: torch.Tensor) -> tuple[Any, ...]:
    import torch

    rows, cols = spec.rows_cols
    return (spec.staged_index, out.reshape(-1).view(torch.uint8), core_name(spec.target), rows, cols,
            spec.scale_index, spec.scale_kind, 128)


def _expand_on_device(w: torch.Tensor, scale: torch.Tensor | None, kind: str, target: torch.dtype,
                      rows: int, cols: int) -> torch.Tensor:
    """``(w.float() * scale).to(target)`` with the scale laid out for ``kind``, in torch ops."""
    import torch

    if scale is None:
        return w.to(target)
    s = scale.to(torch.float32)
    if kind == "row":
        s = s.reshape(rows, *([1] * (w.dim() - 1))) if w.dim() > 1 else s.reshape(-1)
    elif kind == "block":
        full = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
        return (w.to(torch.float32).reshape(rows, cols) * full).to(target).reshape(w.shape)
    else:
        s = s.reshape(())
    return (w.to(torch.float32) * s).to(target)


@dataclass
class _Inflight:
    lease: Any
    event: Any
    slot: int
    views: list[Any] = field(default_factory=list)


class CudaBackend:
    """A CUDA GPU computes: staged bytes (pinned) are copied on a side stream, then expanded.

    The engine's staging buffers are registered as pinned memory once. A block's bytes go to one
    of ``lookahead + 1`` device byte slots in one copy on the side stream; the compute stream
    waits for that copy's event, expands (or views, when no expansion is needed) each tensor,
    and runs the block. A slot is reused only after the compute that read it has finished.
    """

    def __init__(self, state: ModelState) -> None:
        import torch

        self.state = state
        self.device = state.device
        self.stream = torch.cuda.Stream(self.device)
        self.live: dict[int, _Inflight | None] = {}
        self.slots: list[torch.Tensor] = []
        self.slot_base: list[int] = []
        self.layouts: dict[int, Any] = {}  # engine block -> its staged layout, asked for once
        self.slot_free: list[Any] = []  # an event recorded when the slot's last reader finished
        self.next_slot = 0
        engine = state.engine
        if engine is not None:
            cudart = torch.cuda.cudart()
            for addr, size in engine.staging_buffers():
                err = cudart.cudaHostRegister(addr, size, 0)
                if int(err) != 0:
                    raise StreamError(f"cudaHostRegister of a {size}-byte staging buffer failed ({err})")
                state.pinned.append((addr, size))
            size = max(size for _a, size in engine.staging_buffers())
            for _ in range(state.lookahead + 1):
                self.slots.append(torch.empty(size, dtype=torch.uint8, device=self.device))
                self.slot_free.append(None)
        self.slot_base = [t.data_ptr() for t in self.slots]

    def bring(self, block: BlockState) -> Timing:
        import torch

        timing = Timing()
        compute = torch.cuda.current_stream(self.device)
        work = block.work
        if block.engine_index is None:
            for spec in work:
                rows, cols = spec.rows_cols
                assert spec.resident is not None
                _swap(spec, _expand_on_device(spec.resident, spec.resident_scale, spec.scale_kind, spec.target,
                                              rows, cols))
            self.live[block.index] = None
            return timing
        from torch.utils.dlpack import from_dlpack

        assert self.state.engine is not None
        lease = self.state.engine.acquire(block.engine_index)
        timing.staged_wait = lease.waited
        host = from_dlpack(lease.block_bytes())
        slot = self.next_slot
        self.next_slot = (slot + 1) % len(self.slots)
        dev = self.slots[slot][: host.numel()]
        t0 = time.perf_counter()
        with torch.cuda.stream(self.stream):
            if self.slot_free[slot] is not None:
                self.stream.wait_event(self.slot_free[slot])
            dev.copy_(host, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        compute.wait_event(event)
        timing.gpu_wait = time.perf_counter() - t0
        timing.bytes = host.numel()
        layout = self.layouts.get(block.engine_index)
        if layout is None:
            layout = self.layouts[block.engine_index] = self.state.engine.layout(block.engine_index)
        for spec in work:
            assert spec.staged_index is not None
            _name, offset, length, staged_dtype, shape, own_scale = layout[spec.staged_index]
            w = _typed(dev, offset, length, staged_dtype, tuple(shape))
            scale, kind = None, spec.scale_kind
            if own_scale is not None:  # quantized by the engine on load (storage_dtype="fp8")
                scale, kind = _typed(dev, own_scale[0], own_scale[1], "F32", (own_scale[1] // 4,)), "row"
            elif spec.scale_index is not None:
                _n, s_off, s_len, s_dtype, s_shape, _s = layout[spec.scale_index]
                scale = _typed(dev, s_off, s_len, s_dtype, tuple(s_shape))
            rows, cols = spec.rows_cols
            if scale is None and w.dtype == spec.target:
                # A view of the slot when aligned like the allocator's own blocks (cuBLAS picks
                # kernels by alignment); otherwise a copy, so results match a resident model's.
                _swap(spec, w if (self.slot_base[slot] + offset) % CUDA_ALIGN == 0 else w.clone())
            else:
                _swap(spec, _expand_on_device(w, scale, kind, spec.target, rows, cols))
        self.live[block.index] = _Inflight(lease=lease, event=event, slot=slot, views=[host])
        return timing

    def done(self, block: BlockState) -> None:
        import torch

        for spec in block.work:
            _swap(spec, None)
        inflight = self.live.pop(block.index, None)
        if inflight is None:
            return
        # The slot may be refilled once the compute queued so far (this block) is done with it.
        finished = torch.cuda.Event()
        finished.record(torch.cuda.current_stream(self.device))
        self.slot_free[inflight.slot] = finished
        inflight.event.synchronize()  # the copy out of the pinned buffer is complete
        inflight.views.clear()
        inflight.lease.release()

    def close(self) -> None:
        import torch

        for index in list(self.live):
            self.done(self.state.blocks[index])
        torch.cuda.synchronize(self.device)
        cudart = torch.cuda.cudart()
        for addr, _size in self.state.pinned:
            cudart.cudaHostUnregister(addr)
        self.state.pinned.clear()
        self.slots.clear()


def _typed(dev: torch.Tensor, offset: int, length: int, header: str, shape: tuple[int, ...]) -> torch.Tensor:
    return dev[offset : offset + length].view(torch_dtype(header)).reshape(shape)


def make_backend(state: ModelState) -> CpuBackend | CudaBackend:
    if state.device.type == "cuda":
        return CudaBackend(state)
    if state.device.type == "cpu":
        return CpuBackend(state)
    raise StreamError(f"device {state.device} is not supported: expected cuda or cpu")
