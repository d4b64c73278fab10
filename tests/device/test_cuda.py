"""The CUDA backend: pinned staging, side-stream copies, expansion on the GPU (skipped without one)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import trash_panda as tp
from support.checkpoints import every_tier, fp8_checkpoint, ids, reference
from support.models import Tiny, on_meta, save
from trash_panda.offload.backends.cuda import CudaBackend

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
    expected = fp8_checkpoint(reference(torch.float32), tmp_path / "fp8.safetensors").cuda()
    model = on_meta(Tiny)
    tp.stream_load(model, tmp_path / "fp8.safetensors", plan=every_tier(), device="cuda")
    handle = tp.install_offload(model)
    x = ids().cuda()
    with torch.no_grad():
        assert torch.equal(model(x), expected(x))
    tp.release(model, handle)


def _streamed_pass(tmp_path: Path) -> tuple[Tiny, tp.Plan, Any, Callable[[], None]]:
    """A model with blocks streamed from RAM and disk, hooked on the GPU, and a pass of a batch
    whose activations are large (64 x 512 tokens), run once: the first pass pays one-time
    allocations."""
    path = save(reference(torch.float32), tmp_path / "m.safetensors")
    model = on_meta(Tiny)
    p = every_tier()
    tp.stream_load(model, path, plan=p, device="cuda")
    handle = tp.install_offload(model)
    x = torch.randint(0, 100, (64, 512), device="cuda")

    def run() -> None:
        with torch.no_grad():
            model(x)

    run()
    return model, p, handle, run


def test_measure_activation_vram_under_a_streaming_plan(tmp_path: Path) -> None:
    """With blocks streamed from RAM and disk, the measure is the peak over what was allocated
    before the call, counting what the allocator reserved beyond what it allocated: the slots
    and the expansion buffer are in that baseline."""
    model, p, handle, run = _streamed_pass(tmp_path)
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
    assert isinstance(backend, CudaBackend) and backend.copies is not None
    assert backend.copies.images == {}, "RAM-tier blocks are copied from memory that is not pinned"
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


@pytest.mark.parametrize("how", ["final_pass", "given_back"])
def test_freed_blocks_wait_for_the_work_of_another_stream(tmp_path: Path, how: str) -> None:
    """A forward on a side stream, held back by a spin kernel, still has every kernel to run
    when its resident blocks are freed: by final_pass() after each block's run, or given back at
    the stage's end, on the default stream (a pipeline's stage kept in part). Memory allocated
    and written meanwhile on the default stream must not be theirs. The second fails with
    TRASH_PANDA_FAULT=retire-current-stream."""
    from trash_panda.offload.final_pass import free_idle_blocks

    ref = reference(torch.float32)
    path = save(ref, tmp_path / "m.safetensors")
    model = on_meta(Tiny)
    names = [f"blocks.{i}." for i in range(6)]
    tp.stream_load(model, path, plan=tp.Plan.manual(resident=names, streamed=[]), device="cuda")
    handle = tp.install_offload(model)
    sizes = [p.nbytes for b in model.blocks for p in b.parameters()]
    x = ids().cuda()
    with torch.no_grad():
        want = ref.cuda()(x)
    if how == "final_pass":
        with handle.final_pass() as fp:
            got, side = _behind_a_spin_on_a_side_stream(model, x)
            assert len(fp.freed) == 6
    else:
        got, side = _behind_a_spin_on_a_side_stream(model, x)
        free_idle_blocks(handle, handle.state.blocks)
    # What the allocator would hand out again, written at once on the default stream.
    junk = [torch.full((max(1, n // 4),), float("nan"), device="cuda") for n in sizes]
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(got, want), "a freed block's memory was reused before its kernels ran"
    del junk
    tp.release(model, handle)


def _behind_a_spin_on_a_side_stream(model: Tiny, x: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Stream]:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        torch.cuda._sleep(600_000_000)  # about 0.3 s: the forward's kernels queue behind it
        return model(x), side


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


def _large(tmp_path: Path, dtype: torch.dtype = torch.float32) -> tuple[Tiny, Path]:
    """A model whose blocks are tens of MB (dim 1024: 32 MB a block in fp32), saved."""
    torch.manual_seed(0)
    ref = Tiny(dim=1024, layers=6, vocab=64).to(dtype).eval()
    return ref, save(ref, tmp_path / "large.safetensors", dtype)


def test_staging_views_are_pinned_and_copies_do_not_block(tmp_path: Path) -> None:
    """A copy out of a staging buffer, queued behind a spin on its stream, returns at once: the
    buffer is pinned. From pageable memory the call would hold the host until the copy was done,
    behind the spin. Fails with TRASH_PANDA_FAULT=staging-unpinned."""
    import time

    _ref, path = _large(tmp_path)
    model = on_meta(Tiny, dim=1024, layers=6, vocab=64)
    tp.stream_load(model, path, plan=every_tier(), device="cuda")
    handle = tp.install_offload(model)
    state = tp.offload.state.get_state(model)
    assert state is not None and state.engine is not None
    lease = state.engine.acquire(0)
    host = torch.from_dlpack(lease.block_bytes())
    dev = torch.empty_like(host, device="cuda")
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(400_000_000)  # about 0.2 s
        started = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        took = time.perf_counter() - started
        done = torch.cuda.Event()
        done.record(side)
    landed = done.query()
    side.synchronize()
    assert host.is_pinned(), "the staging buffers are not pinned"
    assert took < 0.05 and not landed, f"the copy out of a staging buffer held the host {took:.3f} s"
    del host, lease
    tp.release(model, handle)


def test_the_first_copy_into_a_slot_waits_for_the_kernels_its_memory_carries(tmp_path: Path) -> None:
    """Memory that kernels queued on the default stream still read, freed at once, is handed to
    the next stage's slots by the caching allocator; its first copy must wait for those kernels.
    Fails with TRASH_PANDA_FAULT=first-copy-wait (the copy overwrites what the kernel reads)."""
    from trash_panda.offload.state import get_state

    ref, path = _large(tmp_path)
    model = on_meta(Tiny, dim=1024, layers=6, vocab=64)
    p = tp.plan(model, path, device="cuda", resident_blocks=1, lookahead=1)
    tp.stream_load(model, path, plan=p, device="cuda")
    state = get_state(model)
    assert state is not None
    slot_bytes = state.config.staging_buffer_bytes
    freed = [torch.full((slot_bytes,), 7, dtype=torch.uint8, device="cuda") for _ in range(state.config.device_slots)]
    addresses = {t.data_ptr() for t in freed}
    torch.cuda.synchronize()
    torch.cuda._sleep(600_000_000)  # about 0.3 s: what reads the memory waits behind it
    seen = [t.clone() for t in freed]
    del freed
    handle = tp.install_offload(model)
    backend = handle.backend
    assert isinstance(backend, CudaBackend) and backend.copies is not None
    assert addresses & {s.data_ptr() for s in backend.copies.slots}, "the slots did not reuse the freed memory"
    x = torch.randint(0, 64, (2, 16), device="cuda")
    with torch.no_grad():
        got = model(x)
    torch.cuda.synchronize()
    assert all(torch.equal(t, torch.full_like(t, 7)) for t in seen), "a slot's first copy overwrote memory still read"
    with torch.no_grad():
        assert torch.equal(got, ref.cuda()(x))
    tp.release(model, handle)


def test_an_expansion_buffer_is_freed_after_the_work_of_another_stream(tmp_path: Path) -> None:
    """Every block resident in fp8 (no slots): the expansion buffer, read by kernels queued on a
    side stream, is freed when the hooks come off; memory allocated and written then must not be
    it. Fails with TRASH_PANDA_FAULT=close-no-sync."""
    expected = fp8_checkpoint(reference(torch.float32), tmp_path / "fp8.safetensors").cuda()
    model = on_meta(Tiny)
    names = [f"blocks.{i}." for i in range(6)]
    tp.stream_load(model, tmp_path / "fp8.safetensors", plan=tp.Plan.manual(resident=names, streamed=[]), device="cuda")
    handle = tp.install_offload(model)
    backend = handle.backend
    assert isinstance(backend, CudaBackend) and backend.copies is None
    size = backend.expansion.raw.numel()
    assert size > 0
    x = ids().cuda()
    with torch.no_grad():
        want = expected(x)
    got, side = _behind_a_spin_on_a_side_stream(model, x)
    handle.remove()
    junk = torch.full((size // 2,), float("nan"), dtype=torch.bfloat16, device="cuda")
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(got, want), "the expansion buffer was reused before the kernels reading it ran"
    del junk
    tp.release(model)


def _ahead(tmp_path: Path, ref: Tiny, path: Path, plan: tp.Plan) -> tuple[Tiny, Any]:
    """The model of ``path`` loaded ahead of its turn on the GPU, as a pipeline reads its next
    stage: nothing read until its allowance is given."""
    from trash_panda import _core
    from trash_panda.pipeline.loaded import load_stage

    model = on_meta(Tiny, dim=1024, layers=6, vocab=64)
    stage = load_stage(
        "ahead", model, tp.Checkpoint(path), plan, _core.Free(0, 0),
        device=torch.device("cuda"), order=None, destination=None, shared={}, key="", ahead=True,
    )  # fmt: skip
    assert stage.allowance is not None and stage.loader is not None
    return model, stage


def test_the_loader_copies_beside_the_kernels_queued_on_the_default_stream(tmp_path: Path) -> None:
    """A stage read ahead while the running one's kernels fill the default stream: its loader's
    copies go on a stream of their own, and are on the device before those kernels have run.
    Fails with TRASH_PANDA_FAULT=loader-default-stream (each copy waits behind them)."""
    ref, path = _large(tmp_path)
    model = on_meta(Tiny, dim=1024, layers=6, vocab=64)
    p = tp.plan(model, path, device="cuda", resident_blocks=6)
    model, stage = _ahead(tmp_path, ref, path, p)
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # about a second of the running stage's kernels
    running = torch.cuda.Event()
    running.record()
    stage.allowance.give(1 << 40)
    stage.loader.join()
    still = not running.query()
    torch.cuda.synchronize()
    assert still, "the next stage's copies waited for the kernels queued on the default stream"
    stage.allowance.open()
    x = torch.randint(0, 64, (2, 16), device="cuda")
    with torch.no_grad():
        assert torch.equal(model(x), ref.cuda()(x))
    stage.close()
    tp.release(model, stage.handle)


def test_a_ram_tier_read_ahead_is_pinned_when_it_arrives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stage read ahead reads its RAM tier (held in memory) last, after its hooks are in: it is
    pinned then, and its blocks copied to the GPU from there, not staged. Fails with
    TRASH_PANDA_FAULT=ram-tier-on-arrival."""
    monkeypatch.setenv("TRASH_PANDA_RAM_IN_MEMORY", "1")
    ref, path = _large(tmp_path, torch.bfloat16)
    model = on_meta(Tiny, dim=1024, layers=6, vocab=64)
    p = tp.plan(model, path, device="cuda", resident_blocks=1, lookahead=2)
    p.assign(tp.Tier.DISK, indices=[5])
    model, stage = _ahead(tmp_path, ref, path, p)
    stage.allowance.open()
    stage.loader.join()
    x = torch.randint(0, 64, (2, 16), device="cuda")
    with torch.no_grad():
        want = ref.cuda()(x)
        assert torch.equal(model(x), want)
        stage.state.engine.reset_stats()
        for _ in range(2):
            assert torch.equal(model(x), want)
    stats = stage.handle.stats()
    assert stats is not None and stats.disk_bytes > 0
    assert stats.ram_bytes == 0, "RAM-tier blocks went through the staging buffers after the tier arrived"
    stage.close()
    tp.release(model, stage.handle)


