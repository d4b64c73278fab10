"""Merges kept where the block lives: a merged tensor written into its streamed block's image in
the engine (the core's patched images), so every later staging brings it merged at the cost of
an unmerged one, and nothing is merged on a run.

A RAM-tier block's image is private memory that stands for the block's pages of the
checkpoint's map (given back, so it takes what the plan counted for the block); with the RAM
tier held in private memory it comes on top, from the RAM the plan leaves free. A disk-tier
block's image is an overlay file (``overlay_dir``, ``overlay_limit``), read as the block is.
Taking a merge back stages the checkpoint's exact bytes again.

An overlay file is named by what its bytes depend on (the checkpoint's files, the block, and
each layer's merges: adapter weights, scales, compute dtype, device kind, the versions of PEFT
and torch) and outlives its run: once every merge of a block is recorded, an image of exactly
those merges found in the folder is adopted (:func:`adopt`), and the block merges nothing.

The merged tensor is written in the block's staged form: the stored dtype where converting to
it and back gives the merged weight's exact bits, or the fp8 codes and scales of its
requantization. Where neither holds (a scale tensor that is not float32, a stored dtype that
would round the merge) or a block can keep no image (no room, no overlay folder) the merge is
kept beside the model instead (:class:`.merges.MergedCopies`), or made on each run. On a GPU
the image is in host memory, as the block's staging is: the device copies the merged bytes.
"""

from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import _core
from .._dtypes import torch_dtype
from ..adapter_names import merged_layers
from ..errors import StreamError

if TYPE_CHECKING:
    import torch
    from torch import nn

    from .merges import Kept, Merge, MergedCopies
    from .state import ModelState, TensorSpec

__all__ = ["Patched", "adopt", "block_of", "drop_image", "image_place", "images_for", "take_back", "write"]

# The folder of overlay files could not be used: merges of disk-tier blocks are kept beside the
# model (or made on each run) instead, said once per folder.
_WARNED: set[str] = set()


@dataclass
class Patched:
    """A merged tensor written into its block's image."""

    key: tuple[Any, ...]  # the merges it holds (as :attr:`.merges.Merge.key`)
    block: int  # the engine's index of its block
    tensors: list[int]  # the staged tensors written (the weight, and its scale tensor)
    place: str  # "memory" or "file"
    # The weight staged before it was written, which the run that wrote it still holds.
    before: weakref.ref[Any] | None = None

    def written_over(self, param: Any) -> bool:
        """Whether ``param`` was staged before the merge was written (so it is not merged)."""
        return self.before is not None and self.before() is param


def block_of(state: ModelState, spec: TensorSpec) -> int | None:
    """The engine's index of the streamed block that stages ``spec`` (None: not streamed)."""
    if spec.staged_index is None:
        return None
    for block in state.blocks:
        if block.engine_index is not None and any(t is spec for t in block.tensors):
            return block.engine_index
    return None


def image_place(state: ModelState, block: int, copies: MergedCopies) -> tuple[str, int] | None:
    """Where ``block``'s image would be kept, and what it takes beyond the plan's count of the
    block: ("memory", 0) for a staged block of a mapped RAM tier (its pages go), ("memory",
    bytes) with the RAM tier in private memory, ("file", 0) for a disk-tier block or one used
    in place, with an overlay folder (a RAM-tier block's file stays in the page cache in place
    of its pages); None where no image can be kept (a GPU, no folder, no room)."""
    engine = state.engine
    if engine is None or engine.closed:
        return None
    if block in copies.images:
        return copies.images[block], 0
    tier = next(b.tier for b in state.blocks if b.engine_index == block)
    if tier == _core.Tier.DISK or engine.in_place(block):
        # Read as a drive is, or used in place from a map: an overlay file, where the folder's
        # limit leaves room beside this model's other files.
        if not _overlays(state, copies):
            return None
        room = copies.overlay_limit - engine.overlay_bytes().file
        return ("file", 0) if engine.patched_image_len(block) <= room else None
    if engine.ram_image(block) is None:
        return "memory", 0
    extra = _core.patched_image_bytes(engine.patched_image_len(block), True)
    return ("memory", extra) if copies.held + extra <= copies.limit else None


