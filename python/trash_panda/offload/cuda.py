"""The CUDA backend: staged bytes (pinned) go to a device slot on a side stream, then are used in
place there or expanded into the expansion buffer on the compute stream.

Staged tensors are 512-byte aligned (the engine configuration's alignment on a GPU), so every
tensor in the compute dtype is used in place in its slot. The slots and the copies in flight are
:mod:`.device`'s bookkeeping, which the test suite drives with a simulated device; expansions
run on the compute stream, so one expansion buffer serves every block in turn.
"""

from __future__ import annotations

import ctypes
import warnings
import weakref
from typing import TYPE_CHECKING, Any

from .._dtypes import torch_dtype
from .device import CopyPipeline, CudaDevice, Device
from .work import ExpansionBuffer, Timing, swap

if TYPE_CHECKING:
    import torch

    from .. import _core
    from .state import BlockState, ModelState


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


def register_pinned(cudart: Any, engine: _core.Engine, ram_tier: bool = False) -> PinnedRegistration | None:
    """Registers every staging buffer as pinned, and with ``ram_tier`` the in-memory RAM tier's
    blocks too. When one registration fails, the ones done are undone, the CUDA error is
    cleared, and a warning names the error: copies then go from pageable memory (slower, same
    results). Returns None in that case."""
    done: list[int] = []
    ranges = engine.staging_buffers() + (engine.ram_image_buffers() if ram_tier else [])
    for addr, size in ranges:
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
                f"could not pin {size} bytes of host memory ({name}: {message}); streamed blocks "
                "are copied from pageable memory, which is slower",
                stacklevel=4,
            )
            return None
        done.append(addr)
    return PinnedRegistration(cudart, engine, done)


def _expand_into(out: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, kind: str) -> None:
    """``out = (w.float() * scale).to(out.dtype)``, computed in ``out`` with no other memory: the
    scale, broadcast through a view, multiplies in float32 and the result is rounded once into
    ``out``, as the reference."""
    import torch

    if scale is None:
        out.copy_(w.reshape(out.shape))
        return
    s = scale if scale.dtype == torch.float32 else scale.to(torch.float32)
    src = w.reshape(out.shape)
    if w.dtype.itemsize == 1:
        # fp8 has no arithmetic of its own; it converts exactly into every compute dtype, so it
        # is converted in place first and multiplied there.
        out.copy_(src)
        src = out
    # torch reads the values, computes in float32 (the scale's dtype) and writes the compute
    # dtype once: no float32 copy of the tensor, which the plan would have to count.
    if kind == "block":
        _mul_blocks(_as_2d(out), s, _as_2d(src))
    else:
        torch.mul(src, s.reshape(_broadcast(s, out, kind)), out=out)


def _as_2d(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], -1) if t.dim() > 1 else t.reshape(1, -1)


def _broadcast(scale: torch.Tensor, w: torch.Tensor, kind: str) -> list[int]:
    if kind == "row":
        return [w.shape[0]] + [1] * (w.dim() - 1) if w.dim() > 1 else [-1]
    return [1] * max(w.dim(), 1)


def _mul_blocks(out: torch.Tensor, s: torch.Tensor, src: torch.Tensor, block: int = 128) -> None:
    """``out = src * s`` for a [rows, cols] tensor with one scale per 128x128 tile, through
    views: whole tiles at once, then the partial edge strips (``src`` may be ``out``)."""
    import torch

    rows, cols = out.shape
    rf, cf = rows // block * block, cols // block * block
    a, b = rf // block, cf // block
    if a and b:
        tiles = (slice(0, rf), slice(0, cf))
        shaped = [t[tiles].unflatten(0, (a, block)).unflatten(2, (b, block)) for t in (out, src)]
        torch.mul(shaped[1], s[:a, :b].reshape(a, 1, b, 1), out=shaped[0])
    if rf < rows and b:
        edge = (slice(rf, rows), slice(0, cf))
        torch.mul(src[edge].unflatten(1, (b, block)), s[a, :b].reshape(1, b, 1), out=out[edge].unflatten(1, (b, block)))
    if cf < cols and a:
        edge = (slice(0, rf), slice(cf, cols))
        torch.mul(src[edge].unflatten(0, (a, block)), s[:a, b].reshape(a, 1, 1), out=out[edge].unflatten(0, (a, block)))
    if rf < rows and cf < cols:
        # A 1x1 tensor, not a 0-d one: a 0-d float32 would not lift a float16 product to float32.
        torch.mul(src[rf:, cf:], s[a, b].reshape(1, 1), out=out[rf:, cf:])


