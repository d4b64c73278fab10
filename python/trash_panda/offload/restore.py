"""What handle.remove() leaves behind: every hooked block holding real weights again, so the
model runs plainly (at its full memory cost) until it is released or hooked again.

Streamed blocks get their weights from the checkpoint's map: on the CPU a tensor already in the
compute dtype is a view of the mapped file (no copy; pages are read when first touched), the
others are expanded once. Resident blocks that were expanded on each run are expanded once.
Resident weights that are gone (freed by a final pass, or not read yet by the loader of
``stage(overlap=True)``) come from the checkpoint as streamed ones do. The placeholders stay in
the block state, so a new install_offload() streams the blocks again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .work import swap

if TYPE_CHECKING:
    import torch

    from .state import ModelState, TensorSpec

__all__ = ["restore_blocks"]


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
    module, attr = spec.owners[0]
    param = module._parameters.get(attr)
    return param is None or param.is_meta


def _weight(state: ModelState, spec: TensorSpec, *, from_file: bool) -> torch.Tensor:
    import torch

    from .. import dtype as kernels

    if from_file:
        stored = state.checkpoint.read(spec.info.name)
        scale = state.checkpoint.read(spec.scale.name) if spec.scale is not None else None
    else:
        assert spec.resident is not None
        stored, scale = spec.resident, spec.resident_scale
    if stored.dtype == spec.target and scale is None:
        out = stored.reshape(spec.shape)
    elif stored.device.type == "cuda":
        from .cuda import _expand_into

        out = torch.empty(spec.shape, dtype=spec.target, device=stored.device)
        _expand_into(out, stored, scale, spec.scale_kind)
    else:
        if scale is not None:
            scale = scale.to(dtype=torch.float32)
            if spec.scale_kind == "row":
                scale = scale.reshape(-1, 1)
        out = kernels.expand(stored, spec.target, scale)
    # On CUDA the plain model needs its weights on the device: a copy.
    return out.to(state.device) if out.device != state.device else out
