"""The CUDA backend: pinned staging, side-stream copies, expansion on the GPU (skipped without one)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import trash_panda as tp
from models import Tiny, on_meta, save
from test_stream import _fp8_checkpoint, every_tier, ids, reference
from trash_panda.offload.cuda import CudaBackend

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
    """With blocks streamed from RAM and disk, the measure is the peak over what was allocated
    before the call, counting what the allocator reserved beyond what it allocated: the slots
    and the expansion buffer are in that baseline."""
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
    # The same pass measured by hand, from an emptied cache as the measure starts.
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    run()
    torch.cuda.synchronize()
    raw = torch.cuda.max_memory_allocated() - allocated
    grown = torch.cuda.max_memory_reserved() - reserved
    assert grown > 0, "the emptied cache did not make the pass reserve its memory again"
    slack = 2 << 20  # one small-pool segment either way
    assert max(raw, grown) - slack <= need <= max(raw, grown) + slack, (need, raw, grown)
    assert need >= 64 * 512 * 64 * 4  # at least one activation of the batch
    stats = handle.stats()
    assert stats is not None and stats.acquires > 0, "the plan streamed nothing"
    tp.release(model, handle)


class _FailingCudart:
    """torch's cudart with one cudaHostRegister failing in the runtime itself: the range is
    registered twice, which leaves the runtime's own error (already registered) as its last
    error, as a real failure would."""

    def __init__(self, real: object, fail_at: int) -> None:
        self.real = real
        self.fail_at = fail_at
        self.calls = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.real, name)

    def cudaHostRegister(self, addr: int, size: int, flags: int) -> object:
        self.calls += 1
        err = self.real.cudaHostRegister(addr, size, flags)  # type: ignore[attr-defined]
        if self.calls != self.fail_at or int(getattr(err, "value", err)) != 0:
            return err
        again = self.real.cudaHostRegister(addr, size, flags)  # type: ignore[attr-defined]
        assert int(getattr(again, "value", again)) != 0
        self.real.cudaHostUnregister(addr)  # type: ignore[attr-defined]
        return again


def test_a_ram_tier_that_cannot_be_pinned_leaves_the_staging_pinned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The RAM tier's second block fails to register: the first is undone, the staging pool
    stays pinned, RAM-tier blocks go through it, and no CUDA error is left for the next kernel
    launch to report as its own."""
    monkeypatch.setenv("TRASH_PANDA_RAM_IN_MEMORY", "1")
    ref = reference(torch.float32)
    path = save(ref, tmp_path / "m.safetensors")
    model = on_meta(Tiny)
    tp.stream_load(model, path, plan=every_tier(), device="cuda")
    state = tp.offload.state.get_state(model)
    assert state is not None and state.engine is not None and state.config.pin_ram_tier
    ram = [b.engine_index for b in state.blocks if b.tier == tp.Tier.RAM and b.engine_index is not None]
    assert len(state.engine.ram_image_buffers()) == len(ram) == 2
    real = torch.cuda.cudart()
    fake = _FailingCudart(real, fail_at=len(state.engine.staging_buffers()) + 2)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    with pytest.warns(UserWarning, match="could not pin.*through the staging buffers"):
        handle = tp.install_offload(model)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: real)
    # A kernel launch checks the runtime's last error: a stale one would be raised here.
    torch.ones(8, device="cuda").add_(1)
    torch.cuda.synchronize()
    backend = handle.backend
    assert isinstance(backend, CudaBackend) and backend.pipeline is not None
    assert backend.pipeline.images == {}, "RAM-tier blocks are copied from memory that is not pinned"
    for i in ram:
        image = state.engine.ram_image(i)
        assert image is not None and not torch.from_dlpack(image).is_pinned()
    lease = state.engine.acquire(ram[0])  # before any run, so no copy holds a buffer
    host = torch.from_dlpack(lease.block_bytes())
    assert host.is_pinned(), "the staging pool was unpinned too"
    del host, lease
    x = ids().cuda()
    with torch.no_grad():
        assert torch.equal(model(x), ref.cuda()(x))
    tp.release(model, handle)


def test_remove_refuses_when_the_streamed_weights_cannot_fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = reference(torch.float32)
    path = save(ref, tmp_path / "m.safetensors")
    model = on_meta(Tiny)
    tp.stream_load(model, path, plan=every_tier(), device="cuda")
    handle = tp.install_offload(model)
    ref = ref.cuda()
    x = ids().cuda()
    with torch.no_grad():
        want = ref(x)
        assert torch.equal(model(x), want)
    _free, total = torch.cuda.mem_get_info()
    # A full GPU: nothing free, and nothing in torch's cache to give back.
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (0, total))
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: {})
    with pytest.raises(tp.StreamError, match="the hooks stay installed"):
        handle.remove()
    monkeypatch.undo()
    assert not handle.removed
    with torch.no_grad():
        assert torch.equal(model(x), want)
    handle.remove()
    with torch.no_grad():
        assert torch.equal(model(x), want)
    tp.release(model)


def test_final_pass_frees_after_the_work_of_another_stream(tmp_path: Path) -> None:
    """A forward on a side stream, held back by a spin kernel, still has every kernel to run
    when final_pass() frees its resident blocks; memory allocated and written meanwhile on the
    default stream must not be theirs."""
    ref = reference(torch.float32)
    path = save(ref, tmp_path / "m.safetensors")
    model = on_meta(Tiny)
    names = [f"blocks.{i}." for i in range(6)]
    tp.stream_load(model, path, plan=tp.Plan.manual(resident=names, streamed=[]), device="cuda")
    handle = tp.install_offload(model)
    sizes = [p.nbytes for b in model.blocks for p in b.parameters()]
    ref = ref.cuda()
    x = ids().cuda()
    with torch.no_grad():
        want = ref(x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), handle.final_pass() as fp:
        with torch.cuda.stream(side):
            torch.cuda._sleep(300_000_000)  # about 150 ms: the forward's kernels queue behind it
            got = model(x)
        assert len(fp.freed) == 6
        # What the allocator would hand out again, written at once on the default stream.
        junk = [torch.full((max(1, n // 4),), float("nan"), device="cuda") for n in sizes]
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(got, want), "a freed block's memory was reused before its kernels ran"
    del junk
    tp.release(model, handle)


def test_memory_outside_torch_is_within_the_plans_floor(tmp_path: Path) -> None:
    """After passes that load torch's and cuBLAS's kernels, what the process holds on the GPU
    outside torch's allocator (the context, kernels, library handles) is within the floor a plan
    keeps for it. On a GPU no other process uses: the free memory is the device's."""
    from trash_panda import _core

    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        m = reference(dtype).cuda()
        with torch.no_grad():
            m(ids().cuda()).float().softmax(-1).sum().item()
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    outside = total - free - torch.cuda.memory_reserved()
    print(f"GPU memory outside torch: {outside / 1e6:.0f} MB (floor {_core.CUDA_CONTEXT_FLOOR / 1e6:.0f} MB)")
    assert 0 < outside <= _core.CUDA_CONTEXT_FLOOR


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
    from trash_panda.offload import copy_pipeline as device_mod

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