def _typed(dev: torch.Tensor, offset: int, length: int, header: str, shape: tuple[int, ...]) -> torch.Tensor:
    return dev[offset : offset + length].view(torch_dtype(header)).reshape(shape)


class DeviceBackend:
    """A device with its own memory computes: each streamed block's bytes are copied into a
    device slot by a :class:`CopyPipeline` (several copies in flight), then used in place there or
    expanded into the expansion buffer on the compute stream."""

    def __init__(self, state: ModelState, device: Device, expansion_device: torch.device) -> None:
        self.state = state
        self.device = device
        self.layouts: dict[int, list[_core.StagedTensor]] = {}
        self.pending: list[tuple[Timing, Any, Any]] = []  # (timing, compute mark, copy event)
        config = state.config
        self.expansion = ExpansionBuffer(config.expansion_bytes, expansion_device, config)
        self.pipeline: CopyPipeline | None = None
        if state.engine is not None:
            self.pipeline = CopyPipeline(
                device,
                state.engine,
                config.device_slots,
                config.staging_buffer_bytes,
                config.staging_buffers,
                config.lookahead,
                direct=config.pin_ram_tier,
            )

    def bring(self, block: BlockState) -> Timing:
        timing = Timing()
        if block.engine_index is None:
            for spec, out in self.expansion.resident(block):
                assert spec.resident is not None
                _expand_into(out, spec.resident, spec.resident_scale, spec.scale_kind)
                swap(spec, out)
            return timing
        assert self.state.engine is not None and self.pipeline is not None
        layout = self.layouts.get(block.engine_index)
        if layout is None:
            layout = self.layouts[block.engine_index] = self.state.engine.layout(block.engine_index)
        taken = self.pipeline.take(block.engine_index)
        timing.staged_wait = taken.staged_wait
        timing.bytes = taken.nbytes
        if taken.mark is not None:
            self.pending.append((timing, taken.mark, taken.copy_event))
        dev = taken.slot
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
        return timing

    def done(self, block: BlockState) -> None:
        for spec in block.work:
            swap(spec, None)
        if block.engine_index is not None and self.pipeline is not None:
            self.pipeline.finish(block.engine_index)
        self._resolve_waits(block_until_done=False)

    def _resolve_waits(self, block_until_done: bool) -> None:
        """The time the compute stream waited for each copy, once both events have happened."""
        keep = []
        for timing, mark, copied in self.pending:
            if block_until_done or (self.device.ready(mark) and self.device.ready(copied)):
                timing.gpu_wait = CudaDevice.waited(mark, copied)
                timing.copy_seconds = CudaDevice.copy_seconds(copied)
            else:
                keep.append((timing, mark, copied))
        self.pending = keep

    def settle(self) -> None:
        """Waits for the device, so every run's device-timed figures are final (the profile)."""
        self.device.synchronize()
        self._resolve_waits(block_until_done=True)

    def close(self) -> None:
        if self.pipeline is not None:
            self.pipeline.close()  # synchronizes the device first
        self._resolve_waits(block_until_done=True)
        self.expansion.free()


class CudaBackend(DeviceBackend):
    """A CUDA GPU: the staging buffers are registered as pinned memory once, copies go on a side
    stream (:class:`CudaDevice`)."""

    def __init__(self, state: ModelState) -> None:
        import torch

        from .. import config

        self.pinned: PinnedRegistration | None = None
        if state.engine is not None:
            self.pinned = register_pinned(torch.cuda.cudart(), state.engine, state.config.pin_ram_tier)
        cuda = CudaDevice(state.device)
        super().__init__(state, cuda, state.device)
        # The profile reports each pass's copy rate as a share of the link, measured here once.
        self.link: float | None = None
        if state.engine is not None and bool(config.setting("profile")):
            self.link = cuda.link_bandwidth()

    def close(self) -> None:
        super().close()
        if self.pinned is not None:
            self.pinned.close()
