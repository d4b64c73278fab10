"""The CUDA backend: staged bytes (pinned) go to a device slot on a side stream, then are used in
place there or expanded into the expansion buffer on the compute stream.

Staged tensors are 512-byte aligned (the engine configuration's alignment on a GPU), so every
tensor in the compute dtype is used in place in its slot. A slot is refilled only after an
event recorded when the compute that read it was queued; expansions run on the compute stream,
so one expansion buffer serves every block in turn.
"""

from __future__ import annotations

import ctypes
import time
import warnings
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._dtypes import torch_dtype
from .work import ExpansionBuffer, Timing, resident_offsets, swap

if TYPE_CHECKING:
    import torch

    from .. import _core
    from .state import BlockState, ModelState


@dataclass
class _Inflight:
    lease: Any
    event: Any
    slot: int
    views: list[Any] = field(default_factory=list)


def _clear_cuda_error() -> None:
    """Resets the CUDA runtime's last error after a failed registration, so the next kernel
    launch that torch checks does not report it. Best effort: torch does not expose
    cudaGetLastError, so it is called from the runtime library torch loaded."""
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so", "cudart64_12.dll"):
        try:
            ctypes.CDLL(name).cudaGetLastError()
            return
        except (OSError, AttributeError):
            continue


def _unregister(cudart: Any, addresses: list[int], _engine: Any) -> None:
    # `_engine` is held until here so the buffers outlive their registration.
    for addr in addresses:
        cudart.cudaHostUnregister(addr)
    addresses.clear()


class PinnedRegistration:
    """The staging buffers registered as pinned memory. Unregistered by :meth:`close`, or when
    this object is collected (a model dropped without release()), never before the engine that
    owns the buffers, which the finalizer keeps alive until then."""

    def __init__(self, cudart: Any, engine: _core.Engine, addresses: list[int]) -> None:
        self.addresses = addresses
        self._finalizer = weakref.finalize(self, _unregister, cudart, addresses, engine)

    def close(self) -> None:
        self._finalizer()


def register_pinned(cudart: Any, engine: _core.Engine) -> PinnedRegistration | None:
    """Registers every staging buffer as pinned. When one registration fails, the ones done are
    undone, the CUDA error is cleared, and a warning names the error: copies then go from
    pageable memory (slower, same results). Returns None in that case."""
    done: list[int] = []
    for addr, size in engine.staging_buffers():
        err = cudart.cudaHostRegister(addr, size, 0)
        if int(getattr(err, "value", err)) != 0:
            for a in done:
                cudart.cudaHostUnregister(a)
            _clear_cuda_error()
            name = getattr(err, "name", str(err))
            try:
                message = cudart.cudaGetErrorString(err)
            except Exception:
                message = "no message"
            warnings.warn(
                f"could not pin a {size}-byte staging buffer ({name}: {message}); streamed blocks "
                "are copied from pageable memory, which is slower",
                stacklevel=4,
            )
            return None
        done.append(addr)
    return PinnedRegistration(cudart, engine, done)


def _expand_into(out: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, kind: str) -> None:
    """``out = (w.float() * scale).to(out.dtype)``, computed in place in ``out``: the stored
    values convert exactly into the compute dtype (fp8, or a narrower float), then the scale,
    broadcast through a view, multiplies them in float32 with one rounding, as the reference."""
    import torch

    exact = w.dtype.itemsize < out.dtype.itemsize or w.dtype == out.dtype or w.dtype.itemsize == 1
    if scale is not None and not exact:
        out.copy_(
            (w.to(torch.float32) * scale.to(torch.float32).reshape(_broadcast(scale, w, kind))).reshape(out.shape)
        )
        return
    out.copy_(w.reshape(out.shape))
    if scale is None:
        return
    s = scale if scale.dtype.is_floating_point and scale.dtype.itemsize == 4 else scale.to(torch.float32)
    if kind == "block":
        _mul_blocks(out.reshape(out.shape[0], -1) if out.dim() > 1 else out.reshape(1, -1), s)
    else:
        out.mul_(s.reshape(_broadcast(s, out, kind)))


def _broadcast(scale: torch.Tensor, w: torch.Tensor, kind: str) -> list[int]:
    if kind == "row":
        return [w.shape[0]] + [1] * (w.dim() - 1) if w.dim() > 1 else [-1]
    return [1] * max(w.dim(), 1)


