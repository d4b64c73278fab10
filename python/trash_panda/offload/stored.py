"""Expanding a weight's stored form on the CPU: the one call the loader, the CPU backend and
putting a model back share, whatever the form (a float to cast, fp8 or int8 with a scale, GGML
blocks held as bytes) and whether the model takes its rows in another order."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import _core
from .._dtypes import core_name

if TYPE_CHECKING:
    import torch


def expand_stored(
    stored: torch.Tensor,
    held: str,
    out: torch.Tensor,
    scale: torch.Tensor | None = None,
    kind: str = "none",
    order: list[int] | None = None,
    threads: int | None = None,
) -> None:
    """Expands ``stored`` (holding ``held``: a header name such as "F8_E4M3", or a GGML block
    type held as bytes) into ``out`` (the compute dtype, the weight's shape), with its scale laid
    out as ``kind``, and row ``r`` of ``out`` taken from stored row ``order[r]`` when given."""
    import torch

    rows, cols = _core.rows_cols(list(out.shape))
    values = None
    if scale is not None:
        values = scale.to(dtype=torch.float32).contiguous().reshape(-1)
    _core.expand(
        stored.contiguous().reshape(-1).view(torch.uint8),
        held,
        out.reshape(-1).view(torch.uint8),
        core_name(out.dtype),
        rows,
        cols,
        scale_kind=kind if scale is not None else "none",
        scale=values,
        threads=threads,
        order=order,
    )
