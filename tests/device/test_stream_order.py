"""The CUDA path's stream ordering, proven on the virtual-time device (vtdevice.py), whose rules
tests/device/test_vtdevice.py holds to CUDA's: slots allocated where a running stage's kernels still read
memory, blocks that ran on a caller's own stream giving their memory back, the loader's copies on a
stream of their own, a RAM tier pinned when it arrives, staging buffers back once their copy
landed, copies from pageable memory behind the kernels. Each test is shown to fail with its defect
put back (tests/support/faults.py), the variant scripts/gpu-check.sh runs on a GPU."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import trash_panda as tp
from support import faults
from support.checkpoints import fp8_checkpoint, reference
from support.models import Tiny, on_meta, save
from support.vtdevice import LAUNCH_S, VirtualDevice, VirtualEngine, predict_step
from trash_panda import Tier, _core
from trash_panda.offload import final_pass as final_pass_mod
from trash_panda.offload import handle as handle_mod
from trash_panda.offload.backends.copies import SlotCopies
from trash_panda.offload.backends.cuda import DeviceBackend
from trash_panda.offload.handle import OffloadHandle, _install
from trash_panda.offload.state import ModelState, get_state

IDS = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(3))
LINK = 50e9
SCALE = 15_000.0  # the tiny blocks stand for blocks of about 1 GB


def _caught(test: Callable[[], None]) -> None:
    """Runs ``test``, which must fail: the check it makes catches the defect put back."""
    with pytest.raises(AssertionError):
        test()


def _kernels(dev: VirtualDevice, model: nn.Module, seconds: float) -> list[Any]:
    """Each block queues ``seconds`` of kernels reading its weights (as the hooks left them for
    its run) on the calling thread's current stream, once its weights are in."""

    def queue(module: nn.Module, _args: object) -> None:
        dev.run_compute(seconds, reads=[p for p in module.parameters() if not p.is_meta])

    return [b.register_forward_pre_hook(queue) for b in model.blocks]  # type: ignore[union-attr]


def _in_device_memory(dev: VirtualDevice, state: ModelState) -> None:
    """Moves every resident weight (and stored form) into the device's memory, allocated on the
    current stream, as a load onto a GPU leaves it."""

    def moved(t: torch.Tensor) -> torch.Tensor:
        out = dev.empty(t.numel() * t.element_size()).view(t.dtype).reshape(t.shape)
        out.copy_(t)
        return out

    for block in state.blocks:
        if block.engine_index is not None:
            continue
        for spec in block.tensors:
            if spec.resident is not None:
                scale = None if spec.resident_scale is None else moved(spec.resident_scale)
                spec.keep_stored(moved(spec.resident), scale, spec.placeholder)
            else:
                spec.put(nn.Parameter(moved(spec.held()), requires_grad=False))


# -- 1. the first copy into each slot -----------------------------------------------------------


def _slots_made_where_a_stage_computes(fault: str | None, monkeypatch: pytest.MonkeyPatch) -> VirtualDevice:
    """A running stage's kernels read memory for a second, and the host frees it at once; the
    next stage's slots are then made on the read-ahead's thread (its current stream is the
    default one too), and its first block copied."""
    if fault:
        faults.apply(monkeypatch, fault)
    dev = VirtualDevice(LINK, scale=SCALE, poison=False)
    slot_bytes = 4096
    running = [dev.empty(slot_bytes) for _ in range(2)]
    addresses = {t.data_ptr() for t in running}
    for t in running:
        dev.run_compute(1.0, reads=t, what="the running stage")
    del running, t
    eng = VirtualEngine(dev, blocks=4, block_bytes=slot_bytes, lookahead=1, fill_bps=None, real_bytes=slot_bytes)
    made: list[SlotCopies] = []
    ahead = threading.Thread(target=lambda: made.append(SlotCopies(dev, eng, 2, slot_bytes, 2, 1)))
    ahead.start()
    ahead.join()
    (pipe,) = made
    assert {s.data_ptr() for s in pipe.slots} == addresses, "the slots did not reuse the freed memory"
    taken = pipe.take(0)
    dev.run_compute(0.001, reads=taken.slot, block=0)
    pipe.finish(0)
    pipe.close()
    return dev


