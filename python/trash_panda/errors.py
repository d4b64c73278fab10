"""Exceptions raised by trash_panda.

Every error of the library is a :class:`TrashPandaError`. Each kind also derives from the builtin
exception a caller would expect (a bad checkpoint is a ``ValueError``, a failed read an
``OSError``), so existing ``except ValueError`` code keeps working.
"""

from __future__ import annotations


class TrashPandaError(Exception):
    """Base class of every trash_panda error."""


class CheckpointError(TrashPandaError, ValueError):
    """A checkpoint is malformed, inconsistent, or lacks a tensor that was asked for."""


class ReadError(TrashPandaError, OSError):
    """Reading a checkpoint's bytes failed."""


class DtypeError(TrashPandaError, ValueError):
    """An unknown dtype, or a conversion whose inputs do not fit together."""


class ArgumentError(TrashPandaError, ValueError):
    """An argument has the wrong type, shape or value."""


class PlanError(TrashPandaError, ValueError):
    """A plan cannot be made or edited: an edit names no block, or names one twice."""


class StreamError(TrashPandaError, RuntimeError):
    """Streaming a block failed: the engine was closed, a block was not staged, a worker died."""


class OrderError(TrashPandaError, OSError):
    """An order file could not be written (its folder is missing, read-only, or a file): the
    message names the file and the step that failed; the file that was there is left as it was."""


class SystemProbeError(TrashPandaError, OSError):
    """The machine's memory figures could not be read."""


class TraceError(TrashPandaError, RuntimeError):
    """A model's forward cannot run on the meta device (``trace_order``): it needs tensor values."""


__all__ = [
    "ArgumentError",
    "CheckpointError",
    "DtypeError",
    "OrderError",
    "PlanError",
    "ReadError",
    "StreamError",
    "SystemProbeError",
    "TraceError",
    "TrashPandaError",
]
