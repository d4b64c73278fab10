"""Stage: one model of a :class:`~trash_panda.pipeline.Pipeline`, as given by the caller (its
build function, checkpoint and plan options), checked when it is made."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ArgumentError
from ..options import accepted_plan_options, check_order, checkpoint_path

if TYPE_CHECKING:
    from torch import nn

__all__ = ["Stage"]


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
