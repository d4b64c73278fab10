"""The weights outside the blocks (embeddings, input and output layers, final norms) by module:
which modules hold them, where a run first needs each (recorded in the order file), and, with
``overlap=True`` (:mod:`.setup`) and a file that says so, which are loaded before the first
call and which later, by the loader thread, at their place in the run order.

The order file's rules (which positions are valid, when they are written) are the core's; this
module only finds the torch modules and splits the tensors.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from .materialize import materialize_all, read_groups
from .meter import meter_for, paused
from .reads import read_group, through_host

if TYPE_CHECKING:
    import torch
    from torch import nn

    from .. import _core
    from .backends.loader_copies import LoaderCopies
    from .state import TensorSpec

__all__ = ["load_now", "load_outside", "outside_modules", "split_outside"]


def outside_modules(model: nn.Module, block_prefixes: list[str], skip: tuple[str, ...] = ()) -> dict[str, nn.Module]:
    """The modules outside the blocks that hold parameters of their own, by name, in model
    order: what a run's order file records. The model itself is left out (its pre-hook runs
    before everything, so it would say nothing), and so is anything under a skipped prefix.
    A real run and trace_order() both ask here, so they record the same modules."""
    prefixes = tuple(p if p.endswith(".") else f"{p}." for p in block_prefixes)
    found: dict[str, nn.Module] = {}
    for name, module in model.named_modules():
        if not name or f"{name}.".startswith(prefixes) or (skip and name.startswith(skip)):
            continue
        if any(True for _ in module.parameters(recurse=False)):
            found[name] = module
    return found


def split_outside(
    specs: list[TensorSpec], modules: dict[str, nn.Module], positions: dict[str, int], *, defer: bool = False
) -> tuple[list[TensorSpec], dict[int, list[TensorSpec]], dict[str, int]]:
    """Splits the outside tensors by where they are first needed: (those needed before the
    first block, the others by position in the run order, and the position each later module
    waits for). A tensor is needed at the first of its owners' positions (tied weights: the
    first module to use it); a tensor with an owner the file does not place is needed at once,
    as without the file. With ``defer`` (a stage read ahead of its turn, where nothing is read
    by the caller) a tensor needed at once goes to the loader too, at position 0, when every
    module that owns it can wait for it."""
    names = {id(m): n for n, m in modules.items()}
    now: list[TensorSpec] = []
    later: dict[int, list[TensorSpec]] = {}
    wait_for: dict[str, int] = {}
    for spec in specs:
        owners = [names.get(id(m)) for m, _a in (spec.owners or [(spec.module, spec.attr)])]
        placed = [n for n in owners if n is not None and (defer or n in positions)]
        at = [positions.get(n, 0) for n in placed]
        if len(at) < len(owners) or (min(at, default=0) == 0 and not defer):
            now.append(spec)
            continue
        first = min(at)
        later.setdefault(first, []).append(spec)
        for n in owners:
            assert n is not None
            wait_for[n] = max(wait_for.get(n, 0), first)
    return now, dict(sorted(later.items())), wait_for


def load_now(specs: list[TensorSpec], device: torch.device, threads: int, lane: _core.ReadLane | None = None) -> None:
    """Reads the outside weights needed before the first call as stream_load reads them (the
    same calls through the model's ``lane``, so without positions nothing changes), paused as a
    load is: they are nobody's activation memory."""
    with paused():
        materialize_all(specs, device, storage=None, threads=threads, expand=True, lane=lane)


def load_outside(
    specs: list[TensorSpec],
    device: torch.device,
    threads: int,
    lane: _core.ReadLane | None = None,
    position: int | None = None,
    copies: LoaderCopies | None = None,
) -> None:
    """Reads outside tensors (and their scales) in one call of the core through ``lane``, as
    the block at ``position`` of the run order, expanded to the compute dtype as stream_load
    expands them, put on the device through its meter (on a device with memory of its own, by
    the loader's ``copies``, the event of ``position`` their last one's)."""
    if copies is None:
        meter = meter_for(device)
        meter.moved_in(functools.partial(read_group, specs, device, None, threads, lane, position, expand=True))
        return
    for group in read_groups(specs):
        through_host(group, device, None, threads, lane, position, copies, expand=True)
    copies.done(("outside", position if position is not None else 0))
