"""The expansion buffer both backends write expanded tensors into, sized by the plan."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...errors import StreamError

if TYPE_CHECKING:
    import torch

    from ... import _core
    from ..state import BlockState, TensorSpec


class ExpansionBuffer:
    """The one buffer every expanded tensor is written into, as large as the plan's expansion
    figure: tensors not in the compute dtype (or with a scale) are expanded there at the offsets
    the core gives, so no expansion allocates, and memory written once is reused every run."""

    def __init__(
        self,
        nbytes: int,
        device: torch.device,
        config: _core.EngineConfig,
        allocate: Callable[[int], torch.Tensor] | None = None,
    ) -> None:
        """``allocate``: how ``nbytes`` of uint8 memory are had (a device backend's device, so
        that its model of the memory sees it); by default ``torch.empty`` on ``device``."""
        import torch

        if allocate is not None:
            self.raw = allocate(nbytes)
        else:
            self.raw = torch.empty(nbytes, dtype=torch.uint8, device=device)
        self.config = config
        self.offsets: dict[int, list[int | None]] = {}  # resident block -> its tensors' places

    def free(self) -> None:
        """Gives the memory back (the hooks are gone; a handle kept by the caller holds nothing)."""
        self.raw = self.raw[:0].clone()

    def view(self, offset: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        n = math.prod(shape) * dtype.itemsize
        if offset + n > self.raw.numel():
            raise StreamError(
                f"an expansion of {n} bytes at {offset} passes the end of the plan's "
                f"{self.raw.numel()}-byte expansion buffer: plan the model again"
            )
        return self.raw[offset : offset + n].view(dtype).reshape(shape)

    def resident(self, block: BlockState) -> list[tuple[TensorSpec, torch.Tensor]]:
        """Each tensor a resident block expands, with its place in the buffer; the places are
        the core's (by the rule the plan counted with), asked for once per block."""
        offsets = self.offsets.get(block.index)
        if offsets is None:
            work = block.work
            offsets = self.offsets[block.index] = self.config.expansion(
                [s.held_name(s.resident) if s.resident is not None else "U8" for s in work],
                [math.prod(s.shape) for s in work],
                [s.resident_scale is not None for s in work],
                [s.reordered for s in work],
            )
        out = []
        for spec, at in zip(block.work, offsets, strict=True):
            assert spec.resident is not None and at is not None
            out.append((spec, self.view(at, spec.shape, spec.target)))
        return out
