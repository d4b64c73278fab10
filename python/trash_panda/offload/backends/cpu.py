"""The CPU backend: the CPU computes from the staging buffers themselves.

A streamed tensor already in the compute dtype is used in place, as a view of its staging
buffer (the lease is held until the block has run); the others are expanded by the core into
the expansion buffer, at the offsets the core gives. Resident blocks with weights to expand use
the same buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..._dtypes import core_name
from ..timing import Timing
from .expansion import ExpansionBuffer
from .swap import SharedViews, modified_error, swap

if TYPE_CHECKING:
    from ... import _core
    from ..state import BlockState, ModelState


class CpuBackend:
    def __init__(self, state: ModelState) -> None:
        self.state = state
        self.expansion = ExpansionBuffer(state.config.expansion_bytes, state.device, state.config)
        self.layouts: dict[int, list[_core.StagedTensor]] = {}  # engine block -> its layout
        self.leases: dict[int, Any] = {}
        self.shared = SharedViews()

    def _layout(self, engine_index: int) -> list[_core.StagedTensor]:
        found = self.layouts.get(engine_index)
        if found is None:
            assert self.state.engine is not None
            found = self.layouts[engine_index] = self.state.engine.layout(engine_index)
        return found

    def bring(self, block: BlockState) -> Timing:
        import torch

        timing = Timing()
        if block.engine_index is None:
            timing.expanded = self._expand_resident(block)
            return timing
        assert self.state.engine is not None
        layout = self._layout(block.engine_index)
        lease = self.state.engine.acquire(block.engine_index)
        timing.staged_wait = lease.waited
        try:
            items: list[Any] = []
            # Made as normal tensors even under the caller's inference_mode: inference tensors
            # keep no version counter, which is how a write to a shared weight is caught.
            with torch.inference_mode(False):
                self._hand_views(block, lease, layout, items)
            if items:
                lease.expand_into(items, core_name(self.state.compute_dtype))
                timing.expanded = sum(out.numel() * out.element_size() for _i, out in items)
        except BaseException:
            self.shared.modified(block)
            for spec in block.work:
                swap(spec, None)
            lease.release()
            raise
        timing.bytes = sum(s.info.nbytes for s in block.work)
        if block.index in self.shared.views:
            self.leases[block.index] = lease
        else:
            lease.release()
        return timing

    def _hand_views(
        self, block: BlockState, lease: _core.Lease, layout: list[_core.StagedTensor], items: list[Any]
    ) -> None:
        """Puts each streamed weight of ``block`` under its modules: a view of the lease where
        it is used as staged, else its place in the expansion buffer (added to ``items``, what
        the lease expands into)."""
        from torch.utils.dlpack import from_dlpack

        for spec in block.work:
            assert spec.staged_index is not None
            staged = layout[spec.staged_index]
            if staged.expand_at is None:
                raw = from_dlpack(lease.view(spec.staged_index))
                self.shared.hand(block, spec, raw.view(spec.target).reshape(spec.shape))
            else:
                out = self.expansion.view(staged.expand_at, spec.shape, spec.target)
                items.append((spec.staged_index, out.reshape(-1)))
                swap(spec, out)

    def _expand_resident(self, block: BlockState) -> int:
        from ..stored import expand_stored

        written = 0
        for spec, out in self.expansion.resident(block):
            assert spec.resident is not None
            held = spec.held_name(spec.resident)
            kind = spec.scale_kind if spec.resident_scale is not None else "none"
            expand_stored(spec.resident, held, out, spec.resident_scale, kind, spec.info.rows)
            swap(spec, out)
            written += out.numel() * out.element_size()
        return written

    def forget_used(self, block: BlockState, indices: list[int]) -> None:
        """Unmaps tensors of a block used in place whose module has run (see hooks.py)."""
        lease = self.leases.get(block.index)
        if lease is None:
            return
        for i in indices:
            lease.forget_tensor(i)

    def done(self, block: BlockState) -> None:
        changed = self.shared.modified(block)
        for spec in block.work:
            swap(spec, None)
        lease = self.leases.pop(block.index, None)
        if lease is not None:
            if changed is not None:
                lease.discard()
            lease.release()  # the views are gone with the placeholders back
        if changed is not None:
            raise modified_error(changed)

    def settle(self) -> None:
        """Nothing is in flight on the CPU."""

    def held(self, block_name: Callable[[int], str]) -> Iterator[tuple[object, str]]:
        """(tensor, what it is) for the memory it keeps beside the model's parameters, ``{owner}``
        standing for the model's class (the profile names them)."""
        yield self.expansion.raw, "expansion buffer of {owner}"

    def close(self) -> None:
        for index in list(self.leases):
            self.leases.pop(index).release()
        self.shared.views.clear()
        self.expansion.free()