def images_for(state: ModelState, module: nn.Module, copies: MergedCopies) -> str | None:
    """Where a merge of the streamed layer ``module`` would be kept in its blocks' images
    ("memory" or "file", "file" if any is), None where some cannot be (the caller weighs the
    other ways)."""
    places = set()
    for spec in state.specs_of(module):
        block = block_of(state, spec)
        place = image_place(state, block, copies) if block is not None else None
        if place is None:
            return None
        places.add(place[0])
    if not places:
        return None
    return "file" if "file" in places else "memory"


def write(
    state: ModelState,
    spec: TensorSpec,
    merges: list[Merge],
    made: Kept,
    merged: torch.Tensor,
    copies: MergedCopies,
    before: Any,
) -> bool:
    """Writes the merge of ``spec`` (``merges``, as recorded; ``made``, as it is kept;
    ``merged``, the weight the layer ran on; ``before``, the weight it was staged with) into its
    block's image; False where it cannot be written exactly (the caller keeps it beside the
    model)."""
    slot = (id(spec.owners[0][0]), spec.owners[0][1])
    found = copies.patched.get(slot)
    if found is not None and found.key == made.key:
        return True  # written by an earlier call of the same run
    block = block_of(state, spec)
    if block is None or state.engine is None:
        return False
    place = image_place(state, block, copies)
    if place is None:
        return False
    parts = _staged_parts(state, block, spec, made, merged)
    if parts is None:
        return False
    engine = state.engine
    written: list[int] = []
    key = _content_key(state, merges, copies)
    try:
        for index, data, scale in parts:
            kept = engine.patch(block, index, data, key, place[0], scale=scale)
            written.append(index)
    except StreamError as e:
        # Refused (a full overlay folder, a failed write): what this call wrote goes, and where
        # a write failed part way the engine dropped the block's image, every patch with it.
        if written:
            engine.unpatch(block, written)
        _forget_dropped(state, block, copies)
        if not copies.refused:
            copies.refused = True
            warnings.warn(
                f"cannot keep a merged block where it lives: {e}; such layers are merged as they "
                "run (or kept beside the model where the plan leaves RAM free)",
                stacklevel=2,
            )
        return False
    if block not in copies.images:
        copies.images[block] = kept
        copies.held += place[1]
        copies.image_extra[block] = place[1]
    copies.patched[slot] = Patched(made.key, block, written, kept, weakref.ref(before))
    _bytes_changed(state, block)
    return True


def take_back(state: ModelState, slot: tuple[int, str], copies: MergedCopies) -> None:
    """The merge written for ``slot`` goes: its block stages the checkpoint's bytes of it
    again, and an image left with no merge goes too."""
    found = copies.patched.pop(slot, None)
    if found is None:
        return
    engine = state.engine
    if engine is not None and not engine.closed:
        try:
            engine.unpatch(found.block, found.tensors)
        except StreamError as e:
            # The engine dropped the image: the block stages the checkpoint's bytes, as asked,
            # and the block's other merges are made again on their next run.
            warnings.warn(f"cannot keep a merged block where it lives: {e}", stacklevel=3)
        _bytes_changed(state, found.block)
        _forget_dropped(state, found.block, copies)
        if engine.patches(found.block):
            return
    copies.images.pop(found.block, None)
    copies.held -= copies.image_extra.pop(found.block, 0)


