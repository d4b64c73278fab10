"""Reading tensors of a checkpoint onto their device as the loader and the outside weights need
them: one call of the core per group, through the model's read lane, kept as stream_load keeps
them; on a device with memory of its own, through host memory (the loader's pinned ring) and a
copy on the loader's stream."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from .materialize import Place, read_groups, read_many, settle, stored_bytes
from .meter import meter_for

if TYPE_CHECKING:
    import torch

    from .. import _core
    from .backends.loader_copies import LoaderCopies
    from .state import BlockState, TensorSpec

__all__ = ["block_groups", "held_bytes", "read_group", "through_host"]

# The caching allocator of CUDA hands out multiples of 512 bytes: what its counters see of a tensor.
_CUDA_ROUNDING = 512


def through_host(
    group: list[TensorSpec],
    device: torch.device,
    storage: str | None,
    threads: int,
    lane: _core.ReadLane | None,
    position: int | None,
    copies: LoaderCopies,
    *,
    expand: bool = False,
) -> None:
    """Reads ``group`` into host memory (the loader's pinned ring where it fits), then copies
    each tensor to the device through the meter."""
    import torch

    ring = copies.group(sum(stored_bytes(s) for s in group))
    place = ring.take if ring is not None else None
    read_group(group, torch.device("cpu"), storage, threads, lane, position, expand=expand, place=place)
    meter = meter_for(device)
    for spec in group:
        meter.moved_in(functools.partial(_copy_to, spec, device, copies))


def read_group(
    group: list[TensorSpec],
    device: torch.device,
    storage: str | None,
    threads: int,
    lane: _core.ReadLane | None,
    position: int | None,
    *,
    expand: bool = False,
    place: Place | None = None,
) -> int:
    """Reads tensors (and their scales) in one call of the core through ``lane``, as the block
    at ``position`` of the run order, and keeps them on ``device`` as stream_load would (kept
    stored, or with ``expand`` in the compute dtype); returns what they hold there. ``place``:
    where each is read (see :func:`.materialize.read_many`)."""
    infos = [s.info for s in group] + [s.scale for s in group if s.scale is not None]
    read = read_many(infos, threads, lane, position, place)
    scales = iter(read[len(group) :])
    for spec, stored in zip(group, read[: len(group)], strict=True):
        scale = next(scales) if spec.scale is not None else None
        settle(spec, stored, scale, device, storage=storage, expand=expand)
    return sum(held_bytes(spec, device) for spec in group)


def block_groups(block: BlockState, copies: LoaderCopies | None) -> list[list[TensorSpec]]:
    specs = block.tensors
    if copies is None or not specs:
        return [specs] if specs else []
    return read_groups(specs)


def _copy_to(spec: TensorSpec, device: torch.device, copies: LoaderCopies) -> int:
    """Copies a tensor read into host memory to the device (the same bytes) on the loader's
    stream; returns what it holds there."""
    from torch import nn

    if spec.resident is not None:
        host = [spec.resident] + ([spec.resident_scale] if spec.resident_scale is not None else [])
        moved = copies.put(host)
        spec.keep_stored(moved[0], moved[1] if len(moved) > 1 else None, spec.placeholder)
    else:
        spec.put(nn.Parameter(copies.put([spec.held()])[0], requires_grad=False))
    return held_bytes(spec, device)


def held_bytes(spec: TensorSpec, device: torch.device) -> int:
    """The bytes a loaded tensor holds on ``device`` (with its scale), as the device's meter
    counts them: each storage once, rounded up on CUDA as its allocator rounds."""
    storages: dict[int, int] = {}
    for t in (spec.resident, spec.resident_scale, spec.held()):
        if t is not None and not t.is_meta:
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    if device.type != "cuda":
        return sum(storages.values())
    return sum(-(-n // _CUDA_ROUNDING) * _CUDA_ROUNDING for n in storages.values())