@pytest.mark.parametrize("slow", ["compute", "copy"])
def test_large_blocks_with_a_slow_side(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow: str) -> None:
    """64 MB blocks streamed with either side forced slow (a spin kernel queued on its stream):
    with copies in flight, any missing wait between the streams would show in the output."""
    from trash_panda.offload.backends import copies as device_mod

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


def test_the_meter_leaves_the_users_peak_and_the_device_alone(tmp_path: Path) -> None:
    """A user measuring their own peak around trash-panda still reads it after the meter's
    windows, and a window opens and closes without waiting for the work queued on the device,
    while still measuring a transient below the process's peak. Fails with
    TRASH_PANDA_FAULT=meter-reset (windows that reset torch's peak and synchronize)."""
    import time

    from trash_panda.offload.meter import measured

    model, p, handle, run = _streamed_pass(tmp_path)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    big = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    users = torch.cuda.max_memory_allocated()
    del big
    need = tp.measure_activation_vram(run, p)
    assert need >= 64 * 512 * 64 * 4, "the pass's activations, below the user's peak, were not seen"
    assert torch.cuda.max_memory_allocated() >= users, "the meter reset the user's peak"

    torch.cuda.synchronize()
    started = time.perf_counter()
    torch.cuda._sleep(1_000_000_000)  # about half a second of spinning on the current stream
    with measured(torch.device("cuda")) as peak:
        t = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
        del t
    windowed = time.perf_counter() - started
    torch.cuda.synchronize()
    spun = time.perf_counter() - started
    assert spun > 0.2, f"the spin kernel was too short to tell ({spun:.3f} s)"
    assert windowed < spun / 4, f"a window waited for the device ({windowed:.3f} s of {spun:.3f} s)"
    assert peak[0] >= 8 << 20
    assert torch.cuda.max_memory_allocated() >= users
    tp.release(model, handle)


