"""Matching a checkpoint's tensor names to a model's: key_map, skip_prefixes (scale tensors are
the core's: ``_core.is_scale_name``, ``_core.weight_of_scale``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from .errors import ArgumentError

if TYPE_CHECKING:
    from ._core import TensorInfo
    from .checkpoint import Checkpoint

KeyMap = Mapping[str, str] | Callable[[str], str | None] | None


def mapper(key_map: KeyMap) -> Callable[[str], str | None]:
    """A function from checkpoint names to model names (None drops the tensor).

    ``key_map`` is a mapping of checkpoint prefixes to model prefixes (the longest matching
    prefix wins; an empty string as value strips the prefix), or a callable.
    """
    if key_map is None:
        return lambda name: name
    if callable(key_map):
        return key_map
    if not isinstance(key_map, Mapping):
        raise ArgumentError(f"key_map: expected a dict of prefixes or a callable, got {type(key_map).__name__}")
    prefixes = sorted(key_map.items(), key=lambda kv: len(kv[0]), reverse=True)

    def rename(name: str) -> str | None:
        for old, new in prefixes:
            if name.startswith(old):
                return new + name[len(old) :]
        return name

    return rename


def check_prefixes(skip_prefixes: object) -> tuple[str, ...]:
    if skip_prefixes is None:
        return ()
    if isinstance(skip_prefixes, str) or not all(isinstance(p, str) for p in skip_prefixes):  # type: ignore[attr-defined]
        raise ArgumentError("skip_prefixes: expected a list of name prefixes")
    return tuple(skip_prefixes)  # type: ignore[arg-type]


def model_tensors(ckpt: Checkpoint, key_map: KeyMap = None, skip_prefixes: object = None) -> dict[str, TensorInfo]:
    """The checkpoint's tensors under the model's names, without the skipped ones.

    ``skip_prefixes`` are matched against both the checkpoint's and the model's name.
    """
    rename = mapper(key_map)
    skip = check_prefixes(skip_prefixes)
    out: dict[str, TensorInfo] = {}
    for info in ckpt.tensors():
        if info.name.startswith(skip) if skip else False:
            continue
        name = rename(info.name)
        if name is None or (skip and name.startswith(skip)):
            continue
        if name in out:
            raise ArgumentError(f"key_map maps two checkpoint tensors to {name!r} (one is {info.name!r})")
        out[name] = info
    return out