def test_the_first_copy_into_a_slot_waits_for_the_kernels_its_memory_carries(monkeypatch: pytest.MonkeyPatch) -> None:
    dev = _slots_made_where_a_stage_computes(None, monkeypatch)
    assert dev.violations == []
    assert dev.copies[0].start.t >= 1.0


def test_a_first_copy_that_waits_for_nothing_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    dev = _slots_made_where_a_stage_computes("first-copy-wait", monkeypatch)
    assert any("refilled" in v and "the running stage" in v for v in dev.violations), dev.violations


# -- 2. memory a stage gives back after computing on the caller's stream ------------------------


def _resident_on(dev: VirtualDevice, tmp_path: Path, fp8: bool = False) -> tuple[Tiny, Tiny, OffloadHandle]:
    if fp8:
        path = tmp_path / "fp8.safetensors"
        ref = fp8_checkpoint(reference(torch.float32), path)
    else:
        ref = reference(torch.float32)
        path = save(ref, tmp_path / "m.safetensors")
    model = on_meta(Tiny)
    tp.stream_load(model, path, plan=tp.Plan.manual(resident=[f"blocks.{i}." for i in range(6)], streamed=[]))
    state = get_state(model)
    assert state is not None
    _in_device_memory(dev, state)
    handle = _install(model, state, state.blocks, None, lambda s: DeviceBackend(s, dev))
    return model, ref, handle


def _on_a_caller_s_stream(dev: VirtualDevice, model: Tiny, ref: Tiny) -> None:
    """One pass of ``model``, equal to ``ref``'s, each block's kernels (0.1 s) queued on a stream
    of the caller's own; the host goes on at once."""
    kernels = _kernels(dev, model, 0.1)
    with torch.no_grad(), dev.use(dev.new_stream("the caller's")):
        assert torch.equal(model(IDS), ref(IDS))
    for k in kernels:
        k.remove()


