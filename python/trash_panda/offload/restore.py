"""What handle.remove() leaves behind: every hooked block holding real weights again, so the
model runs plainly (at its full memory cost) until it is released or hooked again.

Streamed blocks get their weights from the checkpoint's map: on the CPU a tensor already in the
compute dtype is a view of the mapped file (no copy; pages are read when first touched), the
others are expanded once. Resident blocks that were expanded on each run are expanded once.
Resident weights that are gone (freed by a final pass, or not read yet by the loader of
``stage(overlap=True)``) come from the checkpoint as streamed ones do. The placeholders stay in
the block state, so a new install_offload() streams the blocks again.

On CUDA every one of those weights lands on the GPU, which a model that needed streaming rarely
has room for: :func:`check_restore_fits` refuses before anything changes, with the numbers.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..errors import StreamError
from .backends.swap import swap

if TYPE_CHECKING:
    import torch

    from .state import ModelState, TensorSpec

__all__ = ["check_restore_fits", "restore_blocks", "restore_bytes"]


def restore_bytes(state: ModelState) -> int:
    """The bytes :func:`restore_blocks` puts on the model's device: every weight it expands or
    reads, in the compute dtype. Weights a resident block uses as they are stay where they are,
    and so do the stored copies of those it expands."""
    return sum(
        math.prod(spec.shape) * spec.target.itemsize
        for block in state.blocks
        for spec in block.tensors
        if spec.needs_work or _gone(spec)
    )


def refusal(needed: int, free: int, held: int) -> str | None:
    """Why restoring ``needed`` bytes cannot work with ``free`` bytes free on the device and
    ``held`` bytes that closing the hooks gives back (device slots, the expansion buffer); None
    when it fits."""
    if needed <= free + held:
        return None
    gb = 1e9
    return (
        f"remove() would put {needed / gb:.2f} GB of streamed weights on the GPU, which has "
        f"{free / gb:.2f} GB free and {held / gb:.2f} GB more once the hooks' device slots and expansion "
        f"buffer are freed ({(needed - free - held) / gb:.2f} GB short); the hooks stay installed. "
        "release(model) frees the model; to run it without hooks, load it with a plan that keeps every block resident"
    )


def check_restore_fits(state: ModelState, held: int) -> None:
    """Raises :class:`StreamError` before anything changes when restoring the blocks on a GPU
    would not fit in its free memory plus ``held`` (what closing the hooks frees). Nothing to
    check on the CPU."""
    free = _free_on(state)
    if free is None:
        return
    why = refusal(restore_bytes(state), free, held)
    if why is not None:
        raise StreamError(why)


def _free_on(state: ModelState) -> int | None:
    """Free bytes on the model's GPU: the driver's, and the unused whole segments torch's caching
    allocator keeps (it gives those back when an allocation needs them; free pieces of segments
    in use it cannot). None on the CPU."""
    import torch

    if state.device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(state.device)
    stats = torch.cuda.memory_stats(state.device)
    cached = (
        stats.get("reserved_bytes.all.current", 0)
        - stats.get("allocated_bytes.all.current", 0)
        - stats.get("inactive_split_bytes.all.current", 0)
    )
    return int(free) + max(0, int(cached))


def restore_blocks(state: ModelState) -> None:
    """Puts the weights of every block of ``state`` back into its modules."""
    for block in state.blocks:
        streamed = block.engine_index is not None
        for spec in block.tensors:
            if spec.needs_work:
                swap(spec, _weight(state, spec, from_file=streamed or spec.resident is None))
            elif _gone(spec):
                swap(spec, _weight(state, spec, from_file=True))


def _gone(spec: TensorSpec) -> bool:
    param = spec.held()
    return param is None or param.is_meta


def _weight(state: ModelState, spec: TensorSpec, *, from_file: bool) -> torch.Tensor:
    import torch

    from .._dtypes import is_block, needs_expansion
    from .materialize import read_many
    from .stored import expand_stored

    if from_file and spec.info.source is not None:
        # A part of a file's tensor (rows of a fused one) has no name in the file: read its bytes.
        stored = read_many([spec.info], threads=2, lane=state.lane)[0]
        scale = state.checkpoint.read(spec.scale.name) if spec.scale is not None else None
        held = spec.info.dtype
    elif from_file:
        stored = state.checkpoint.read(spec.info.name)
        scale = state.checkpoint.read(spec.scale.name) if spec.scale is not None else None
        held = spec.info.dtype
    else:
        assert spec.resident is not None
        stored, scale = spec.resident, spec.resident_scale
        held = spec.held_name(stored)
    kind = spec.scale_kind if scale is not None else "none"
    if not spec.reordered and not needs_expansion(held, spec.target, scale is not None):
        out = stored.reshape(spec.shape)
    elif stored.device.type == "cuda":
        from .backends.cuda import expand_into

        out = torch.empty(spec.shape, dtype=spec.target, device=stored.device)
        block = held if is_block(held) else None
        expand_into(out, stored, scale, kind, block, spec.info.rows)
    else:
        out = torch.empty(spec.shape, dtype=spec.target)
        expand_stored(stored, held, out, scale, kind, spec.info.rows)
    # On CUDA the plain model needs its weights on the device: a copy.
    return out.to(state.device) if out.device != state.device else out