def test_the_meter_reads_the_users_own_memory_history_and_leaves_it() -> None:
    """A user who records the allocator's history keeps it recording, with what it held before
    the meter's window still in it; the window reads the actions after the last it read, and
    measures its transient below the process's peak."""
    from trash_panda.offload.meter import measured

    here = torch.cuda.current_device()
    torch.cuda.memory._record_memory_history("all", context=None, max_entries=100_000)
    try:
        big = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        del big
        before = torch.cuda.memory._snapshot()["device_traces"][here]
        with measured(torch.device("cuda")) as peak:
            t = torch.empty(16 << 20, dtype=torch.uint8, device="cuda")
            del t
        assert torch._C._cuda_isHistoryEnabled(), "the meter stopped the user's recording"
        after = torch.cuda.memory._snapshot()["device_traces"][here]
        assert after[: len(before)] == before, "the meter cleared the user's history"
        assert peak[0] >= 16 << 20
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def test_a_block_read_ahead_computes_after_its_copies(tmp_path: Path) -> None:
    """stage(overlap=True) on the GPU: the model runs at once, each resident block's first kernels
    waiting on the device for the loader's copies of it (an event per block, on the caller's
    stream). Under TORCH_CUDA_SANITIZER, TRASH_PANDA_FAULT=loader-no-event-wait is reported."""
    ref = reference(torch.float32)
    path = save(ref, tmp_path / "m.safetensors")
    x = ids().cuda()
    with torch.no_grad():
        want = ref.cuda()(x)
    with tp.stage(Tiny, path, device="cuda", resident_blocks=6, overlap=True) as (model, _p, _h), torch.no_grad():
        assert torch.equal(model(x), want)


