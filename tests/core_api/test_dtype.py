"""The core's conversion kernels against torch's own conversions, exhaustively where possible."""

from __future__ import annotations

import pytest
import torch

from conftest import bits
from trash_panda import ArgumentError, DtypeError
from trash_panda.dtype import cast, expand, quantize_fp8

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
FLOATS = [torch.float32, torch.float16, torch.bfloat16]


def same(a: torch.Tensor, b: torch.Tensor) -> None:
    """Bit-for-bit equal, except that any NaN matches any NaN of the same sign."""
    assert a.dtype == b.dtype and a.shape == b.shape
    nan_a, nan_b = torch.isnan(a.float()), torch.isnan(b.float())
    assert torch.equal(nan_a, nan_b), "NaN positions differ"
    keep = ~nan_a
    diff = (bits(a[keep]) != bits(b[keep])).nonzero()
    assert diff.numel() == 0, f"{diff.numel()} bytes differ; first values {a[keep][:8]} vs {b[keep][:8]}"


def all_codes(dtype: torch.dtype) -> torch.Tensor:
    if dtype.itemsize == 1:
        return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype)
    return torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)


@pytest.mark.parametrize("src", FP8)
@pytest.mark.parametrize("dst", FLOATS)
def test_fp8_all_codes(src: torch.dtype, dst: torch.dtype) -> None:
    codes = all_codes(src)
    same(expand(codes, dst), codes.to(dst))


@pytest.mark.parametrize("src", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("dst", FLOATS)
def test_16bit_all_codes(src: torch.dtype, dst: torch.dtype) -> None:
    codes = all_codes(src)
    same(cast(codes, dst), codes.to(dst))


@pytest.mark.parametrize("dst", [torch.float16, torch.bfloat16])
def test_f32_rounding(dst: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    patterns = torch.randint(-(2**31), 2**31 - 1, (1 << 20,), generator=g, dtype=torch.int64)
    x = patterns.to(torch.int32).view(torch.float32)
    # Values just around the 16-bit grid: ties, halfway points, overflow and subnormal edges.
    edges = torch.tensor(
        [65504.0, 65520.0, 65519.99, 6.1e-5, 5.96e-8, 2.98e-8, 3.4e38, -0.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8]
    )
    for t in (x, edges, all_codes(dst).float()):
        same(cast(t, dst), t.to(dst))


@pytest.mark.parametrize("src", FP8)
@pytest.mark.parametrize("dst", FLOATS)
def test_scaled_forms(src: torch.dtype, dst: torch.dtype) -> None:
    g = torch.Generator().manual_seed(2)
    rows, cols = 300, 200
    w = (torch.randn(rows, cols, generator=g) * 4).to(src)
    per_tensor = torch.tensor(0.0123)
    per_row = torch.rand(rows, 1, generator=g) + 0.01
    block = torch.rand(3, 2, generator=g) + 0.01
    block_full = block.repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
    for scale, full in (
        (per_tensor, per_tensor),
        (per_row, per_row),
        (per_row.reshape(-1), per_row),
        (block, block_full),
    ):
        same(expand(w, dst, scale), (w.to(torch.float32) * full).to(dst))
    same(expand(w, dst, 0.5), (w.to(torch.float32) * 0.5).to(dst))


def test_large_tensor_uses_threads_and_matches() -> None:
    g = torch.Generator().manual_seed(3)
    w = torch.randn(4096, 1024, generator=g).to(torch.float8_e4m3fn)
    s = torch.rand(4096, 1, generator=g)
    ref = (w.float() * s).to(torch.bfloat16)
    for threads in (1, 2, 3):
        same(expand(w, "bf16", s, threads=threads), ref)


@pytest.mark.parametrize("layout", ["row", "tensor", "block"])
@pytest.mark.parametrize("src", FLOATS)
def test_quantize_matches_torch_reference(layout: str, src: torch.dtype) -> None:
    g = torch.Generator().manual_seed(4)
    w = (torch.randn(257, 130, generator=g) * 3).to(src)
    w[0, 0] = 0.0
    w[5] = 0.0  # an all-zero row
    w[128:, 128:] = 0.0  # an all-zero tile
    q, scale = quantize_fp8(w, layout=layout)
    wf = w.float()
    if layout == "block":
        tiles = torch.nn.functional.pad(wf.abs(), (0, 126, 0, 127)).reshape(3, 128, 2, 128)
        amax = tiles.amax(dim=(1, 3))
        assert scale.shape == (3, 2)
    else:
        amax = wf.abs().amax(dim=1, keepdim=True) if layout == "row" else wf.abs().amax()
    ref_scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    assert torch.equal(scale, ref_scale.reshape(scale.shape))
    full = ref_scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[:257, :130] if layout == "block" else ref_scale
    ref_q = torch.clamp(wf / full, -448.0, 448.0).to(torch.float8_e4m3fn)
    same(q, ref_q)
    # The scale comes back in the layout expand() takes.
    same(expand(q, "float32", scale), q.float() * full)


def test_quantize_refuses_a_bad_layout() -> None:
    with pytest.raises(ArgumentError, match="layout: expected one of 'row', 'tensor', 'block', got 'tile'"):
        quantize_fp8(torch.ones(2, 2), layout="tile")
    with pytest.raises(ArgumentError, match="block_size: expected at least 1"):
        quantize_fp8(torch.ones(2, 2), layout="block", block_size=0)


def test_errors() -> None:
    w = torch.zeros(4, 8, dtype=torch.float8_e4m3fn)
    with pytest.raises(ArgumentError, match="scale"):
        expand(w, "bf16", torch.ones(3))
    with pytest.raises(DtypeError, match="bf17"):
        expand(w, "bf17")
    with pytest.raises(ArgumentError, match="float32, float16 or bfloat16"):
        expand(w, torch.int32)
    with pytest.raises(ArgumentError, match="out"):
        expand(w, "bf16", out=torch.empty(4, 8, dtype=torch.float16))
    with pytest.raises(ArgumentError, match="CPU|Tensor"):
        cast([1.0], torch.float16)  # type: ignore[arg-type]