def drop_image(state: ModelState, block: int) -> int:
    """Every merge written into ``block`` (engine index) goes at once, with its image: a final
    pass frees the block. Returns the bytes of memory given back."""
    copies = state.merged
    if copies is None or block not in copies.images:
        return 0
    slots = [slot for slot, found in copies.patched.items() if found.block == block]
    tensors = sorted({t for slot in slots for t in copies.patched.pop(slot).tensors})
    engine = state.engine
    freed = 0
    if engine is not None and not engine.closed and tensors:
        before = engine.overlay_bytes().memory
        engine.unpatch(block, tensors)
        freed = before - engine.overlay_bytes().memory
        _bytes_changed(state, block)
    copies.images.pop(block, None)
    copies.held -= copies.image_extra.pop(block, 0)
    return freed


def adopt(state: ModelState, block: int, copies: MergedCopies) -> None:
    """Where every merge recorded on ``block``'s streamed layers is known, and the overlay folder
    holds an image of exactly those merges (an earlier run's with the same adapters and scales,
    or this one's before they were taken back), the block is staged from it from now on: its
    layers then merge nothing, their first run included when the block was not staged yet."""
    engine = state.engine
    found = next((b for b in state.blocks if b.engine_index == block), None)
    if engine is None or engine.closed or found is None:
        return
    if not (found.tier == _core.Tier.DISK or engine.in_place(block)) or not _overlays(state, copies):
        return  # a memory image is made by its run, never found
    keys: dict[int, str] = {}
    slots: list[tuple[TensorSpec, tuple[Any, ...], list[int]]] = []
    for spec in found.tensors:
        merges: list[Merge] = merged_layers(spec.owners[0][0])
        if not merges or spec.staged_index is None:
            continue
        indices = _write_indices(state, block, spec)
        if indices is None:
            return
        keys.update(dict.fromkeys(indices, _content_key(state, merges, copies)))
        slots.append((spec, tuple(m.key for m in merges), indices))
    if not keys or engine.patches(block) == keys or not engine.adopt(block, keys):
        return
    copies.images[block] = "file"
    for spec, key, indices in slots:
        held = spec.held()
        before = weakref.ref(held) if held is not None else None
        copies.patched[(id(spec.owners[0][0]), spec.owners[0][1])] = Patched(key, block, indices, "file", before)
    _bytes_changed(state, block)


def _write_indices(state: ModelState, block: int, spec: TensorSpec) -> list[int] | None:
    """The staged tensors a merge into ``spec`` rewrites (:func:`_staged_parts`): the tensor,
    and a scale tensor of its own where it is stored in fp8 with one; None where none can be."""
    from .requant import fp8_layout

    assert state.engine is not None and spec.staged_index is not None
    layout = state.engine.layout(block)
    staged = layout[spec.staged_index]
    fp8 = fp8_layout(spec)
    if fp8 is None:
        return None if staged.own_scale is not None or staged.scale_index is not None else [spec.staged_index]
    if fp8 == "none" or staged.own_scale is not None:
        return [spec.staged_index]
    if staged.scale_index is not None and layout[staged.scale_index].dtype == "F32":
        return [spec.staged_index, staged.scale_index]
    return None


def _staged_parts(
    state: ModelState, block: int, spec: TensorSpec, made: Kept, merged: torch.Tensor
) -> list[tuple[int, torch.Tensor, torch.Tensor | None]] | None:
    """(staged index, bytes, staged scale bytes) of each staged tensor the merge rewrites
    (:func:`_write_indices`); None where the staged form cannot give back the merged weight's
    exact bits."""
    import torch

    indices = _write_indices(state, block, spec)
    if indices is None:
        return None
    assert state.engine is not None and spec.staged_index is not None
    staged = state.engine.layout(block)[spec.staged_index]
    if made.layout is None:
        # Stored as a float: the merged weight in the stored dtype, if that loses nothing.
        weight = merged.detach().cpu().contiguous()
        data = weight.to(torch_dtype(staged.dtype))
        if not torch.equal(data.to(weight.dtype).view(torch.uint8), weight.view(torch.uint8)):
            return None
        return [(spec.staged_index, _raw(data), None)]
    codes = _raw(made.tensor)
    scale = None if made.scale is None else _raw(made.scale.to(torch.float32))
    if len(indices) == 2:  # the checkpoint's scale tensor
        assert scale is not None  # a layout with a scale tensor has scales
        return [(indices[0], codes, None), (indices[1], scale, None)]
    return [(spec.staged_index, codes, scale if staged.own_scale is not None else None)]


