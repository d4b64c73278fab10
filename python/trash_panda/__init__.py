"""trash-panda: run models bigger than your GPU by streaming weights across GPU, RAM and disk."""

from __future__ import annotations

from . import dtype, errors
from ._core import __version__
from .checkpoint import Checkpoint
from .plan import Plan, Tier, plan
from .errors import (
    ArgumentError,
    CheckpointError,
    DtypeError,
    PlanError,
    ReadError,
    SystemProbeError,
    TrashPandaError,
)

__all__ = [
    "ArgumentError",
    "Checkpoint",
    "CheckpointError",
    "DtypeError",
    "Plan",
    "PlanError",
    "ReadError",
    "SystemProbeError",
    "Tier",
    "TrashPandaError",
    "__version__",
    "dtype",
    "errors",
    "plan",
]
