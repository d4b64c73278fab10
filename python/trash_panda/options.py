"""The options every entry point shares, checked and split in one place: which of plan()'s
options stream_load() needs too, the checks of the arguments they take alike (an order, a
flag, a checkpoint path, plan() options), the key a checkpoint is known by, and the activation
memory remembered under that key for the next plan of it."""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .errors import ArgumentError

if TYPE_CHECKING:
    from .checkpoint import Checkpoint
    from .plan import Plan

__all__ = [
    "LOAD_OPTIONS",
    "WITH_A_PLAN",
    "accepted_plan_options",
    "check_flag",
    "check_order",
    "checkpoint_key",
    "checkpoint_path",
    "load_options",
    "remember_activation",
    "remembered_activation",
    "with_remembered_activation",
]

# What stream_load() needs besides the plan: how the checkpoint's names map to the model's.
LOAD_OPTIONS = ("key_map", "skip_prefixes")
# What a plan not made by plan() (Plan.manual, or one read from JSON before it was resolved)
# still takes from the options when stream_load() resolves it; a resolved plan carries them.
_RESOLVE_OPTIONS = ("compute_dtype", "storage_dtype")
# The options that may come with a plan given whole: none of them plans.
WITH_A_PLAN = LOAD_OPTIONS + _RESOLVE_OPTIONS


def load_options(options: Mapping[str, Any], plan: Plan) -> dict[str, Any]:
    """Of ``options`` (plan()'s keyword arguments), those stream_load() takes with ``plan``."""
    keys = LOAD_OPTIONS if plan.resolved else LOAD_OPTIONS + _RESOLVE_OPTIONS
    return {k: options[k] for k in keys if k in options}


def accepted_plan_options(besides: tuple[str, ...] = ()) -> set[str]:
    """plan()'s keyword arguments, less ``besides``."""
    from .plan import plan

    return set(inspect.signature(plan).parameters) - {"model", "checkpoint", *besides}


def check_order(order: object, what: str = "order") -> None:
    """``order`` is None or a list of block names."""
    if order is None:
        return
    if isinstance(order, str) or not isinstance(order, Iterable) or not all(isinstance(n, str) for n in order):
        raise ArgumentError(f"{what}: expected a list of block names")


def check_flag(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ArgumentError(f"{name}: expected True or False, got {value!r}")


def checkpoint_path(path: object, what: str = "path") -> str | os.PathLike[str]:
    """A checkpoint's path: as given, or a :class:`~trash_panda.Checkpoint`'s (its one file, or
    the folder of its shards)."""
    from .checkpoint import Checkpoint

    if isinstance(path, Checkpoint):
        return _path_of(path)
    if not isinstance(path, str | os.PathLike):
        raise ArgumentError(f"{what}: expected a checkpoint path, got {type(path).__name__}")
    return path


def _path_of(ckpt: Checkpoint) -> str:
    files = ckpt.files
    return files[0] if len(files) == 1 else os.path.dirname(files[0])


def checkpoint_key(key: str | os.PathLike[str]) -> str:
    """What a checkpoint (or a caller's own key) is remembered under: its absolute path."""
    return os.path.abspath(os.fspath(key))


# Peak activation memory of earlier stages in this process, by key: the next plan of the same
# key uses it as activation_vram.
_PEAKS: dict[str, int] = {}
_PEAKS_LOCK = threading.Lock()


def remembered_activation(key: str | os.PathLike[str]) -> int | None:
    """The peak memory remembered under ``key`` by an earlier stage, in bytes (None if none)."""
    with _PEAKS_LOCK:
        return _PEAKS.get(checkpoint_key(key))


def remember_activation(key: str | os.PathLike[str], peak: int) -> None:
    """Remembers ``peak`` under ``key``: the next plan of that key in this process uses it."""
    with _PEAKS_LOCK:
        _PEAKS[checkpoint_key(key)] = peak


def with_remembered_activation(options: Mapping[str, Any], key: str | os.PathLike[str]) -> dict[str, Any]:
    """``options`` with the peak remembered under ``key`` as ``activation_vram``, unless they
    give one."""
    out = dict(options)
    if out.get("activation_vram") is None:
        remembered = remembered_activation(key)
        if remembered is not None:
            out["activation_vram"] = remembered
    return out
