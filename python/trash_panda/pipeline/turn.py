"""One stage's turn in a run, as its record is made: how the stage came and the memory predicted
and found (as the turn starts), its peak and time (as it runs); the turn's end adds how it left
and makes the core's :class:`~trash_panda._core.StageRecord` of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .. import _core

__all__ = ["Turn"]


@dataclass
class Turn:
    arrival: _core.Arrival | None = None  # None: read at its start
    file_changed: str | None = None  # why a kept stage was let go: its checkpoint changed
    predicted: _core.Free | None = None
    actual: _core.Free | None = None
    replan: _core.Replan | None = None  # why a stage read ahead was planned again at its start
    read_before_start: int = 0
    read_again: int = 0  # blocks given back since its last run, read again ahead of this one
    peak: int = 0
    overlapped: bool = False  # another stage's set-up paused the meter meanwhile
    seconds: float = 0.0
    share: _core.Share | None = None  # a group's member: why it got its share of the memory
