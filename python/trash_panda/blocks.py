"""Finding the blocks of a torch model: the repeated modules that hold most of its weights."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import _core
from .adapter_names import unwrapped
from .errors import ArgumentError

if TYPE_CHECKING:
    from torch import nn

__all__ = ["Block", "find_blocks"]


@dataclass(frozen=True)
class Block:
    """One block: its name prefix in the model's state dict (ending in "."), and its module."""

    prefix: str
    module: nn.Module


def _numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def find_blocks(model: nn.Module, prefixes: list[str] | None = None) -> list[Block]:
    """The model's blocks, in the order the model defines them.

    Without ``prefixes``: every ``nn.ModuleList`` that is not inside another such list and has at
    least two children holding parameters (a diffusion model may have several: double blocks,
    single blocks, text blocks). Its children are the blocks. Models that keep most of their
    weights outside such lists get no blocks from this rule, and need ``prefixes``.

    With ``prefixes``: the modules those names lead to (``"blocks.3."`` or ``"blocks.3"``), or,
    for a prefix naming a list, each child of that list.
    """
    from torch import nn

    modules = dict(model.named_modules())
    if prefixes is not None:
        found: list[Block] = []
        for prefix in prefixes:
            key = prefix.rstrip(".")
            module = modules.get(key)
            if module is None:
                near = sorted(n for n in modules if n and n.split(".")[0] == key.split(".")[0])[:5]
                raise ArgumentError(
                    f"block prefix {prefix!r} names no module of {type(model).__name__}"
                    + (f"; modules with that start: {', '.join(near)}" if near else "")
                )
            if isinstance(module, nn.ModuleList):
                found.extend(Block(f"{key}.{i}.", unwrapped(child)) for i, child in enumerate(module))
            else:
                found.append(Block(key + ".", unwrapped(module)))
        # The planner's check: none named twice, none inside another (a PlanError).
        _core.check_block_prefixes([b.prefix for b in found])
        return found

    lists: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or any(name.startswith(f"{outer}.") for outer in lists):
            continue
        if sum(1 for child in module if _numel(child) > 0) >= 2:
            lists.append(name)
    return [
        Block(f"{name}.{i}." if name else f"{i}.", unwrapped(child))
        for name in lists
        for i, child in enumerate(modules[name])
        if _numel(child) > 0
    ]
