"""The CUDA backend: pinned staging, side-stream copies, expansion on the GPU (skipped without one)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import trash_panda as tp
from models import Tiny, on_meta, save
from test_stream import _fp8_checkpoint, every_tier, ids, reference

pytestmark = pytest.mark.cuda


def _baseline() -> int:
    """Device memory held before a model: after a warm-up matmul, since cuBLAS keeps its
    workspace allocated from then on."""
    a = torch.ones(64, 64, device="cuda")
    (a @ a).sum().item()
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_every_tier_on_gpu(tmp_path: Path, dtype: torch.dtype) -> None:
    base = _baseline()
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
    del ref, x, want
    tp.release(model, handle)
    assert torch.cuda.memory_allocated() <= base + (1 << 20)


def test_fp8_on_gpu(tmp_path: Path) -> None:
    expected = _fp8_checkpoint(reference(torch.float32), tmp_path / "fp8.safetensors").cuda()
    model = on_meta(Tiny)
    tp.stream_load(model, tmp_path / "fp8.safetensors", plan=every_tier(), device="cuda")
    handle = tp.install_offload(model)
    x = ids().cuda()
    with torch.no_grad():
        assert torch.equal(model(x), expected(x))
    tp.release(model, handle)


def test_measure_activation_vram_under_a_streaming_plan(tmp_path: Path) -> None:
    """With blocks streamed from RAM and disk, the measure is the raw peak over what was held
    before the call: the slots and the expansion buffer are in that baseline."""
    path = save(reference(torch.float32), tmp_path / "m.safetensors")
    model = on_meta(Tiny)
    p = every_tier()
    tp.stream_load(model, path, plan=p, device="cuda")
    handle = tp.install_offload(model)
    x = torch.randint(0, 100, (64, 512), device="cuda")

    def run() -> None:
        with torch.no_grad():
            model(x)

    run()  # warm-up: the first pass pays one-time allocations
    need = tp.measure_activation_vram(run, p)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run()
    torch.cuda.synchronize()
    raw = torch.cuda.max_memory_allocated() - base
    assert need == raw
    assert need >= 64 * 512 * 64 * 4  # at least one activation of the batch
    stats = handle.stats()
    assert stats is not None and stats.acquires > 0, "the plan streamed nothing"
    tp.release(model, handle)


class _FailingCudart:
    """torch's cudart with cudaHostRegister failing on its second call."""

    def __init__(self, real: object) -> None:
        self.real = real
        self.calls = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.real, name)

    def cudaHostRegister(self, addr: int, size: int, flags: int) -> object:
        self.calls += 1
        if self.calls == 2:
            return 2  # cudaErrorMemoryAllocation
        return self.real.cudaHostRegister(addr, size, flags)  # type: ignore[attr-defined]


def test_pinned_registration_failure_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = reference(torch.float32)
    path = save(ref, tmp_path / "m.safetensors")
    model = on_meta(Tiny)
    tp.stream_load(model, path, plan=every_tier(), device="cuda")
    real = torch.cuda.cudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: _FailingCudart(real))
    with pytest.warns(UserWarning, match="could not pin"):
        handle = tp.install_offload(model)
    monkeypatch.undo()
    state = tp.offload.state.get_state(model)
    assert state is not None and state.engine is not None
    for addr, _size in state.engine.staging_buffers():
        # Unregistering memory that is not registered is an error: nothing was left registered.
        assert int(getattr(real.cudaHostUnregister(addr), "value", 1)) != 0
    x = ids().cuda()
    with torch.no_grad():
        assert torch.equal(model(x), ref.cuda()(x))
    tp.release(model, handle)


def test_staging_views_are_pinned_and_copies_do_not_block(tmp_path: Path) -> None:
    path = save(reference(torch.float32), tmp_path / "m.safetensors")
    model = on_meta(Tiny)
    tp.stream_load(model, path, plan=every_tier(), device="cuda")
    handle = tp.install_offload(model)
    state = tp.offload.state.get_state(model)
    assert state is not None and state.engine is not None
    lease = state.engine.acquire(0)
    host = torch.from_dlpack(lease.block_bytes())
    assert host.is_pinned()
    big = torch.empty(256 << 20, dtype=torch.uint8).pin_memory()
    dev = torch.empty_like(big, device="cuda")
    torch.cuda.synchronize()
    start, done = torch.cuda.Event(), torch.cuda.Event()
    start.record()
    dev.copy_(big, non_blocking=True)
    done.record()
    assert not done.query(), "a non-blocking 256 MB copy from pinned memory returned after it completed"
    done.synchronize()
    del host, lease
    tp.release(model, handle)


@pytest.mark.parametrize("slow", ["compute", "copy"])
def test_large_blocks_with_a_slow_side(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow: str) -> None:
    """64 MB blocks streamed with either side forced slow (a spin kernel queued on its stream):
    with copies in flight, any missing wait between the streams would show in the output."""
    from trash_panda.offload import device as device_mod

    torch.manual_seed(0)
    ref = Tiny(dim=2048, layers=8, vocab=64).to(torch.bfloat16).eval()  # 64 MB a block
    path = save(ref, tmp_path / "big.safetensors", torch.bfloat16)
    model = on_meta(Tiny, dim=2048, layers=8, vocab=64)
    p = tp.plan(model, path, device="cuda", resident_blocks=2, lookahead=2)
    p.assign(tp.Tier.DISK, indices=[6, 7])
    tp.stream_load(model, path, plan=p, device="cuda")
    spin = 20_000_000  # cycles: about 10 ms
    if slow == "copy":
        real_copy = device_mod.CudaDevice.copy

        def slow_copy(self, dst, src, after):  # type: ignore[no-untyped-def]
            with torch.cuda.stream(self.stream):
                torch.cuda._sleep(spin)
            return real_copy(self, dst, src, after)

        monkeypatch.setattr(device_mod.CudaDevice, "copy", slow_copy)
    handle = tp.install_offload(model)
    if slow == "compute":
        for b in model.blocks:
            b.register_forward_pre_hook(lambda *_: torch.cuda._sleep(spin))
    ref = ref.cuda()
    x = torch.randint(0, 64, (2, 16), device="cuda")
    with torch.no_grad():
        want = ref(x)
        for _ in range(3):
            assert torch.equal(model(x), want)
    stats = handle.stats()
    assert stats is not None and stats.acquires >= 3 * 6
    del ref, want
    tp.release(model, handle)


def test_profile_reports_copies_against_the_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = save(reference(torch.float32), tmp_path / "m.safetensors")
    model = on_meta(Tiny)
    tp.stream_load(model, path, plan=every_tier(), device="cuda")
    monkeypatch.setenv("TRASH_PANDA_PROFILE", "1")
    handle = tp.install_offload(model)
    with torch.no_grad():
        for _ in range(2):
            model(ids().cuda())
    tp.release(model, handle)
    report = capsys.readouterr().err
    assert "copies to the device:" in report and "of the pinned link's" in report, report
