"""One way from a planned model on the meta device to a hooked one, shared by ``stage()`` and
``from_pretrained()``: the load, the run order (``order=`` or the order file), the weights
outside the blocks needed before the first call, the hooks, and with ``overlap`` the loader
thread that reads the rest (the resident blocks, and the outside weights the order file places
later) in run order while the model starts.

``load_pipeline()`` loads each component in a ``stage()``, so all three load alike: a feature
of the load (an order file's outside positions, the read queue the loader shares with the
engine) reaches every entry point at once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .. import _core

if TYPE_CHECKING:
    from torch import nn

    from ..checkpoint import Checkpoint
    from ..plan import Plan
    from .handle import OffloadHandle
    from .order import OrderChoice
    from .state import ModelState, TensorSpec

__all__ = ["Loaded", "OrderFile", "load_and_hook"]

# What to do with the order file next to the checkpoint: read it and let the caller write it
# back at the end of the run ("write"), only read it ("read": a caller with no end of run), or
# leave it alone ("none").
OrderFile = Literal["write", "read", "none"]


@dataclass
class Loaded:
    """What a caller keeps of a load: the hooks' handle, and the order the run started with
    (what :func:`.order.write_order` needs at its end)."""

    handle: OffloadHandle
    choice: OrderChoice


def load_and_hook(
    model: nn.Module,
    ckpt: Checkpoint,
    plan: Plan,
    where: str | os.PathLike[str],
    *,
    order: list[str] | None,
    destination: str | os.PathLike[str] | None = None,
    order_file: OrderFile = "write",
    overlap: bool = False,
    load_kwargs: dict[str, Any] | None = None,
    allowance: _core.Allowance | None = None,
) -> Loaded:
    """Loads ``model`` (built on meta) from ``ckpt`` by ``plan`` and installs its hooks.

    ``where`` is the checkpoint path the order file is named after (``destination``: its
    folder, as ``stage()`` takes it); ``order`` names the blocks that run first, and the file is
    then left alone. ``load_kwargs`` go to the load (``stream_load``'s keywords). With
    ``overlap`` the resident blocks, and the outside weights the order file places after the
    first block, are read by a loader thread after this returns. With ``allowance`` (a stage of
    a pipeline read ahead of its turn) nothing is read here: every outside weight and resident
    block is read by the loader, each once its bytes are in the allowance. On an error the
    model is left unloaded and the error goes on.
    """
    from .release import release

    try:
        return _load_and_hook(
            model, ckpt, plan, where, order, destination, order_file, overlap, load_kwargs or {}, allowance
        )
    except BaseException:
        release(model)
        raise


def _load_and_hook(
    model: nn.Module,
    ckpt: Checkpoint,
    plan: Plan,
    where: str | os.PathLike[str],
    order: list[str] | None,
    destination: str | os.PathLike[str] | None,
    order_file: OrderFile,
    overlap: bool,
    load_kwargs: dict[str, Any],
    allowance: _core.Allowance | None,
) -> Loaded:
    from ..settings import setting
    from . import outside as outside_mod
    from .handle import install_offload
    from .load import load_deferred, load_now
    from .order import OrderChoice, choose_order
    from .overlap import loader_reads, start_loader
    from .state import BlockState, get_state

    unread: list[TensorSpec] = []  # with overlap: the outside weights left for later
    deferred: list[BlockState] = []
    ahead = allowance is not None
    if overlap or ahead:
        _report, deferred = load_deferred(model, ckpt, plan, outside=unread, ahead=ahead, **load_kwargs)
    else:
        load_now(model, ckpt, plan=plan, **load_kwargs)
    state = get_state(model)
    assert state is not None
    blocks = [b.prefix for b in state.blocks]
    if order is None and order_file == "none":
        choice = OrderChoice(None, None, None, os.fspath(where), blocks)
    else:
        modules = list(state.outside_modules)
        choice = choose_order(where, blocks, order, destination, modules, write=order_file == "write")
    # Outside weights the file does not place after the first block are needed at once.
    now, later, waits = outside_mod.split_outside(unread, state.outside_modules, choice.outside, defer=ahead)
    if now:
        loader_reads().now(now, state.device, max(1, int(setting("ram_threads"))), state.lane)
    handle = install_offload(model, order=choice.first)
    if not (overlap or ahead):
        return Loaded(handle, choice)
    # Stopped when the hooks come off.
    costs = _costs(plan, state, later, ahead)
    # With overlap the rest is read by the loader on the model's state (``state.loader``).
    start_loader(handle, state, deferred, choice.first, later, waits, allowance=allowance, costs=costs, ram_tier=ahead)
    return Loaded(handle, choice)


def _costs(
    plan: Plan, state: ModelState, later: dict[int, list[TensorSpec]], ram_tier: bool
) -> dict[tuple[str, int], int]:
    """What each read of the loader holds once done, as the core counts it from the plan (what
    the stage's ``Holds`` adds up): a resident block its stored bytes, the weights outside the
    blocks their budget, charged to their first group; with ``ram_tier``, a RAM tier read into
    memory on the CPU its staged bytes."""
    read = _core.read_costs(
        plan,
        state.config,
        [b.prefix for b in state.blocks],
        outside=bool(later),
        ram_tier=ram_tier,
        gpu=state.device.type == "cuda",
    )
    costs = {("block", b.index): n for b, n in zip(state.blocks, read.blocks, strict=True) if n}
    if read.outside:
        costs[("outside", min(later))] = read.outside
    if read.ram_tier:
        costs[("ram_tier", 0)] = read.ram_tier
    return costs