def _overlays(state: ModelState, copies: MergedCopies) -> bool:
    """Whether the model's engine keeps disk-tier images in an overlay folder (set up at the
    first asking, from ``overlay_dir`` and ``overlay_limit``)."""
    if copies.overlay_dir is not None:
        return bool(copies.overlay_dir)
    from ..settings import setting

    assert state.engine is not None
    engine = state.engine
    folder = str(setting("overlay_dir")) or str(_core.default_overlay_dir(state.checkpoint.files[0]))
    streamed = sum(engine.patched_image_len(b) for b in range(len(engine.order())))
    try:
        limit = _core.overlay_limit(str(setting("overlay_limit")), streamed)
        engine.keep_overlays_in(folder, limit)
    except StreamError as e:
        if folder not in _WARNED:
            _WARNED.add(folder)
            warnings.warn(
                f"cannot keep merged disk-tier blocks in {folder}: {e}; they are merged as they run "
                "(set TRASH_PANDA_OVERLAY_DIR to a writable folder)",
                stacklevel=2,
            )
        copies.overlay_dir = ""
        return False
    copies.overlay_dir, copies.overlay_limit = folder, limit
    return True


def _forget_dropped(state: ModelState, block: int, copies: MergedCopies) -> None:
    """Forgets the merges written into ``block`` that its image no longer holds; with none left,
    the image's room goes back."""
    assert state.engine is not None
    live = set(state.engine.patches(block))
    for slot in [s for s, p in copies.patched.items() if p.block == block and not set(p.tensors) <= live]:
        del copies.patched[slot]
    if not live and block in copies.images:
        copies.images.pop(block)
        copies.held -= copies.image_extra.pop(block, 0)


def _bytes_changed(state: ModelState, block: int) -> None:
    """``block``'s staged bytes changed: a device backend that copies the RAM tier straight from
    memory stops (or starts again) for it."""
    backend = getattr(state.handle, "backend", None)
    copies = getattr(backend, "copies", None)
    if copies is not None:
        copies.refresh_image(block)


def _raw(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes, as the engine takes them (in host memory)."""
    import torch

    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def _content_key(state: ModelState, merges: list[Merge], copies: MergedCopies) -> str:
    """The ``merges`` of a layer as text that names their merged bytes in another run too: per
    merge, the tuner layer's class, the adapters with their scales and a digest of their weights;
    and what else the bits depend on: the dtype and the kind of device the merge is computed in,
    and the versions of the code that computes it. Computed once per set of merges."""
    key = tuple(m.key for m in merges)
    found = copies.content_keys.get(key)
    if found is not None:
        return found
    import hashlib

    import peft
    import torch

    from ..adapter_names import adapter_tensors

    parts = [f"peft {peft.__version__}", f"torch {torch.__version__}", f"{state.compute_dtype} on {state.device.type}"]
    for merge in merges:
        digest = hashlib.blake2b(digest_size=16)
        for adapter in merge.adapters:
            for t in adapter_tensors(merge.layer, adapter):
                flat = t.detach().cpu().contiguous().reshape(-1)
                digest.update(str((adapter, t.dtype, tuple(t.shape))).encode())
                digest.update(flat.view(torch.uint8).numpy().tobytes())
        scales = sorted((a, float(v)) for a, v in merge.scaling.items() if a in merge.adapters)
        parts.append(f"{type(merge.layer).__name__} {merge.adapters} {scales} {merge.kwargs} {digest.hexdigest()}")
    text = "; ".join(parts)
    copies.content_keys[key] = text
    return text