def _given_back_after_a_caller_s_stream(tmp_path: Path, fault: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if fault:
        faults.apply(monkeypatch, fault)
    dev = VirtualDevice(LINK, scale=SCALE)
    model, ref, handle = _resident_on(dev, tmp_path)
    _on_a_caller_s_stream(dev, model, ref)
    state = handle.state
    sizes = [t.numel() * t.element_size() for b in state.blocks for t in b.module.parameters()]
    # The stage ends on the default stream and gives its blocks back to the next stage, whose
    # load allocates and writes at once.
    final_pass_mod.free_idle_blocks(handle, state.blocks)
    for n in sizes:
        dev.run_compute(1e-6, writes=dev.empty(n), block=None)
    assert dev.violations == [], dev.violations[:3]
    tp.release(model, handle)


def test_blocks_given_back_wait_for_the_stream_they_ran_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _given_back_after_a_caller_s_stream(tmp_path, None, monkeypatch)


def test_blocks_given_back_for_the_current_stream_only_are_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _caught(lambda: _given_back_after_a_caller_s_stream(tmp_path, "retire-current-stream", monkeypatch))


def _expansion_freed_after_a_caller_s_stream(
    tmp_path: Path, fault: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every block resident in fp8: no slots, no copy pipeline; the expansion buffer is read by
    kernels on the caller's stream, then the model is released."""
    if fault:
        faults.apply(monkeypatch, fault)
    dev = VirtualDevice(LINK, scale=SCALE)
    model, expected, handle = _resident_on(dev, tmp_path, fp8=True)
    backend = handle.backend
    assert isinstance(backend, DeviceBackend) and backend.copies is None and backend.expansion.raw.numel() > 0
    _on_a_caller_s_stream(dev, model, expected)
    size = backend.expansion.raw.numel()
    tp.release(model, handle)
    dev.run_compute(1e-6, writes=dev.empty(size), block=None)
    assert dev.violations == [], dev.violations[:3]


def test_a_backend_without_slots_waits_for_the_device_before_freeing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _expansion_freed_after_a_caller_s_stream(tmp_path, None, monkeypatch)


def test_an_expansion_buffer_freed_without_a_wait_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _caught(lambda: _expansion_freed_after_a_caller_s_stream(tmp_path, "close-no-sync", monkeypatch))


# -- 5. staging buffers back once their copy landed -----------------------------------------------


def _buffer_back_before_its_block_runs(fault: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if fault:
        faults.apply(monkeypatch, fault)
    dev = VirtualDevice(LINK, scale=SCALE, poison=False)
    eng = VirtualEngine(dev, blocks=6, block_bytes=1 << 20, lookahead=2, fill_bps=None)
    pipe = SlotCopies(dev, eng, 3, 256, 3, 2)
    taken = pipe.take(0)  # copies block 0, and block 1 ahead, each out of a staging buffer
    dev.run_compute(0.01, reads=taken.slot, block=0)
    assert 1 in pipe.queued
    dev.synchronize()  # both copies landed
    pipe.finish(0)
    held = [b.block for b in eng.buffers if b.state == "leased"]
    assert held == [], f"staging buffers of blocks {held} are still out though their copies landed"
    pipe.close()


def test_a_staging_buffer_goes_back_once_its_copy_landed(monkeypatch: pytest.MonkeyPatch) -> None:
    _buffer_back_before_its_block_runs(None, monkeypatch)


def test_a_view_kept_until_the_block_runs_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    _caught(lambda: _buffer_back_before_its_block_runs("lease-views", monkeypatch))


# -- 6. copies from pageable memory behind the kernels -------------------------------------------


def _pageable_steps() -> list[dict[str, Any]]:
    size = 64_000_000
    return [predict_step(size, ratio * size / LINK, 2, LINK, 2 * LINK, pinned=False) for ratio in (0.5, 1.0, 2.0)]


def _within_the_pageable_bound(steps: list[dict[str, Any]]) -> None:
    """From pageable memory the host is held for each copy: the best a schedule can do is the
    larger of compute and the host's copy and launch per block."""
    for r in steps:
        assert r["violations"] == []
        bound = max(r["compute_s"], r["copy_s"] + LAUNCH_S + 2e-5, r["fill_s"])
        assert r["step_s"] <= 1.05 * bound, (r["step_s"], bound, r["compute_s"], r["copy_s"])


def test_with_pageable_staging_the_device_computes_while_the_host_copies() -> None:
    _within_the_pageable_bound(_pageable_steps())


def test_prefetching_before_the_kernels_from_pageable_memory_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    faults.apply(monkeypatch, "pageable-prefetch")
    _caught(lambda: _within_the_pageable_bound(_pageable_steps()))


# -- 4. a RAM tier that arrives after the backend was made ---------------------------------------


@pytest.fixture
def in_memory_ram_tier(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TRASH_PANDA_RAM_IN_MEMORY", "1")
    yield


def _streaming(path: Path, seed: int = 0) -> tuple[Tiny, Tiny, tp.Plan]:
    """A bf16 model of six blocks saved at ``path``, and a GPU plan for it: one block resident,
    three in the RAM tier, two on disk. Returns the reference, the model on meta and the plan."""
    torch.manual_seed(seed)
    ref = Tiny(layers=6).to(torch.bfloat16).eval()
    save(ref, path, torch.bfloat16)
    model = on_meta(Tiny, layers=6)
    p = tp.plan(model, path, vram="1TB", ram="1TB", resident_blocks=1, lookahead=2)
    p.assign(Tier.DISK, indices=[4, 5])
    return ref, model, p


def _loaded_ahead(tmp_path: Path, dev: VirtualDevice, monkeypatch: pytest.MonkeyPatch) -> tuple[Tiny, Any]:
    """A stage read ahead of its turn onto the virtual device (see :func:`_streaming`), its RAM
    tier held in memory; returns the reference and the loaded stage."""
    from trash_panda.pipeline.loaded import load_stage

    path = tmp_path / "ahead.safetensors"
    ref, model, p = _streaming(path)
    monkeypatch.setattr(handle_mod, "make_backend", lambda s: DeviceBackend(s, dev))
    stage = load_stage(
        "ahead", model, tp.Checkpoint(path), p, _core.Free(0, 0),
        device=torch.device("cpu"), order=None, destination=None, shared={}, key="", ahead=True,
    )  # fmt: skip
    assert stage.allowance is not None and stage.loader is not None
    stage.allowance.open()
    stage.loader.join()
    return ref, stage


def _ram_tier_pinned_on_arrival(tmp_path: Path, fault: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if fault:
        faults.apply(monkeypatch, fault)
    dev = VirtualDevice(LINK, scale=SCALE, pinned=False)
    ref, stage = _loaded_ahead(tmp_path, dev, monkeypatch)
    state = stage.state
    assert state.engine is not None and state.config.pin_ram_tier
    ram = [b.engine_index for b in state.blocks if b.tier == Tier.RAM]
    assert ram and all(state.engine.ram_image(i) is not None for i in ram), "the loader did not read the RAM tier"
    with torch.no_grad():
        want = ref(IDS)
        assert torch.equal(stage.model(IDS), want)  # blocks staged before it arrived still run
        state.engine.reset_stats()
        for _ in range(2):
            assert torch.equal(stage.model(IDS), want)
    stats = stage.handle.stats()
    assert stats is not None and stats.disk_bytes > 0
    assert stats.ram_bytes == 0, "RAM-tier blocks went through the staging buffers after the tier arrived"
    backend = stage.handle.backend
    assert isinstance(backend, DeviceBackend) and backend.copies is not None
    assert set(backend.copies.images) == set(ram)
    stage.close()
    tp.release(stage.model, stage.handle)


def test_a_ram_tier_read_ahead_is_pinned_when_it_arrives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_memory_ram_tier: None
) -> None:
    _ram_tier_pinned_on_arrival(tmp_path, None, monkeypatch)


def test_a_ram_tier_left_unpinned_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_memory_ram_tier: None
) -> None:
    _caught(lambda: _ram_tier_pinned_on_arrival(tmp_path, "ram-tier-on-arrival", monkeypatch))


def test_the_engine_s_staging_of_the_ram_tier_follows_its_arrival(tmp_path: Path, in_memory_ram_tier: None) -> None:
    """Before its RAM tier arrives a stage read ahead has the workers stage it (a block may run
    before the tier is in); after, the device copies it from memory."""
    model = on_meta(Tiny, layers=6)
    torch.manual_seed(0)
    path = save(Tiny(layers=6), tmp_path / "m.safetensors")
    p = tp.plan(model, path, vram="1TB", ram="1TB", resident_blocks=1, lookahead=2)
    tp.stream_load(model, path, plan=p, device="cpu")
    state = get_state(model)
    assert state is not None and state.engine is not None
    assert not state.engine.copy_ram_tier_directly(), "held back already"
    assert state.engine.stage_ram_tier_ahead() and state.engine.copy_ram_tier_directly()
    tp.release(model)


# -- 3. the next stage's loads behind the running stage's compute -------------------------------

DRIVE = 5e9  # bytes/s the loader's reads take, in virtual time
KERNELS = 0.25  # seconds of kernels per block of the running stage


def _next_stage_behind_a_running_one(
    tmp_path: Path, fault: str | None, monkeypatch: pytest.MonkeyPatch, tight: bool = False
) -> tuple[float, float, VirtualDevice]:
    """Stage k streams five of its six blocks (about 1 GB each: a 20 ms copy, 0.25 s of kernels)
    and runs twice; stage k+1, every block resident, is read ahead on its loader thread (reads at
    5 GB/s) and copied to the device. Returns when the loader was done and when stage k's
    compute ends, on the device's clock; then stage k+1 runs and must equal its reference.

    ``tight``: the device has no room left but what stage k's activations freed (still read by
    its queued kernels), in the default stream's pool."""
    from trash_panda.offload import reads
    from trash_panda.offload.overlap import ResidentLoader
    from trash_panda.pipeline.loaded import load_stage

    if fault:
        faults.apply(monkeypatch, fault)
    dev = VirtualDevice(LINK, scale=SCALE, poison=False)
    path_k = tmp_path / "k.safetensors"
    ref_k, model_k, p = _streaming(path_k)
    tp.stream_load(model_k, path_k, plan=p, device="cpu")
    state_k = get_state(model_k)
    assert state_k is not None
    _in_device_memory(dev, state_k)
    handle_k = _install(model_k, state_k, state_k.blocks, None, lambda s: DeviceBackend(s, dev))
    kernels = _kernels(dev, model_k, KERNELS)

    # Stage k+1, read ahead: its reads take virtual time on the loader's own clock.
    torch.manual_seed(1)
    ref_n = Tiny(layers=6).to(torch.bfloat16).eval()
    path_n = save(ref_n, tmp_path / "next.safetensors", torch.bfloat16)
    model_n = on_meta(Tiny, layers=6)
    p_n = tp.plan(model_n, path_n, vram="1TB", ram="1TB", resident_blocks=6)
    read_many = reads.read_many

    def timed_read(infos: list[Any], *args: Any, **kwargs: Any) -> Any:
        out = read_many(infos, *args, **kwargs)
        dev.move_clock(dev.clock() + sum(i.nbytes for i in infos) * SCALE / DRIVE)
        return out

    done_at: list[float] = []
    run = ResidentLoader._run

    def timed_run(self: ResidentLoader) -> None:
        run(self)
        done_at.append(dev.clock())

    monkeypatch.setattr(reads, "read_many", timed_read)
    monkeypatch.setattr(ResidentLoader, "_run", timed_run)
    monkeypatch.setattr(handle_mod, "make_backend", lambda s: DeviceBackend(s, dev))
    with torch.no_grad():
        for _ in range(2):  # stage k's runs, queued on the device
            assert torch.equal(model_k(IDS), ref_k(IDS))
    if tight:
        scratch = dev.empty(2 * sum(os.path.getsize(p) for p in (path_n,)))
        dev.run_compute(0.5, reads=scratch, what="stage k's activations")
        del scratch
        dev.capacity = dev.reserved
    running_end = max(c.end for c in dev.computes)
    nxt = load_stage(
        "next", model_n, tp.Checkpoint(path_n), p_n, _core.Free(0, 0),
        device=torch.device("cpu"), order=None, destination=None, shared={}, key="", ahead=True,
    )  # fmt: skip
    assert nxt.allowance is not None and nxt.loader is not None
    nxt.allowance.give(1 << 40)  # the memory is free: nothing waits for stage k to give any
    nxt.loader.join()
    for k in kernels:
        k.remove()
    tp.release(model_k, handle_k)
    # Stage k+1's turn: its blocks' kernels come after its copies, on the default stream.
    nxt.allowance.open()
    queued = _kernels(dev, model_n, KERNELS)
    with torch.no_grad():
        assert torch.equal(model_n(IDS), ref_n(IDS))
    for q in queued:
        q.remove()
    nxt.close()
    tp.release(model_n, nxt.handle)
    assert dev.violations == [], dev.violations[:3]
    return done_at[0], running_end, dev


def test_the_next_stage_loads_behind_the_running_stage_s_compute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded, running_end, dev = _next_stage_behind_a_running_one(tmp_path, None, monkeypatch)
    assert loaded < running_end, f"the next stage was on the device at {loaded:.3f} s, after {running_end:.3f} s"
    side = [c for c in dev.copies if c.stream.startswith("side")]
    assert side and max(c.done.t for c in side) <= loaded
    # Its reads (six blocks of about 1 GB at 5 GB/s) and copies took most of the time stage k
    # computed, all of it behind that compute.
    assert loaded > 0.3 * running_end


def test_loads_on_the_default_stream_are_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def check() -> None:
        loaded, running_end, _dev = _next_stage_behind_a_running_one(tmp_path, "loader-default-stream", monkeypatch)
        assert loaded < running_end

    _caught(check)


def test_loads_into_memory_a_running_stage_freed_wait_for_its_kernels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No room on the device: the loader takes the memory stage k's activations freed, from the
    default stream's pool, behind the kernels queued there (no overlap, and no race)."""
    loaded, running_end, _dev = _next_stage_behind_a_running_one(tmp_path, None, monkeypatch, tight=True)
    assert loaded > running_end


def test_loads_into_freed_memory_without_a_wait_are_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trash_panda.offload.backends.loader_copies import LoaderCopies

    put = LoaderCopies.put

    def unordered(self: LoaderCopies, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        self.device.compute_done = lambda: None  # type: ignore[method-assign]
        return put(self, tensors)

    monkeypatch.setattr(LoaderCopies, "put", unordered)
    _caught(lambda: _next_stage_behind_a_running_one(tmp_path, None, monkeypatch, tight=True))
