"""Conversion kernels of the core on torch CPU tensors: fp8 expansion, casts, fp8 quantization.

Each call releases the GIL and runs on several threads for large tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _core
from ._dtypes import core_name, resolve
from .errors import ArgumentError, DtypeError

if TYPE_CHECKING:
    import torch

__all__ = ["cast", "expand", "quantize_fp8", "rows_cols", "scale_shape"]

_FLOATS = ("float32", "float16", "bfloat16")


def _bytes(t: torch.Tensor) -> torch.Tensor:
    import torch

    return t.reshape(-1).view(torch.uint8)


def _check_cpu(t: object, what: str) -> torch.Tensor:
    import torch

    if not isinstance(t, torch.Tensor):
        raise ArgumentError(f"{what}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ArgumentError(f"{what}: expected a CPU tensor, got one on {t.device}")
    return t.contiguous()


def rows_cols(shape: tuple[int, ...] | list[int]) -> tuple[int, int]:
    """How the kernels see a tensor: a 2-D weight as (rows, cols), a 1-D one as one row, higher
    ranks as (first dimension, the rest): scales per row follow the first dimension."""
    return _core.rows_cols([int(d) for d in shape])


def _out(t: torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None) -> torch.Tensor:
    import torch

    if out is None:
        return torch.empty(t.shape, dtype=dtype)
    if out.dtype != dtype or out.shape != t.shape or not out.is_contiguous() or out.device.type != "cpu":
        raise ArgumentError(
            f"out: expected a contiguous CPU tensor of {dtype} and shape {tuple(t.shape)}, "
            f"got {out.dtype} {tuple(out.shape)} on {out.device}"
        )
    return out


def expand(
    weight: torch.Tensor,
    dtype: torch.dtype | str = "bf16",
    scale: float | torch.Tensor | None = None,
    *,
    block_size: int = 128,
    out: torch.Tensor | None = None,
    threads: int | None = None,
) -> torch.Tensor:
    """``(weight.float() * scale).to(dtype)``, computed by the core without a float32 copy.

    ``scale`` may be None, a number or a one-element tensor (per tensor), a tensor with one value
    per row (shape ``[rows]`` or ``[rows, 1]``), or a ``[ceil(rows/block_size),
    ceil(cols/block_size)]`` tensor of block-wise scales (the ``weight_scale_inv`` layout).
    """
    import torch

    w = _check_cpu(weight, "weight")
    target = resolve(dtype)
    if str(target).removeprefix("torch.") not in _FLOATS:
        raise ArgumentError(f"dtype: expected float32, float16 or bfloat16, got {target}")
    rows, cols = rows_cols(tuple(w.shape))
    kind, values = "none", None
    if scale is not None:
        s = torch.as_tensor(scale, dtype=torch.float32).contiguous()
        try:
            kind = _core.scale_layout("scale", list(w.shape), list(s.shape), block_size)
        except DtypeError as e:
            raise ArgumentError(str(e)) from None
        values = s.reshape(-1)
    result = _out(w, target, out)
    _core.expand(
        _bytes(w),
        core_name(w.dtype),
        _bytes(result),
        core_name(target),
        rows,
        cols,
        scale_kind=kind,
        scale=values,
        block=block_size,
        threads=threads,
    )
    return result


def cast(
    tensor: torch.Tensor,
    dtype: torch.dtype | str,
    *,
    out: torch.Tensor | None = None,
    threads: int | None = None,
) -> torch.Tensor:
    """``tensor.to(dtype)`` between float32, float16 and bfloat16, rounding to nearest even."""
    t = _check_cpu(tensor, "tensor")
    target = resolve(dtype)
    result = _out(t, target, out)
    _core.cast(_bytes(t), core_name(t.dtype), _bytes(result), core_name(target), threads=threads)
    return result


# The scale layouts quantize_fp8 writes.
_LAYOUTS = ("row", "tensor", "block")


def scale_shape(layout: str, rows: int, cols: int, block_size: int = 128) -> tuple[int, ...]:
    """The shape of the scales of a ``[rows, cols]`` tensor quantized in ``layout`` ("row",
    "tensor" or "block"), as :func:`quantize_fp8` returns them and :func:`expand` takes them."""
    if layout == "row":
        return (rows, 1)
    if layout == "tensor":
        return ()
    return (-(-rows // block_size), -(-cols // block_size))


def quantize_fp8(
    tensor: torch.Tensor,
    *,
    layout: str = "row",
    block_size: int = 128,
    threads: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantizes to float8_e4m3fn with scale = absmax / 448 over each group of ``layout``:
    ``"row"``, ``"tensor"`` or ``"block"`` (``block_size`` x ``block_size`` tiles).

    Returns ``(q, scale)`` with ``q.float() * scale`` close to the input (tile scales repeated
    over their tiles); ``scale`` has shape ``[rows, 1]`` per row, ``[]`` per tensor and
    ``[ceil(rows / block_size), ceil(cols / block_size)]`` per tile, the layouts :func:`expand`
    takes.
    """
    import torch

    t = _check_cpu(tensor, "tensor")
    rows, cols = rows_cols(tuple(t.shape))
    if layout not in _LAYOUTS:
        raise ArgumentError(f"layout: expected one of {', '.join(map(repr, _LAYOUTS))}, got {layout!r}")
    if block_size < 1:
        raise ArgumentError(f"block_size: expected at least 1, got {block_size}")
    shape = scale_shape(layout, rows, cols, block_size)
    q = torch.empty(t.shape, dtype=torch.float8_e4m3fn)
    scales = torch.empty(shape, dtype=torch.float32)
    _core.quantize_fp8(
        _bytes(t), core_name(t.dtype), _bytes(q), scales.reshape(-1), rows, cols, layout, block_size, threads=threads
    )
    return q, scales