@pytest.mark.parametrize("reordered", [False, True])
def test_ggml_blocks_expand_on_the_gpu_as_the_core_does_on_the_cpu(reordered: bool) -> None:
    # The device path's torch code (ggml.py) against the core's CPU kernel, bit for bit, for
    # every GGML type and compute dtype, with rows reordered as a GGUF Llama's projections are.
    from support.ggml_blocks import TYPES, random_blocks
    from trash_panda.dtype import dequantize
    from trash_panda.offload.backends.ggml import dequantize_into

    rows, cols = 64, 512
    order = torch.randperm(rows, generator=torch.Generator().manual_seed(0)).tolist() if reordered else None
    for i, name in enumerate(TYPES):
        blocks = torch.from_numpy(random_blocks(name, rows, cols, seed=i))
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            want = dequantize(blocks, name, (rows, cols), dtype)
            if order is not None:
                want = want[torch.tensor(order)]
            out = torch.empty(rows, cols, dtype=dtype, device="cuda")
            dequantize_into(out, blocks.cuda(), name, order)
            assert torch.equal(
                out.cpu().view(torch.int16 if dtype.itemsize == 2 else torch.int32),
                want.view(torch.int16 if dtype.itemsize == 2 else torch.int32),
            ), (name, dtype)


@pytest.mark.parametrize("storage", ["int8", "q8_0"])
def test_8bit_storage_on_gpu(tmp_path: Path, storage: str) -> None:
    # Blocks quantized on load by the core, copied compact to the device and expanded there:
    # the plain model holding the core's quantization expanded on the CPU gives the same outputs.
    from trash_panda.dtype import dequantize, expand, quantize_int8, quantize_q8_0

    torch.manual_seed(0)
    ref = Tiny(dim=512, layers=4).to(torch.bfloat16).eval()
    path = save(ref, tmp_path / "m.safetensors", torch.bfloat16)
    names = [f"blocks.{i}." for i in range(4)]
    plan = tp.Plan.manual(resident=names[:1], streamed=names[1:]).assign(tp.Tier.DISK, prefixes=["blocks.3."])
    with torch.no_grad():
        for i in range(3):  # resident and RAM tier; the disk tier keeps the checkpoint's bytes
            for lin in (ref.blocks[i].up, ref.blocks[i].down):
                w = lin.weight
                if storage == "int8":
                    q, k = quantize_int8(w)
                    lin.weight.copy_(expand(q, torch.bfloat16, k))
                else:
                    lin.weight.copy_(dequantize(quantize_q8_0(w), "q8_0", tuple(w.shape), torch.bfloat16))
    model = on_meta(Tiny, dim=512, layers=4)
    tp.stream_load(model, path, plan=plan, device="cuda", storage_dtype=storage, compute_dtype="bf16")
    handle = tp.install_offload(model)
    ref = ref.cuda()
    x = ids().cuda()
    with torch.no_grad():
        assert torch.equal(model(x), ref(x))
    tp.release(model, handle)


def test_ggml_expansion_temporaries_stay_within_the_planned_scratch() -> None:
    # The device path's temporaries for a tensor of many passes, against what a GPU's plan
    # counts for them (the core's GGML_DEVICE_SCRATCH_BYTES).
    from support.ggml_blocks import random_blocks
    from trash_panda import _core
    from trash_panda.offload.backends.ggml import dequantize_into

    for name in ("Q4_K", "Q8_0", "Q6_K"):
        blocks = torch.from_numpy(random_blocks(name, 4096, 4096, seed=1, scale=1e-3)).cuda()
        out = torch.empty(4096, 4096, dtype=torch.bfloat16, device="cuda")
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        dequantize_into(out, blocks, name)
        torch.cuda.synchronize()
        scratch = torch.cuda.max_memory_allocated() - base
        assert 0 < scratch <= _core.GGML_DEVICE_SCRATCH_BYTES, (name, scratch)
