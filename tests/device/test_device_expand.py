"""The device backend's in-place expansion (torch ops into the expansion buffer, scales broadcast
through views) equals the reference ``(w.float() * s).to(dtype)`` for every stored dtype, compute
dtype and scale layout. Run here on the CPU: the same torch ops run on a GPU."""

from __future__ import annotations

import pytest
import torch

from trash_panda.offload.backends.cuda import expand_into

STORED = [torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16, torch.float16, torch.float32]
COMPUTE = [torch.bfloat16, torch.float16, torch.float32]
BITS = {2: torch.int16, 4: torch.int32}


@pytest.mark.parametrize("stored", STORED)
@pytest.mark.parametrize("compute", COMPUTE)
@pytest.mark.parametrize("kind", ["none", "tensor", "row", "block"])
def test_expansion_equals_the_reference(stored: torch.dtype, compute: torch.dtype, kind: str) -> None:
    rows, cols = 300, 260  # partial 128x128 tiles on both edges
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(rows, cols, generator=gen) * 4).to(stored)
    scales = {
        "none": None,
        "tensor": torch.rand(1, generator=gen) + 0.5,
        "row": torch.rand(rows, generator=gen) + 0.5,
        "block": torch.rand((rows + 127) // 128, (cols + 127) // 128, generator=gen) + 0.5,
    }
    s = scales[kind]
    out = torch.full((rows, cols), float("nan"), dtype=compute)
    expand_into(out, w, s, kind)
    if s is None:
        want = w.to(torch.float32).to(compute)
    else:
        if kind == "tensor":
            full = s.reshape(())
        elif kind == "row":
            full = s.reshape(rows, 1)
        else:
            full = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
        want = (w.to(torch.float32) * full).to(compute)
    bits = BITS[compute.itemsize]
    assert torch.equal(out.view(bits), want.view(bits))
