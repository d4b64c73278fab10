"""Conversion kernels of the core on torch CPU tensors: fp8 expansion, casts, fp8 quantization,
GGML dequantization, and 8-bit quantization (Q8_0 blocks, int8 with a scale per row).

Each call releases the GIL and runs on several threads for large tensors.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from . import _core
from ._dtypes import core_name, is_block, resolve
from .errors import ArgumentError, DtypeError

if TYPE_CHECKING:
    import torch

__all__ = [
    "cast",
    "dequantize",
    "expand",
    "quantize_fp8",
    "quantize_int8",
    "quantize_q8_0",
    "rows_cols",
    "scale_shape",
]

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


def _out(shape: tuple[int, ...], dtype: torch.dtype, out: torch.Tensor | None) -> torch.Tensor:
    import torch

    if out is None:
        return torch.empty(shape, dtype=dtype)
    if out.dtype != dtype or tuple(out.shape) != shape or not out.is_contiguous() or out.device.type != "cpu":
        raise ArgumentError(
            f"out: expected a contiguous CPU tensor of {dtype} and shape {shape}, "
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
    result = _out(tuple(w.shape), target, out)
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
    result = _out(tuple(t.shape), target, out)
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


def _block_type(qtype: str) -> str:
    name = _core.dtype_header_name(qtype)
    if not is_block(name):
        raise ArgumentError(f"qtype: expected a GGML block type (q4_0 ... q6_k), got {qtype!r}")
    return name


def dequantize(
    blocks: torch.Tensor,
    qtype: str,
    shape: tuple[int, ...] | list[int],
    dtype: torch.dtype | str = "bf16",
    *,
    out: torch.Tensor | None = None,
    threads: int | None = None,
) -> torch.Tensor:
    """GGML blocks to ``dtype``: ``blocks`` holds the whole blocks of ``qtype`` ("q8_0",
    "q4_k", ...) of a tensor of ``shape`` (outermost first, as torch shapes it), as bytes of any
    dtype. Each weight is computed in float32 as the ``gguf`` package's ``dequantize`` computes
    it, then rounded once to ``dtype`` (bfloat16, float16 or float32)."""
    b = _check_cpu(blocks, "blocks")
    name = _block_type(qtype)
    target = resolve(dtype)
    if str(target).removeprefix("torch.") not in _FLOATS:
        raise ArgumentError(f"dtype: expected float32, float16 or bfloat16, got {target}")
    dims = tuple(int(d) for d in shape)
    raw = _bytes(b)
    want = _core.dtype_nbytes(name, math.prod(dims))
    if raw.numel() != want:
        raise ArgumentError(f"blocks: expected {want} bytes ({name} of shape {dims}), got {raw.numel()}")
    result = _out(dims, target, out)
    rows, cols = rows_cols(dims)
    _core.expand(raw, name, _bytes(result), core_name(target), rows, cols, threads=threads)
    return result


def quantize_q8_0(tensor: torch.Tensor, *, threads: int | None = None) -> torch.Tensor:
    """GGML Q8_0 blocks (uint8, 34 bytes per 32 weights) of a float tensor whose last dimension
    is a multiple of 32, as the ``gguf`` package's ``quants.quantize(x, Q8_0)`` makes them."""
    import torch

    t = _check_cpu(tensor, "tensor")
    cols = t.shape[-1] if t.dim() else 1
    if cols % 32:
        raise ArgumentError(f"tensor: expected a last dimension that is a multiple of 32 (Q8_0's block), got {cols}")
    q = torch.empty(t.numel() // 32 * 34, dtype=torch.uint8)
    _core.quantize_q8_0(_bytes(t), core_name(t.dtype), q, threads=threads)
    return q


def quantize_int8(tensor: torch.Tensor, *, threads: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 codes with one float32 scale per row (output channel), symmetric: ``scale = amax /
    127`` (1 for an all-zero row), ``q = round(w / scale)`` to nearest even, clamped to ±127.
    Returns ``(q, scale)`` with ``scale`` of shape ``[rows, 1]``, which :func:`expand` takes."""
    import torch

    t = _check_cpu(tensor, "tensor")
    rows, cols = rows_cols(tuple(t.shape))
    q = torch.empty(t.shape, dtype=torch.int8)
    scales = torch.empty((rows, 1), dtype=torch.float32)
    _core.quantize_int8(_bytes(t), core_name(t.dtype), _bytes(q), scales.reshape(-1), rows, cols, threads=threads)
    return q, scales
