"""Matching a checkpoint's tensor names to a model's: key_map, skip_prefixes (scale tensors are
the core's: ``_core.is_scale_name``, ``_core.weight_of_scale``), and :class:`TensorMap`, which
also says which rows of a file's tensor a model's tensor is."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import ArgumentError

if TYPE_CHECKING:
    from ._core import TensorInfo
    from .checkpoint import Checkpoint


@dataclass(frozen=True)
class TensorView:
    """One of a model's tensors in a tensor of the file: its ``name`` in the model, the rows
    ``first..first + count`` of the file's tensor (all of them when ``count`` is None), taken in
    ``order`` when given (row ``r`` of the model's tensor is row ``order[r]`` of those)."""

    name: str
    first: int = 0
    count: int | None = None
    order: tuple[int, ...] | None = None


class TensorMap:
    """A file's tensors under a model's names where that is more than a rename: a tensor that
    holds several of the model's (rows of a fused projection), or whose rows the model takes in
    another order. Made from the ecosystem's own conversions (transformers' GGUF tables,
    diffusers' single-file converters) and given as ``key_map``; the core reads each view's rows
    as one run of the file and reorders them as it expands."""

    def __init__(self, views: Mapping[str, Sequence[TensorView]]) -> None:
        self.views = {k: tuple(v) for k, v in views.items()}

    def apply(self, infos: Sequence[TensorInfo]) -> list[tuple[str, TensorInfo]]:
        """(the model's name, its entry) for each view of the file's tensors ``infos``."""
        out = []
        for info in infos:
            for view in self.views.get(info.name, ()):
                part = info
                rows = int(info.shape[0]) if info.shape else 1
                if view.first != 0 or (view.count is not None and view.count != rows):
                    count = rows - view.first if view.count is None else view.count
                    part = info.sliced(view.first, count, f"{info.name}[{view.first}:{view.first + count}]")
                if view.order is not None:
                    part = part.reordered(list(view.order))
                out.append((view.name, part))
        return out


KeyMap = Mapping[str, str] | Callable[[str], str | None] | TensorMap | None


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
    skip = check_prefixes(skip_prefixes)
    out: dict[str, TensorInfo] = {}
    if isinstance(key_map, TensorMap):
        pairs: list[tuple[str | None, TensorInfo]] = list(key_map.apply(ckpt.tensors()))
    else:
        rename = mapper(key_map)
        pairs = [(rename(info.name), info) for info in ckpt.tensors()]
    for name, info in pairs:
        if info.name.startswith(skip) if skip else False:
            continue
        if name is None or (skip and name.startswith(skip)):
            continue
        if name in out:
            raise ArgumentError(f"key_map maps two checkpoint tensors to {name!r} (one is {info.name!r})")
        out[name] = info
    return out
