"""The CUDA backend: staged bytes (pinned) go to a device slot on a side stream, then are used in
place there or expanded into the expansion buffer on the compute stream.

Staged tensors are 512-byte aligned (the engine configuration's alignment on a GPU), so every
tensor in the compute dtype is used in place in its slot. The slots and the copies in flight are
:mod:`.device`'s bookkeeping, which the test suite drives with a simulated device; expansions
run on the compute stream, so one expansion buffer serves every block in turn.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..._dtypes import is_block, stored_shape, torch_dtype
from ...errors import StreamError
from ..timing import Timing
from .copies import CudaDevice, Device, SlotCopies
from .expansion import ExpansionBuffer
from .pinning import PinnedRegistration, register_ranges
from .swap import swap

if TYPE_CHECKING:
    import torch

    from ... import _core
    from ..state import BlockState, ModelState


STAGING_FALLBACK = "streamed blocks are copied from pageable memory, which is slower and does not overlap the compute"
RAM_TIER_FALLBACK = "RAM-tier blocks go through the pinned staging buffers instead, staged ahead as the disk tier's are"


def register_pinned(cudart: Any, owner: _core.Engine | _core.StagingPool) -> PinnedRegistration | None:
    """Registers every staging buffer of an engine, or of a pipeline's shared pool (once for
    all its stages), as pinned; None (and a warning) when that fails: copies then go from
    pageable memory, which CUDA runs synchronously (slower, same results)."""
    from ... import _core

    ranges = owner.buffers() if isinstance(owner, _core.StagingPool) else owner.staging_buffers()
    return register_ranges(cudart, owner, ranges, STAGING_FALLBACK)


def expand_into(
    out: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor | None,
    kind: str,
    block: str | None = None,
    order: list[int] | None = None,
) -> None:
    """``out = (w.float() * scale).to(out.dtype)``, computed in ``out`` with no other memory: the
    scale, broadcast through a view, multiplies in float32 and the result is rounded once into
    ``out``, as the reference. ``block``: ``w`` holds GGML blocks of that type, expanded by
    :mod:`.ggml` in passes. ``order``: row ``r`` of ``out`` is row ``order[r]`` of the weight."""
    import torch

    if block is not None:
        from .ggml import dequantize_into

        dequantize_into(out, w, block, order)
        return
    if order is not None:
        if scale is not None:
            raise StreamError("a weight with a scale cannot have its rows reordered on the device yet")
        index = torch.tensor(order, dtype=torch.long, device=out.device)
        torch.index_select(w.reshape(out.shape), 0, index, out=out)
        return
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
    return dev[offset : offset + length].view(torch_dtype(header)).reshape(stored_shape(header, shape, length))


class DeviceBackend:
    """A device with its own memory computes: each streamed block's bytes are copied into a
    device slot by a :class:`SlotCopies` (several copies in flight), then used in place there or
    expanded into the expansion buffer on the compute stream.

    The staging buffers (unless a pipeline's shared pool, which the pipeline pins) and, with
    ``pin_ram_tier``, the in-memory RAM tier are pinned through the device, each on its own, so
    one failing leaves the other pinned. A RAM tier pinned is copied to the device straight from
    memory; one that is not goes through the staging buffers, staged ahead as the disk tier is.
    A stage loaded ahead of its turn reads its RAM tier last, after the backend is made: it is
    pinned when it arrives (:meth:`ram_tier_arrived`) and copied from memory from then on."""

    def __init__(self, state: ModelState, device: Device) -> None:
        self.state = state
        self.device = device
        self.layouts: dict[int, list[_core.StagedTensor]] = {}
        self.pending: list[tuple[Timing, Any, Any]] = []  # (timing, compute mark, copy event)
        # Each block's streams: the kernels that read its weights ran there, so its memory is
        # not reused before their work has run (retire).
        self.ran_on: dict[int, list[Any]] = {}
        config = state.config
        self.expansion = ExpansionBuffer(config.expansion_bytes, state.device, config, allocate=device.empty)
        # What was queued where the expansion buffer was allocated; each stream waits for it
        # before its first expansion (its memory may be what those kernels still read).
        self._expansion_made = device.compute_done()
        self._expansion_waited: list[Any] = []
        self.pinned: list[Any] = []  # the registrations close() undoes
        self._ram_pending = False  # its RAM tier is pinned when it arrives
        self._arrived: Any = None  # a RAM tier pinned on the loader's thread, not adopted yet
        self.copies: SlotCopies | None = None
        engine = state.engine
        if engine is None:
            return
        if state.staging_pool is None:
            self._keep(self.device.pin(engine, engine.staging_buffers(), STAGING_FALLBACK))
        direct = False
        if config.pin_ram_tier and _has_ram_tier(state):
            ranges = engine.ram_image_buffers()
            if ranges:
                ram = self.device.pin(engine, ranges, RAM_TIER_FALLBACK)
                self._keep(ram)
                direct = ram is not None
            else:  # loaded ahead: the loader reads the tier after the hooks are in
                self._ram_pending = True
            if not direct:
                # Not pinned (yet), so not copied from where it is: the workers stage it ahead
                # as they do the disk tier, into the pinned staging buffers.
                engine.stage_ram_tier_ahead()
        self.copies = SlotCopies(
            device,
            engine,
            config.device_slots,
            config.staging_buffer_bytes,
            config.staging_buffers,
            config.lookahead,
            direct=direct,
        )

    def _keep(self, registration: Any) -> None:
        if registration is not None:
            self.pinned.append(registration)

    def ram_tier_arrived(self) -> None:
        """The RAM tier of a stage loaded ahead is in memory now (its loader read it last): it
        is pinned here, on the loader's thread, and the compute thread copies its blocks from
        there from its next block on (the copies' bookkeeping is that thread's)."""
        if not self._ram_pending or self.state.engine is None or self.state.engine.closed:
            return
        self._ram_pending = False
        ranges = self.state.engine.ram_image_buffers()
        if not ranges:
            warnings.warn(
                f"the RAM tier held in memory arrived empty, so it is not pinned; {RAM_TIER_FALLBACK}", stacklevel=2
            )
            return
        self._arrived = self.device.pin(self.state.engine, ranges, RAM_TIER_FALLBACK)

    def _adopt_ram_tier(self) -> None:
        registration, self._arrived = self._arrived, None
        self.pinned.append(registration)
        assert self.copies is not None and self.state.engine is not None
        self.copies.copy_from_images()
        self.state.engine.copy_ram_tier_directly()

    def starts(self, block: BlockState) -> None:
        """``block`` is about to run on the current stream."""
        stream = self.device.current_stream()
        streams = self.ran_on.setdefault(block.index, [])
        if stream not in streams:
            streams.append(stream)

    def retire(self, block: BlockState, t: torch.Tensor) -> None:
        """``t``, a weight of ``block``, is about to be dropped: its memory is not reused before
        the work queued so far on every stream the block ran on (and the current one) has run.
        The caching allocator hands freed memory to the next allocation on the stream it was
        made on at once; kernels of the block queued on another stream (a caller's
        ``torch.cuda.stream(s)``) may still read it."""
        streams = [self.device.current_stream(), *self.ran_on.get(block.index, ())]
        for stream in streams:
            self.device.record_stream(t, stream)

    def bring(self, block: BlockState) -> Timing:
        timing = Timing()
        if self._arrived is not None:
            self._adopt_ram_tier()
        if block.engine_index is None:
            expansions = self.expansion.resident(block)
            if expansions:
                self._expansion_ready()
            for spec, out in expansions:
                assert spec.resident is not None
                expand_into(out, spec.resident, spec.resident_scale, spec.scale_kind, spec.held_block, spec.info.rows)
                swap(spec, out)
                timing.expanded += out.numel() * out.element_size()
            return timing
        assert self.state.engine is not None and self.copies is not None
        layout = self.layouts.get(block.engine_index)
        if layout is None:
            layout = self.layouts[block.engine_index] = self.state.engine.layout(block.engine_index)
        try:
            self._bring_streamed(block, layout, timing)
        except BaseException:
            # The after-hook does not run for a block whose before-hook raised: its slot is given
            # back here, after whatever was queued on it, and its modules hold no view of it.
            for spec in block.work:
                swap(spec, None)
            self.copies.finish(block.engine_index)
            raise
        return timing

    def _expansion_ready(self) -> None:
        stream = self.device.current_stream()
        if stream not in self._expansion_waited:
            self._expansion_waited.append(stream)
            self.device.compute_waits(self._expansion_made)

    def _bring_streamed(self, block: BlockState, layout: list[_core.StagedTensor], timing: Timing) -> None:
        assert block.engine_index is not None and self.copies is not None
        expanding = False
        taken = self.copies.take(block.engine_index)
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
            if not expanding:
                self._expansion_ready()
                expanding = True
            ggml = st.dtype if is_block(st.dtype) else None
            expand_into(out, w, scale, st.scale_layout or "none", ggml, spec.info.rows)
            swap(spec, out)
            timing.expanded += out.numel() * out.element_size()

    def done(self, block: BlockState) -> None:
        for spec in block.work:
            swap(spec, None)
        if block.engine_index is not None and self.copies is not None:
            self.copies.finish(block.engine_index)
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

    def park(self) -> None:
        """The model's turn ended: every copy out of a staging buffer is waited for and its
        lease returned, so the engine can give a shared staging pool back."""
        if self.copies is not None:
            self.copies.return_all()

    def held(self, block_name: Callable[[int], str]) -> Iterator[tuple[object, str]]:
        """(tensor, what it is) for the memory it keeps beside the model's parameters, ``{owner}``
        standing for the model's class (the profile names them); ``block_name`` names a block
        by its engine index."""
        yield self.expansion.raw, "expansion buffer of {owner}"
        if self.copies is not None:
            yield from self.copies.held(block_name)

    def device_bytes(self) -> int:
        """The device memory the slots and the expansion buffer hold, which :meth:`close` frees."""
        slots = sum(s.numel() for s in self.copies.slots) if self.copies is not None else 0
        return slots + self.expansion.raw.numel()

    def close(self) -> None:
        if self.copies is not None:
            self.copies.close()
        # The expansion buffer and the slots may still be read by kernels queued on any stream
        # the model ran on (with no slots there is no copy pipeline to have waited for them).
        self._close_wait()
        self._resolve_waits(block_until_done=True)
        self.expansion.free()
        arrived, self._arrived = self._arrived, None
        for registration in [*self.pinned, *([arrived] if arrived is not None else [])]:
            registration.close()
        self.pinned = []

    def _close_wait(self) -> None:
        self.device.synchronize()


def _has_ram_tier(state: ModelState) -> bool:
    from ...plan import Tier

    return any(b.tier == Tier.RAM and b.engine_index is not None for b in state.blocks)


class CudaBackend(DeviceBackend):
    """A CUDA GPU: copies on a side stream and pinning through the CUDA runtime torch loaded
    (:class:`CudaDevice`)."""

    def __init__(self, state: ModelState) -> None:
        from ... import settings

        cuda = CudaDevice(state.device)
        super().__init__(state, cuda)
        # The profile reports each pass's copy rate as a share of the link, measured here once.
        self.link: float | None = None
        if state.engine is not None and bool(settings.setting("profile")):
            self.link = cuda.link_bandwidth()


def empty_cuda_caches() -> None:
    """Gives torch's cached device memory and its cached pinned host memory back to the
    system, once the device is done with them."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    host_empty = getattr(torch._C, "_host_emptyCache", None)
    if host_empty is not None:
        host_empty()
