"""GGML dequantization and 8-bit quantization against the ``gguf`` package's reference (and
torch's rounding of its float32 result), bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from support.ggml_blocks import LAYOUT, TYPES, gguf_type, random_blocks
from trash_panda import ArgumentError, DtypeError
from trash_panda.dtype import dequantize, expand, quantize_int8, quantize_q8_0

gguf = pytest.importorskip("gguf")

FLOATS = [torch.float32, torch.bfloat16, torch.float16]


def reference(blocks: np.ndarray, name: str, dtype: torch.dtype) -> torch.Tensor:
    """``gguf.quants.dequantize`` in float32, rounded once to ``dtype`` by torch."""
    return torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(blocks, gguf_type(name)))).to(dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    diff = (a.contiguous().view(torch.uint8) != b.contiguous().view(torch.uint8)).nonzero()
    assert diff.numel() == 0, f"{diff.numel()} bytes differ; first {a.reshape(-1)[:4]} vs {b.reshape(-1)[:4]}"


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", TYPES)
def test_random_blocks_match_the_reference(name: str, dtype: torch.dtype) -> None:
    # Every kind of block: random codes, and scales at the edges of f16 (zero, subnormal, max).
    per = LAYOUT[name][1]
    rows, cols = 7, 3 * max(per, 256)
    blocks = random_blocks(name, rows, cols, seed=TYPES.index(name))
    got = dequantize(torch.from_numpy(blocks), name.lower(), (rows, cols), dtype)
    same_bits(got, reference(blocks, name, dtype))


@pytest.mark.parametrize("name", ["Q8_0", "Q4_K", "Q6_K"])
def test_large_tensors_split_over_threads_the_same(name: str) -> None:
    rows, cols = 512, 4096
    blocks = random_blocks(name, rows, cols, seed=3, scale=1e-3)
    got = dequantize(torch.from_numpy(blocks), name, (rows, cols), torch.bfloat16, threads=2)
    same_bits(got, reference(blocks, name, torch.bfloat16))


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_tensors_written_by_the_gguf_writer(tmp_path: Path, name: str) -> None:
    # Weights quantized by the package, written to a file by its writer and read back as bytes.
    w = np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32) * 0.02
    q = gguf.quants.quantize(w, gguf_type(name))
    path = tmp_path / "t.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("w", q, raw_shape=q.shape, raw_dtype=gguf_type(name))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    t = gguf.GGUFReader(str(path)).tensors[0]
    raw = torch.from_numpy(np.array(t.data, dtype=np.uint8))
    for dtype in FLOATS:
        same_bits(dequantize(raw, name, (64, 256), dtype), reference(q, name, dtype))


@pytest.mark.parametrize("src", [torch.float32, torch.bfloat16, torch.float16])
def test_q8_0_quantization_matches_the_package(src: torch.dtype) -> None:
    g = torch.Generator().manual_seed(2)
    w = (torch.randn(96, 512, generator=g) * 0.05).to(src)
    # Halves after scaling: a block whose maximum is 127 holds every integer and half.
    w[0, :32] = (torch.arange(32) - 16.5).to(src)
    w[1, :32] = 0  # an all-zero block: d = 0
    ours = quantize_q8_0(w)
    want = gguf.quants.quantize(w.float().numpy(), gguf_type("Q8_0"))
    assert np.array_equal(ours.numpy(), want.reshape(-1))
    # And it expands back as the package expands it.
    same_bits(dequantize(ours, "q8_0", (96, 512), torch.bfloat16), reference(want, "Q8_0", torch.bfloat16))


@pytest.mark.parametrize("src", [torch.float32, torch.bfloat16])
def test_int8_matches_the_torch_reference(src: torch.dtype) -> None:
    g = torch.Generator().manual_seed(4)
    w = (torch.randn(64, 300, generator=g) * 0.03).to(src)
    w[3] = 0
    w[5, :10] = torch.arange(10).to(src) * (w[5].float().abs().amax() / 127 * 0.5).to(src)
    q, scale = quantize_int8(w)
    x = w.float()
    amax = x.abs().amax(dim=1, keepdim=True)
    k = amax / 127
    k = torch.where((k > 0) & k.isfinite(), k, torch.ones_like(k))
    want = torch.round(x / k).clamp(-127, 127).to(torch.int8)
    assert torch.equal(scale, k) and torch.equal(q, want)
    # Expanded with its scale, as an fp8 weight with a per-row scale is.
    same_bits(expand(q, torch.bfloat16, scale), (q.float() * scale).to(torch.bfloat16))


def test_bad_arguments() -> None:
    blocks = torch.zeros(34, dtype=torch.uint8)
    with pytest.raises(ArgumentError, match="expected 68 bytes"):
        dequantize(blocks, "q8_0", (2, 32))
    with pytest.raises(ArgumentError, match="GGML block type"):
        dequantize(blocks, "bf16", (17,))
    with pytest.raises(DtypeError, match="whole number of Q8_0 blocks|whole number of q8_0 blocks"):
        dequantize(blocks, "q8_0", (33,))
    with pytest.raises(DtypeError, match="unknown dtype"):
        dequantize(blocks, "q9_9", (32,))
    with pytest.raises(ArgumentError, match="multiple of 32"):
        quantize_q8_0(torch.zeros(4, 48))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", TYPES)
def test_the_device_path_equals_the_core_kernel(name: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    # The torch code a GPU runs, run here on the CPU against the core's kernel; a small pass
    # size makes it go several passes.
    from trash_panda.offload.backends import ggml

    monkeypatch.setattr(ggml, "WEIGHTS_PER_PASS", 1024)
    rows, cols = 9, 2 * max(LAYOUT[name][1], 256)
    blocks = torch.from_numpy(random_blocks(name, rows, cols, seed=11 + TYPES.index(name)))
    out = torch.empty(rows, cols, dtype=dtype)
    ggml.dequantize_into(out, blocks, name)
    same_bits(out, dequantize(blocks, name, (rows, cols), dtype))
