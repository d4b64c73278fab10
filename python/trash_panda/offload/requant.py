"""fp8 weights merged with an adapter, quantized again in the scale layout they are stored in.

A layer stored in fp8 runs on its expansion (``q.float() * scale`` in the compute dtype); a merge
adds ``ΔW`` to that expansion. The merged weight is quantized back to e4m3 with scales taken
from its own amax, group by group in the layer's layout (one scale for the tensor, per row or
per 128 x 128 tile), by the core's quantizer on the CPU and by the same formula in torch on a
GPU, and the layer runs on the expansion of that: a kept merge costs what the stored block costs
(its codes and scales), not a compute-dtype copy, and every run computes with the same bits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from .state import TensorSpec

__all__ = ["expand_back", "fp8_layout", "kept_bytes", "requantize"]

# The stored dtype the quantizer writes (e5m2 weights keep their merge in the compute dtype).
_E4M3 = "F8_E4M3"
# Side of a tile of block-wise scales (the ``weight_scale_inv`` layout).
_BLOCK = 128
_FP8_MAX = 448.0


def fp8_layout(spec: TensorSpec | None) -> str | None:
    """The scale layout a merge into ``spec`` is quantized in again ("tensor", "row", "block",
    or "none" for e4m3 with no scale), None where the tensor is not stored in e4m3."""
    if spec is None or (spec.resident is None and spec.staged_index is None):
        return None
    if spec.scale is not None or spec.scale_kind == "row":  # a scale in the file, or fp8 storage
        return spec.scale_kind
    return "none" if spec.info.dtype == _E4M3 else None


def kept_bytes(spec: TensorSpec) -> int:
    """Bytes a merge into ``spec`` takes kept: its codes and scales where it is stored in fp8
    (one scale per group, none for e4m3 with no scale), else the weight in the compute dtype."""
    import math

    import torch

    from .. import dtype as kernels

    numel = math.prod(spec.shape)
    layout = fp8_layout(spec)
    if layout is None:
        return numel * spec.target.itemsize
    scales = 0 if layout == "none" else math.prod(kernels.scale_shape(layout, *spec.rows_cols, _BLOCK))
    return numel * torch.float8_e4m3fn.itemsize + scales * torch.float32.itemsize


def requantize(weight: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``weight`` as e4m3 codes and dequantization scales in ``layout``: the core's quantizer
    on the CPU, the same formula in torch elsewhere (the two give the same bits)."""
    import torch

    if layout == "none":
        return torch.clamp(weight.float(), -_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn), None
    if weight.device.type == "cpu":
        from .. import dtype as kernels

        return kernels.quantize_fp8(weight, layout=layout, block_size=_BLOCK)
    return quantize_like_the_core(weight, layout)


def quantize_like_the_core(weight: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The core's quantizer in torch operations (for tensors on a GPU): per group, amax over
    the non-NaN values, ``scale = amax / 448`` (1 where that is not a positive finite number),
    ``q = e4m3(clamp(x / scale, -448, 448))``."""
    import torch

    x = weight.float()
    x = x.reshape(x.shape[0], -1) if x.dim() > 1 else x.reshape(1, -1)
    rows, cols = x.shape
    a = torch.where(x.isnan(), torch.zeros_like(x), x.abs())
    if layout == "tensor":
        amax = a.amax().reshape(())
    elif layout == "row":
        amax = a.amax(dim=1, keepdim=True)
    else:
        tr, tc = -(-rows // _BLOCK), -(-cols // _BLOCK)
        padded = torch.nn.functional.pad(a, (0, tc * _BLOCK - cols, 0, tr * _BLOCK - rows))
        amax = padded.reshape(tr, _BLOCK, tc, _BLOCK).amax(dim=(1, 3))
    scale = amax / _FP8_MAX
    scale = torch.where((scale > 0) & scale.isfinite(), scale, torch.ones_like(scale))
    full = scale.repeat_interleave(_BLOCK, 0).repeat_interleave(_BLOCK, 1)[:rows, :cols] if layout == "block" else scale
    q = torch.clamp(x / full, -_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn)
    return q.reshape(weight.shape), scale


def expand_back(q: torch.Tensor, scale: torch.Tensor | None, layout: str, target: torch.dtype) -> torch.Tensor:
    """The weight the layer runs on: the expansion of ``q`` by ``scale``, as a stored fp8 block
    is expanded (the core's kernel on the CPU, the CUDA backend's on a GPU)."""
    import torch

    if scale is None:
        return q.to(target)
    if q.device.type == "cpu":
        from .. import dtype as kernels

        return kernels.expand(q, target, scale, block_size=_BLOCK)
    from .backends.cuda import expand_into

    out = torch.empty(q.shape, dtype=target, device=q.device)
    expand_into(out, q, scale, layout)
    return out
