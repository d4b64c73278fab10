"""Stage and Group: one model of a :class:`~trash_panda.pipeline.Pipeline`, as given by the
caller (its build function, checkpoint and plan options), and stages that run together; each
checked when it is made."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import _core
from ..errors import ArgumentError
from ..options import accepted_plan_options, check_order, checkpoint_path

if TYPE_CHECKING:
    from torch import nn

__all__ = ["Calls", "Group", "Stage", "schedule_of"]


@dataclass(frozen=True)
class Stage:
    """One model of a pipeline: ``build_fn()`` returns it on the meta device (called once: the
    pipeline loads and releases that module as often as it needs; for a stage read ahead, on the
    pipeline's own thread while the stage before it runs), ``path`` is its
    checkpoint (a file, an index of shards, or a folder), ``options`` go to
    :func:`trash_panda.plan` (``max_vram``, ``resident_blocks``, ``compute_dtype``, ...).
    ``order`` names the blocks that run first; without it the order file next to the
    checkpoint (or in ``order_file_destination``) gives it and is written after a run, as
    :func:`trash_panda.stage` does. ``key`` is what its peak activation memory is remembered
    under (default: the checkpoint path)."""

    name: str
    build_fn: Callable[[], nn.Module]
    path: str | os.PathLike[str]
    options: dict[str, Any] = field(default_factory=dict)
    order: list[str] | None = None
    order_file_destination: str | os.PathLike[str] | None = None
    key: str | os.PathLike[str] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ArgumentError(f"name: expected a non-empty str, got {self.name!r}")
        if not callable(self.build_fn):
            raise ArgumentError(
                f"stage {self.name}: build_fn: expected a callable that returns the model, "
                f"got {type(self.build_fn).__name__}"
            )
        object.__setattr__(self, "path", checkpoint_path(self.path, f"stage {self.name}: path"))
        check_order(self.order, f"stage {self.name}: order")
        accepted = accepted_plan_options(besides=("device",))
        unknown = sorted(set(self.options) - accepted)
        if unknown:
            raise ArgumentError(
                f"stage {self.name}: {', '.join(unknown)}: not plan() options; expected some of "
                f"{', '.join(sorted(accepted))} (the pipeline gives the device)"
            )

    @property
    def memo_key(self) -> str | os.PathLike[str]:
        """What its peak activation memory is remembered under: ``key``, else its checkpoint."""
        return self.key if self.key is not None else self.path


Calls = Mapping[str, int] | Sequence[tuple[str, int]]
"""A group's schedule as the caller gives it: ``{"high": 20, "low": 20}`` (each member's calls,
in the order they come) or ``[("controlnet", 1), ("unet", 1)] * 30`` (stretches in order)."""


@dataclass(frozen=True)
class Group:
    """Stages of a :class:`~trash_panda.pipeline.Pipeline` that run together under one budget,
    entered with ``run.group(name)``: two experts of a denoiser that take turns, a ControlNet
    beside its denoiser, a draft model beside the model it drafts for. ``members`` are stage
    names, consecutive in the pipeline. ``schedule`` (optional, also given per run) says which
    member is called how many times in what order; without one, the first run's calls are
    learned (see :meth:`~trash_panda.pipeline.PipelineRun.group`)."""

    name: str
    members: Sequence[str]
    schedule: Calls | _core.Schedule | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ArgumentError(f"name: expected a non-empty str, got {self.name!r}")
        members = self.members
        if isinstance(members, str) or not all(isinstance(m, str) for m in members):
            raise ArgumentError(f"group {self.name}: members: expected a list of stage names, got {members!r}")
        members = list(members)
        if len(members) < 2 or len(set(members)) != len(members):
            raise ArgumentError(
                f"group {self.name}: members: expected two or more different stage names, got {members!r}"
            )
        object.__setattr__(self, "members", members)
        if self.schedule is not None:  # checked, and kept as the core's schedule
            object.__setattr__(self, "schedule", schedule_of(self.name, members, self.schedule))


def schedule_of(group: str, members: Sequence[str], calls: Calls | _core.Schedule) -> _core.Schedule:
    """The core's schedule of ``calls`` (see :data:`Calls`) for the group ``group``."""
    if isinstance(calls, _core.Schedule):
        pairs = calls.runs
    elif isinstance(calls, Mapping):
        pairs = list(calls.items())
    elif isinstance(calls, Sequence) and not isinstance(calls, str):
        pairs = list(calls)
    else:
        raise ArgumentError(
            f"group {group}: schedule: expected {{member: calls}} or [(member, calls), ...], got {type(calls).__name__}"
        )
    for pair in pairs:
        if (
            not isinstance(pair, tuple)
            or len(pair) != 2
            or not isinstance(pair[0], str)
            or not isinstance(pair[1], int)
            or isinstance(pair[1], bool)
            or pair[1] < 0
        ):
            raise ArgumentError(
                f"group {group}: schedule: expected (member, calls) pairs with calls a count, got {pair!r}"
            )
    return _core.Schedule(group, list(members), pairs)