def _mul_blocks(out: torch.Tensor, s: torch.Tensor, block: int = 128) -> None:
    """Multiplies a [rows, cols] tensor by one scale per 128x128 tile, through views: whole tiles
    at once, then the partial edge strips."""
    rows, cols = out.shape
    rf, cf = rows // block * block, cols // block * block
    a, b = rf // block, cf // block
    if a and b:
        out[:rf, :cf].unflatten(0, (a, block)).unflatten(2, (b, block)).mul_(s[:a, :b].reshape(a, 1, b, 1))
    if rf < rows and b:
        out[rf:, :cf].unflatten(1, (b, block)).mul_(s[a, :b].reshape(1, b, 1))
    if cf < cols and a:
        out[:rf, cf:].unflatten(0, (a, block)).mul_(s[:a, b].reshape(a, 1, 1))
    if rf < rows and cf < cols:
        out[rf:, cf:].mul_(s[a, b])


def _typed(dev: torch.Tensor, offset: int, length: int, header: str, shape: tuple[int, ...]) -> torch.Tensor:
    return dev[offset : offset + length].view(torch_dtype(header)).reshape(shape)


class CudaBackend:
    def __init__(self, state: ModelState) -> None:
        import torch

        self.state = state
        self.device = state.device
        self.stream = torch.cuda.Stream(self.device)
        self.live: dict[int, _Inflight | None] = {}
        self.slots: list[torch.Tensor] = []
        self.layouts: dict[int, list[_core.StagedTensor]] = {}
        self.offsets: dict[int, list[int | None]] = {}
        self.slot_free: list[Any] = []  # an event recorded when the slot's last reader finished
        self.next_slot = 0
        self.pinned: PinnedRegistration | None = None
        config = state.config
        self.expansion = ExpansionBuffer(config.expansion_bytes, self.device)
        if state.engine is not None:
            self.pinned = register_pinned(torch.cuda.cudart(), state.engine)
            for _ in range(config.device_slots):
                self.slots.append(torch.empty(config.staging_buffer_bytes, dtype=torch.uint8, device=self.device))
                self.slot_free.append(None)

    def bring(self, block: BlockState) -> Timing:
        import torch
        from torch.utils.dlpack import from_dlpack

        timing = Timing()
        if block.engine_index is None:
            offsets = self.offsets.get(block.index)
            if offsets is None:
                offsets = self.offsets[block.index] = resident_offsets(self.state.config, block)
            for spec, at in zip(block.work, offsets, strict=True):
                assert spec.resident is not None and at is not None
                out = self.expansion.view(at, spec.shape, spec.target)
                _expand_into(out, spec.resident, spec.resident_scale, spec.scale_kind)
                swap(spec, out)
            self.live[block.index] = None
            return timing
        assert self.state.engine is not None
        compute = torch.cuda.current_stream(self.device)
        layout = self.layouts.get(block.engine_index)
        if layout is None:
            layout = self.layouts[block.engine_index] = self.state.engine.layout(block.engine_index)
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
        for spec in block.work:
            assert spec.staged_index is not None
            st = layout[spec.staged_index]
            w = _typed(dev, st.offset, st.length, st.dtype, tuple(st.shape))
            if st.expand_at is None:
                swap(spec, w)
                continue
            scale = None
            if st.own_scale is not None:
                scale = _typed(dev, st.own_scale[0], st.own_scale[1], "F32", (st.own_scale[1] // 4,))
            elif st.scale_index is not None:
                sc = layout[st.scale_index]
                scale = _typed(dev, sc.offset, sc.length, sc.dtype, tuple(sc.shape))
            out = self.expansion.view(st.expand_at, spec.shape, spec.target)
            _expand_into(out, w, scale, st.scale_layout or "none")
            swap(spec, out)
        self.live[block.index] = _Inflight(lease=lease, event=event, slot=slot, views=[host])
        return timing

    def done(self, block: BlockState) -> None:
        import torch

        for spec in block.work:
            swap(spec, None)
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
        if self.pinned is not None:
            self.pinned.close()
        self.slots.clear()
        self.expansion.free()
