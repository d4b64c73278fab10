"""GGML blocks expanded on a device by torch operations: the device path of a GGUF block, where
the core's kernels (which run on the CPU) cannot reach.

Each weight is computed with the float32 operations of the reference, in its order and each
rounded on its own (a product, then a separate sum or difference, every one its own kernel, so
no multiply-add is fused), then rounded once into ``out``: the core's CPU kernels' bits. The
work goes :data:`WEIGHTS_PER_PASS` weights at a time (the core's rule), so its temporaries stay
within the core's ``GGML_DEVICE_SCRATCH_BYTES``, which a GPU's plan counts beside the expansion
buffer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import _core

if TYPE_CHECKING:
    import torch

# Weights expanded per pass: the core's, which sizes the scratch the plan counts.
WEIGHTS_PER_PASS = _core.GGML_DEVICE_PASS_WEIGHTS


def _f16(b: torch.Tensor, at: int) -> torch.Tensor:
    """The f16 field at byte ``at`` of each block, as float32 of shape [blocks, 1]."""
    import torch

    return b[:, at : at + 2].contiguous().view(torch.float16).to(torch.float32)


def _shifts(values: list[int], shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.tensor(values, dtype=torch.uint8, device=like.device).reshape(shape)


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eight 6-bit scales and minimums of Q4_K and Q5_K super-blocks, from their 12 bytes."""
    import torch

    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = torch.cat([d & 63, (md & 15) | ((d >> 2) & 48)], dim=1)
    mn = torch.cat([m & 63, (md >> 4) | ((m >> 2) & 48)], dim=1)
    return sc, mn


def _decode(b: torch.Tensor, name: str) -> torch.Tensor:
    """float32 weights [blocks, per] of the blocks ``b`` (uint8 [blocks, bytes])."""
    import torch

    f32 = torch.float32
    n = b.shape[0]
    if name == "Q8_0":
        return b[:, 2:].contiguous().view(torch.int8).to(f32) * _f16(b, 0)
    if name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
        five, with_min = name.startswith("Q5"), name.endswith("_1")
        at = 2 + 2 * with_min + 4 * five
        qs = b[:, at : at + 16]
        q = torch.cat([qs & 15, qs >> 4], dim=1).to(torch.int32)
        if five:
            h = b[:, at - 4 : at].to(torch.int64)
            qh = h[:, 0] | (h[:, 1] << 8) | (h[:, 2] << 16) | (h[:, 3] << 24)
            bit = (qh[:, None] >> torch.arange(32, device=b.device)) & 1
            q = q | (bit.to(torch.int32) << 4)
        d = _f16(b, 0)
        if with_min:
            return d * q.to(f32) + _f16(b, 2)
        return d * (q - (16 if five else 8)).to(f32)
    if name == "Q2_K":
        sc = b[:, :16]
        dl = (_f16(b, 80) * (sc & 15).to(f32)).reshape(n, 16, 1)
        ml = (_f16(b, 82) * (sc >> 4).to(f32)).reshape(n, 16, 1)
        q = (b[:, 16:80].reshape(n, 2, 1, 32) >> _shifts([0, 2, 4, 6], (1, 1, 4, 1), b)) & 3
        return (dl * q.reshape(n, 16, 16).to(f32) - ml).reshape(n, 256)
    if name == "Q3_K":
        s = b[:, 96:108]
        low = (s[:, :8].reshape(n, 1, 8) >> _shifts([0, 4], (1, 2, 1), b)).reshape(n, 16) & 15
        high = (s[:, 8:12].reshape(n, 1, 4) >> _shifts([0, 2, 4, 6], (1, 4, 1), b)).reshape(n, 16) & 3
        sc = (low | (high << 4)).to(torch.int32) - 32
        dl = (_f16(b, 108) * sc.to(f32)).reshape(n, 16, 1)
        ql = (b[:, 32:96].reshape(n, 2, 1, 32) >> _shifts([0, 2, 4, 6], (1, 1, 4, 1), b)) & 3
        hm = (b[:, :32].reshape(n, 1, 1, 32) >> _shifts(list(range(8)), (1, 1, 8, 1), b)) & 1
        # A clear mask bit subtracts 4.
        q = ql.reshape(n, 16, 16).to(torch.int32) - ((hm.reshape(n, 16, 16) ^ 1).to(torch.int32) << 2)
        return (dl * q.to(f32)).reshape(n, 256)
    if name in ("Q4_K", "Q5_K"):
        sc, mn = _k_scales(b[:, 4:16])
        dl = (_f16(b, 0) * sc.to(f32)).reshape(n, 8, 1)
        dm = (_f16(b, 2) * mn.to(f32)).reshape(n, 8, 1)
        at = 48 if name == "Q5_K" else 16
        q = ((b[:, at : at + 128].reshape(n, 4, 1, 32) >> _shifts([0, 4], (1, 1, 2, 1), b)) & 15).reshape(n, 8, 32)
        if name == "Q5_K":
            h = (b[:, 16:48].reshape(n, 1, 1, 32) >> _shifts(list(range(8)), (1, 1, 8, 1), b)) & 1
            q = q | (h.reshape(n, 8, 32) << 4)
        return (dl * q.to(f32) - dm).reshape(n, 256)
    if name == "Q6_K":
        ql = (b[:, :128].reshape(n, 2, 1, 64) >> _shifts([0, 4], (1, 1, 2, 1), b)) & 15
        qh = (b[:, 128:192].reshape(n, 2, 1, 32) >> _shifts([0, 2, 4, 6], (1, 1, 4, 1), b)) & 3
        q = (ql.reshape(n, 8, 32) | (qh.reshape(n, 8, 32) << 4)).to(torch.int32) - 32
        dl = (_f16(b, 208) * b[:, 192:208].contiguous().view(torch.int8).to(f32)).reshape(n, 16, 1)
        return (dl * q.reshape(n, 16, 16).to(f32)).reshape(n, 256)
    raise ValueError(f"not a GGML block type: {name}")


def dequantize_into(out: torch.Tensor, blocks: torch.Tensor, name: str, order: list[int] | None = None) -> None:
    """Writes the weights of ``blocks`` (uint8, whole blocks of ``name``, e.g. "Q4_K") into
    ``out`` (bf16, f16 or f32, as many elements, contiguous), on their device. ``order``: row
    ``r`` of ``out`` is stored row ``order[r]`` (a permutation of the rows; ``out`` is 2-D or
    more), each pass then writes its rows where they go."""
    import torch

    per = _core.dtype_block_elems(name)
    size = _core.dtype_nbytes(name, per)
    if order is not None:
        rows = out.shape[0]
        cols = out.numel() // rows
        where = torch.empty(rows, dtype=torch.long)
        where[torch.tensor(order, dtype=torch.long)] = torch.arange(rows)
        where = where.to(out.device)
        b = blocks.reshape(rows, -1)
        step = max(1, WEIGHTS_PER_PASS // cols)
        flat = out.reshape(rows, cols)
        for first in range(0, rows, step):
            part = b[first : first + step]
            values = _decode(part.reshape(-1, size), name).reshape(part.shape[0], cols)
            flat.index_copy_(0, where[first : first + part.shape[0]], values.to(out.dtype))
        return
    b = blocks.reshape(-1, size)
    flat = out.reshape(-1)
    step = max(1, WEIGHTS_PER_PASS // per)
    for first in range(0, b.shape[0], step):
        part = b[first : first + step]
        flat[first * per : (first + part.shape[0]) * per].copy_(_decode(part, name).reshape(-1))
