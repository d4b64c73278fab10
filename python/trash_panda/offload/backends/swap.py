"""Putting a block's weights in and out of its modules, and the check that a module did not
write to weights it shares with the engine's staged copy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import StreamError

if TYPE_CHECKING:
    import torch

    from ..state import BlockState, TensorSpec


def swap(spec: TensorSpec, tensor: torch.Tensor | None) -> None:
    """Puts ``tensor`` (or the meta placeholder, for None) under every name of ``spec``."""
    from torch import nn

    spec.put(spec.placeholder if tensor is None else nn.Parameter(tensor, requires_grad=False))


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
