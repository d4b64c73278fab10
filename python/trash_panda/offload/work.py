"""What every device backend shares: the expansion buffer, swapping a block's weights in and
out of its modules, and the check that a module did not write to weights it shares with the
engine."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import StreamError

if TYPE_CHECKING:
    import torch

    from .. import _core
    from .state import BlockState, TensorSpec


@dataclass
class Timing:
    """Where the main thread's time went for one block."""

    staged_wait: float = 0.0  # waiting for the engine to stage the block
    gpu_wait: float = 0.0  # the compute stream's wait for the block's copy (device-timed)
    bytes: int = 0
    copy_seconds: float = 0.0  # the copy engine's time for the block's bytes (device-timed)


def swap(spec: TensorSpec, tensor: torch.Tensor | None) -> None:
    """Puts ``tensor`` (or the meta placeholder, for None) under every name of ``spec``."""
    from torch import nn

    spec.put(spec.placeholder if tensor is None else nn.Parameter(tensor, requires_grad=False))


class ExpansionBuffer:
    """The one buffer every expanded tensor is written into, as large as the plan's expansion
    figure: tensors not in the compute dtype (or with a scale) are expanded there at the offsets
    the core gives, so no expansion allocates, and memory written once is reused every run."""

    def __init__(self, nbytes: int, device: torch.device, config: _core.EngineConfig) -> None:
        import torch

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
        from .._dtypes import core_name

        offsets = self.offsets.get(block.index)
        if offsets is None:
            work = block.work
            offsets = self.offsets[block.index] = self.config.expansion(
                [core_name(s.resident.dtype) if s.resident is not None else "U8" for s in work],
                [math.prod(s.shape) for s in work],
                [s.resident_scale is not None for s in work],
            )
        out = []
        for spec, at in zip(block.work, offsets, strict=True):
            assert spec.resident is not None and at is not None
            out.append((spec, self.view(at, spec.shape, spec.target)))
        return out


class SharedViews:
    """Weights handed to a module as views of memory the engine keeps (a staging buffer), with
    their version counters when handed over: a module that writes to its weights in place would
    change the staged copy the next pass reuses, so that is an error naming the parameter."""

    def __init__(self) -> None:
        self.views: dict[int, list[tuple[TensorSpec, int]]] = {}

    def hand(self, block: BlockState, spec: TensorSpec, tensor: torch.Tensor) -> None:
        swap(spec, tensor)
        module, attr = spec.owners[0]
        param = module._parameters[attr]
        assert param is not None
        self.views.setdefault(block.index, []).append((spec, param._version))

    def modified(self, block: BlockState) -> str | None:
        """The name of a shared weight of ``block`` that was written to since it was handed
        over, if any; forgets the block's views."""
        changed = None
        for spec, version in self.views.pop(block.index, []):
            module, attr = spec.owners[0]
            param = module._parameters[attr]
            if changed is None and param is not None and param._version != version:
                changed = spec.name
        return changed


def modified_error(name: str) -> StreamError:
    return StreamError(
        f"{name} was modified in place while its block ran: streamed weights are views of the "
        "engine's staged copy, which later passes reuse, so a module must not write to them "
        "(the staged copy was dropped and will be read again)"
    )
