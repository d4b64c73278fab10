"""storage_dtype="int8" and "q8_0": the large weights of the blocks held in memory (resident and
RAM tier) are quantized on load by the core and expanded before each run; the outputs equal the
plain model holding the reference quantization's expansion (torch's formula for int8, the
``gguf`` package's quantizer for Q8_0), the disk tier keeps the checkpoint's bytes, the plan
says it is lossy, and the profile reports the bytes expanded against the bytes read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import trash_panda as tp
from support.models import Tiny, on_meta, save
from trash_panda import Plan, Tier

DIM, LAYERS = 512, 4  # the blocks' 512 x 2048 weights are at the 1 Mi elements the rule quantizes


def _plan() -> Plan:
    names = [f"blocks.{i}." for i in range(LAYERS)]
    return Plan.manual(resident=names[:1], streamed=names[1:]).assign(Tier.DISK, prefixes=["blocks.3."])


def _reference(w: torch.Tensor, storage: str) -> torch.Tensor:
    """``w`` (bf16) quantized by the reference and expanded back to bf16."""
    x = w.float()
    if storage == "int8":
        k = x.abs().amax(dim=1, keepdim=True) / 127
        k = torch.where((k > 0) & k.isfinite(), k, torch.ones_like(k))
        q = torch.round(x / k).clamp(-127, 127).to(torch.int8)
        return (q.float() * k).to(torch.bfloat16)
    gguf = pytest.importorskip("gguf")
    t = gguf.GGMLQuantizationType.Q8_0
    blocks = gguf.quants.quantize(x.numpy(), t)
    return torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(blocks, t))).to(torch.bfloat16)


@pytest.mark.parametrize("storage", ["int8", "q8_0"])
def test_quantized_on_load_equals_the_reference(tmp_path: Path, storage: str) -> None:
    from trash_panda.offload.profile import build

    torch.manual_seed(0)
    ref = Tiny(dim=DIM, layers=LAYERS).to(torch.bfloat16).eval()
    path = save(ref, tmp_path / "m.safetensors", torch.bfloat16)
    # The plain model with what storage_dtype keeps: the large weights of blocks 0-2 (resident
    # and RAM tier), quantized and expanded; block 3 is on disk, as stored.
    with torch.no_grad():
        for i in range(LAYERS - 1):
            for lin in (ref.blocks[i].up, ref.blocks[i].down):
                lin.weight.copy_(_reference(lin.weight, storage))
    model = on_meta(Tiny, dim=DIM, layers=LAYERS)
    tp.stream_load(model, path, plan=_plan(), device="cpu", storage_dtype=storage, compute_dtype="bf16")
    handle = tp.install_offload(model)
    ids = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(ids), ref(ids))
        assert torch.equal(model(ids), ref(ids))
    text, _trace, _line = build(handle)
    tp.release(model, handle)
    assert "expanded" in text and "to the compute dtype" in text, text


@pytest.mark.parametrize("storage", ["int8", "q8_0", "fp8"])
def test_the_plan_says_an_8bit_storage_is_lossy(tmp_path: Path, storage: str) -> None:
    torch.manual_seed(0)
    path = save(Tiny(dim=DIM, layers=LAYERS), tmp_path / "m.safetensors", torch.bfloat16)
    model = on_meta(Tiny, dim=DIM, layers=LAYERS)
    p = tp.plan(model, path, storage_dtype=storage, ram="64GB", vram="1TB", device="cpu", resident_blocks=1)
    lossy = [w for w in p.warnings if "quantizes the large weights" in w]
    assert len(lossy) == 1 and "lossy" in lossy[0] and f"of {LAYERS} block(s)" in lossy[0], p.warnings
    plain = tp.plan(model, path, ram="64GB", vram="1TB", device="cpu", resident_blocks=1)
    assert not any("quantizes the large weights" in w for w in plain.warnings)
