"""The CUDA backend: pinned staging, side-stream copies, expansion on the GPU (skipped without one)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from models import Tiny, on_meta, save
from test_stream import _fp8_checkpoint, every_tier, ids, reference

import trash_panda as tp

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_every_tier_on_gpu(tmp_path: Path, dtype: torch.dtype) -> None:
    ref = reference(dtype)
    path = save(ref, tmp_path / "m.safetensors", dtype)
    model = on_meta(Tiny)
    report = tp.stream_load(model, path, plan=every_tier(), device="cuda")
    assert report.device == "cuda"
    handle = tp.install_offload(model)
    ref = ref.cuda()
    x = ids().cuda()
    with torch.no_grad():
        want = ref(x)
        for _ in range(3):
            assert torch.equal(model(x), want)
    tp.release(model, handle)
    assert torch.cuda.memory_allocated() < 1 << 20


def test_fp8_on_gpu(tmp_path: Path) -> None:
    expected = _fp8_checkpoint(reference(torch.float32), tmp_path / "fp8.safetensors").cuda()
    model = on_meta(Tiny)
    tp.stream_load(model, tmp_path / "fp8.safetensors", plan=every_tier(), device="cuda")
    handle = tp.install_offload(model)
    x = ids().cuda()
    with torch.no_grad():
        assert torch.equal(model(x), expected(x))
    tp.release(model, handle)


def test_measure_activation_vram_on_gpu(tmp_path: Path) -> None:
    path = save(reference(torch.float32), tmp_path / "m.safetensors")
    model = on_meta(Tiny)
    p = tp.plan(model, path, device="cuda")
    tp.stream_load(model, path, plan=p, device="cuda")
    handle = tp.install_offload(model)

    def run() -> None:
        with torch.no_grad():
            model(torch.randint(0, 100, (64, 512), device="cuda"))

    need = tp.measure_activation_vram(run, p)
    assert need > 64 * 512 * 64 * 4  # at least one activation of the batch
    tp.release(model, handle)
