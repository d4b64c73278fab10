"""The order file of a stage: which order its first call prefetches in, and whether the order
the blocks really ran in is written back when it is released (or, for a traced order, now).

Every rule is the core's (docs/order-format.md); this module asks the binding and turns what it
says into at most one warning per problem, never an error.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field

from .. import _core
from ..errors import OrderError, ReadError

__all__ = ["OrderChoice", "choose_order", "write_order", "write_traced_order"]


@dataclass
class OrderChoice:
    """The order a stage starts with, and what to do with the file at the end."""

    first: list[str] | None  # the blocks that run first, for install_offload(order=...)
    path: os.PathLike[str] | None  # the order file; None: neither read nor written
    read: _core.OrderRead | None  # what reading it gave (None: not read)
    checkpoint: str
    blocks: list[str]  # the model's blocks in plan order
    # The file's outside modules that fit the model: name -> blocks started before its first
    # use (empty: every outside weight is needed before the first call).
    outside: dict[str, int] = field(default_factory=dict)


def choose_order(
    checkpoint: str | os.PathLike[str],
    blocks: list[str],
    order: list[str] | None,
    destination: str | os.PathLike[str] | None,
    outside: list[str] | None = None,
    *,
    write: bool = True,
) -> OrderChoice:
    """``order`` when given (the file is then left alone), else the order file's order when it
    fits ``blocks`` (the model's blocks in plan order), else None (the model's own order); with
    the model's ``outside`` modules, the file's positions for them when the core says they fit.
    ``write=False``: the file is only read (a caller with no end of run to write it at), and
    :func:`write_order` leaves it alone."""
    where = os.fspath(checkpoint)
    if order is not None:
        _core.full_order(list(order), blocks)  # an unknown or repeated name is the caller's error
        return OrderChoice(list(order), None, None, where, blocks)
    path = _core.order_file_path(where, None if destination is None else os.fspath(destination))
    try:
        read = _core.read_order_file(path, blocks)
    except ReadError as e:
        warnings.warn(f"{e}; running in the model's order, and the file is left as it is", stacklevel=4)
        return OrderChoice(None, None, None, where, blocks)
    line = read.warning() if write else _read_only_warning(read, path)
    if line is not None:
        warnings.warn(line, stacklevel=4)
    placed = read.outside_for(list(outside or [])) if read.usable else {}
    return OrderChoice(read.blocks if read.usable else None, path if write else None, read, where, blocks, placed)


def _read_only_warning(read: _core.OrderRead, path: os.PathLike[str]) -> str | None:
    """The core's warning says the file will be replaced on release: not so when it is only read."""
    if read.reason in (None, "absent"):
        return None
    return f"order file {os.fspath(path)} ignored: {read.detail}; it is only read here, not replaced"


def write_order(choice: OrderChoice, ran: list[str], outside: dict[str, int] | None = None) -> bool:
    """Writes the order the blocks ran in (merged into the known one when only some ran), with
    where the ``outside`` modules were first needed, when the core says so: no usable file, or
    a wrong one. Call it only after a pass that ended normally: a stopped one says nothing about
    the blocks it never reached. A folder that cannot be written gives one warning. Returns
    whether it wrote."""
    if choice.path is None or choice.read is None:
        return False
    write = _core.file_to_write(choice.read, ran, choice.blocks, dict(outside or {}))
    if write is None:
        return False
    blocks, placed = write
    try:
        _core.write_order_file(choice.path, choice.checkpoint, blocks, placed)
    except OrderError as e:
        warnings.warn(f"the order file was not written: {e}", stacklevel=4)
        return False
    return True


def write_traced_order(
    checkpoint: str | os.PathLike[str],
    blocks: list[str],
    ran: list[str],
    destination: str | os.PathLike[str] | None,
    outside: dict[str, int] | None = None,
) -> bool:
    """Writes the order file a stage of ``checkpoint`` would write on release after running
    ``ran`` (``blocks``: the model's blocks in plan order), by the same rules: a right file is
    left as it is, and a pass that ran only some blocks is merged into the order the file knew;
    ``outside`` is where the modules outside the blocks were first needed, as a real run's
    order hook records it. Asked for by the caller, so a file that cannot be read or written
    raises. Returns whether it wrote."""
    where = os.fspath(checkpoint)
    path = _core.order_file_path(where, None if destination is None else os.fspath(destination))
    read = _core.read_order_file(path, blocks)
    write = _core.file_to_write(read, ran, blocks, dict(outside or {}))
    if write is None:
        return False
    order, placed = write
    _core.write_order_file(path, where, order, placed)
    return True
