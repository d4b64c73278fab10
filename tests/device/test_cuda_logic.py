"""The CUDA backend's decisions, on the CPU: pinning the staging pool and the RAM tier each on its
own with the runtime's errors cleared where they happen, the slot of a block whose bring failed,
the device meter's reserved memory, and remove()'s refusal when the weights cannot fit. A fake
``cudart`` and fake allocator figures stand in for the GPU; tests/device/test_cuda.py runs the same
paths on one."""

from __future__ import annotations

import collections
import contextlib
import functools
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import trash_panda as tp
from support import faults
from support.cudart import FakeCudart
from support.models import Tiny, on_meta, save
from support.simdevice import SimulatedDevice
from trash_panda import Tier
from trash_panda.errors import StreamError
from trash_panda.offload import allocator_history as meter_mod
from trash_panda.offload import restore as restore_mod
from trash_panda.offload.backends import cuda as cuda_mod
from trash_panda.offload.backends.copies import CudaDevice
from trash_panda.offload.backends.cuda import RAM_TIER_FALLBACK, CudaBackend, DeviceBackend, register_pinned
from trash_panda.offload.backends.pinning import register_ranges
from trash_panda.offload.handle import OffloadHandle, _install
from trash_panda.offload.meter import CudaGauge, Meter
from trash_panda.offload.state import ModelState, get_state

LAYERS = 8
IDS = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(3))


@pytest.fixture
def in_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sim: SimulatedDevice) -> Iterator[tuple[Tiny, Tiny]]:
    """A GPU plan (slots, 512-byte alignment) computed on the CPU, its RAM tier (blocks 1-4) in
    private memory, as a GPU would pin it; blocks 5-7 on disk. Released before the simulated
    device stops, which a backend left installed by a failed test closes on."""
    monkeypatch.setenv("TRASH_PANDA_RAM_IN_MEMORY", "1")
    torch.manual_seed(0)
    ref = Tiny(dim=64, layers=LAYERS).to(torch.bfloat16).eval()
    path = save(ref, tmp_path / "m.safetensors", torch.bfloat16)
    model = on_meta(Tiny, dim=64, layers=LAYERS)
    p = tp.plan(model, path, vram="1TB", ram="1TB", resident_blocks=1, lookahead=2)
    p.assign(Tier.DISK, indices=[5, 6, 7])
    tp.stream_load(model, path, plan=p, device="cpu")
    state = get_state(model)
    assert state is not None and state.engine is not None and state.config.pin_ram_tier
    assert len(state.engine.ram_image_buffers()) == 4 and len(state.engine.staging_buffers()) == 3
    yield model, ref
    tp.release(model)


def _state(model: Tiny) -> ModelState:
    state = get_state(model)
    assert state is not None and state.engine is not None
    return state


def test_the_staging_pool_stays_pinned_when_the_ram_tier_cannot_be(in_memory: tuple[Tiny, Tiny]) -> None:
    model, _ref = in_memory
    engine = _state(model).engine
    staging = {a for a, _ in engine.staging_buffers()}
    fake = FakeCudart(fail_register={len(staging) + 2})  # the RAM tier's second block
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pool = register_pinned(fake, engine)
    with pytest.warns(UserWarning, match="could not pin .*out of memory.*through the pinned staging buffers"):
        ram = register_ranges(fake, engine, engine.ram_image_buffers(), RAM_TIER_FALLBACK)
    assert pool is not None and ram is None
    assert fake.registered == staging, "the RAM tier's first block was not undone, or the pool was"
    assert fake.last_error == 0, "the failed registration's error was left for the next launch"
    pool.close()
    assert fake.registered == set()


def test_a_failed_unregistration_warns_and_clears_its_error(in_memory: tuple[Tiny, Tiny]) -> None:
    model, _ref = in_memory
    fake = FakeCudart()
    pool = register_pinned(fake, _state(model).engine)
    assert pool is not None
    fake.fail_unregister = True
    with pytest.warns(UserWarning, match="could not unregister 3 pinned host range.*not registered"):
        pool.close()
    assert fake.last_error == 0
    pool.close()  # once only


def _cuda_backend(monkeypatch: pytest.MonkeyPatch, fake: FakeCudart, sim: SimulatedDevice) -> Any:
    """CudaBackend as a GPU builds it, with the fake runtime and the simulated device, which
    pins as the GPU's device does (through torch's cudart, here the fake)."""
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    monkeypatch.setattr(sim, "pin", functools.partial(CudaDevice.pin, sim))
    monkeypatch.setattr(cuda_mod, "CudaDevice", lambda _device: sim)
    return CudaBackend


@pytest.mark.parametrize("ram_pins", [True, False])
def test_ram_tier_blocks_are_copied_from_it_only_when_it_is_pinned(
    in_memory: tuple[Tiny, Tiny], sim: SimulatedDevice, monkeypatch: pytest.MonkeyPatch, ram_pins: bool
) -> None:
    model, ref = in_memory
    state = _state(model)
    staging = len(state.engine.staging_buffers())
    fake = FakeCudart(fail_register=set() if ram_pins else {staging + 1})
    with contextlib.ExitStack() as stack:
        if ram_pins:
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("error")
        else:
            stack.enter_context(pytest.warns(UserWarning, match="could not pin"))
        handle = _install(model, state, state.blocks, None, _cuda_backend(monkeypatch, fake, sim))
    backend = handle.backend
    assert isinstance(backend, CudaBackend) and backend.copies is not None
    assert bool(backend.copies.images) == ram_pins
    assert len(fake.registered) == staging + (4 if ram_pins else 0)
    with torch.no_grad():
        want = ref(IDS)
        for _ in range(3):
            assert torch.equal(model(IDS), want)
    stats = handle.stats()
    assert stats is not None
    # Unpinned, the RAM tier goes through the pinned staging buffers, staged ahead as the disk
    # tier is: after the first pass every streamed block is found staged when its turn comes.
    assert (stats.ram_bytes > 0) == (not ram_pins)
    if not ram_pins:
        assert stats.misses <= len([b for b in state.blocks if b.engine_index is not None]), (stats.hits, stats.misses)
        assert stats.hits >= 2 * stats.misses, (stats.hits, stats.misses)
    handle.remove()
    assert fake.registered == set() and fake.last_error == 0


def _on_the_simulated_device(model: Tiny, sim: SimulatedDevice) -> tuple[ModelState, OffloadHandle, DeviceBackend]:
    """The model's hooks with a device backend on the simulated device."""
    state = _state(model)
    handle = _install(model, state, state.blocks, None, lambda s: DeviceBackend(s, sim))
    backend = handle.backend
    assert isinstance(backend, DeviceBackend) and backend.copies is not None
    return state, handle, backend


def _failing_on_call(n: int, real: Callable[..., Any]) -> Callable[..., Any]:
    """``real``, except that its ``n``-th call raises RuntimeError("injected")."""
    calls = [0]

    def failing(*args: Any) -> Any:
        calls[0] += 1
        if calls[0] == n:
            raise RuntimeError("injected")
        return real(*args)

    return failing


def test_a_block_whose_bring_failed_gives_its_slot_back(
    in_memory: tuple[Tiny, Tiny], sim: SimulatedDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, ref = in_memory
    state, handle, backend = _on_the_simulated_device(model, sim)
    assert backend.copies is not None
    # The third tensor: one of the first streamed block's, after its slot was taken.
    monkeypatch.setattr(cuda_mod, "_typed", _failing_on_call(3, cuda_mod._typed))
    with torch.no_grad():
        want = ref(IDS)
        with pytest.raises(RuntimeError, match="injected"):
            model(IDS)
        assert backend.copies.running == {}, "the failed block still holds its slot"
        block = next(b for b in state.blocks if b.engine_index is not None)
        assert all(block.module.get_parameter(s.name.removeprefix(block.prefix)).is_meta for s in block.work)
        for _ in range(3):
            assert torch.equal(model(IDS), want)
    handle.remove()


def test_a_block_whose_wait_for_its_copy_failed_gives_its_slot_back(
    in_memory: tuple[Tiny, Tiny], sim: SimulatedDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, ref = in_memory
    _, handle, backend = _on_the_simulated_device(model, sim)
    assert backend.copies is not None
    # The second wait: inside take(), once the copy was queued into its slot.
    monkeypatch.setattr(type(sim), "compute_waits", _failing_on_call(2, type(sim).compute_waits))
    with torch.no_grad():
        want = ref(IDS)
        with pytest.raises(RuntimeError, match="injected"):
            model(IDS)
        pipeline = backend.copies
        assert pipeline.running == {}
        held = [h for h in pipeline.holder if h is not None and h not in pipeline.queued]
        assert held == [], "a slot is held by no copy waiting for its block and no running block"
        for _ in range(3):
            assert torch.equal(model(IDS), want)
    handle.remove()


K = 1 << 10
MiB = 1 << 20
GPU = torch.device("cuda", 0)


class FakeAllocator:
    """torch's caching allocator on GPU 0 as the meter reads it, on the host. Its counters:
    allocated and reserved bytes (blocks of 512 bytes at least, as the allocator hands them
    out), and torch's peak of each, one per device, which only reset_peak_memory_stats lowers:
    the user's to read. Its history of actions as _record_memory_history keeps it: TraceEntry
    dicts (action, addr, size, stream, time_us) with the size each call asked for, oldest first,
    in a ring of max_entries; _cuda_memorySnapshot returns it (and records a "snapshot" action
    after it, as torch does), _record_memory_history starts, clears and stops it. A synchronize
    fails the test: the meter must not wait for the device (``strict = False`` counts them)."""

    def __init__(self, backend: str = "native") -> None:
        self.allocated = self.reserved = 0
        self.top_allocated = self.top_reserved = 0
        self.backend = backend
        self.recording = False
        self.trace: collections.deque[dict[str, Any]] = collections.deque(maxlen=1)
        self.skipped: set[str] = set()
        self.calls: list[dict[str, Any]] = []  # every _record_memory_history call, the user's too
        self.queries: list[Any] = []  # what each snapshot asked for
        self.live: dict[int, int] = {}
        self.address = 1 << 40
        self.clock = 0
        self.strict = True
        self.syncs = 0
        self.lock = threading.RLock()  # a drain thread reads while a test allocates

    @staticmethod
    def block(size: int) -> int:
        return max(512, -(-size // 512) * 512)

    def _note(self, action: str, addr: int, size: int) -> None:
        self.clock += 1
        if self.recording and action not in self.skipped:
            entry = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": self.clock, "frames": []}
            self.trace.append(entry)

    def _count(self, allocated: int) -> None:
        self.allocated += allocated
        self.top_allocated = max(self.top_allocated, self.allocated)

    def segment(self, size: int) -> None:
        with self.lock:
            self.reserved += size
            self.top_reserved = max(self.top_reserved, self.reserved)
            self.address += 1 << 32
            self._note("segment_alloc", self.address, size)

    def release(self, size: int) -> None:
        with self.lock:
            self.reserved -= size
            self._note("segment_free", 0, size)

    def alloc(self, size: int) -> int:
        """A tensor of ``size`` bytes, in a new 2 MiB segment where the cache has no room."""
        with self.lock:
            room = self.reserved - self.allocated
            if room < self.block(size):
                self.segment(-(-(self.block(size) - room) // (2 * MiB)) * 2 * MiB)
            self.address += 1 << 24
            self.live[self.address] = size
            self._count(self.block(size))
            self._note("alloc", self.address, size)
            return self.address

    def free(self, addr: int) -> None:
        with self.lock:
            size = self.live.pop(addr)
            self._count(-self.block(size))
            self._note("free_requested", addr, size)
            self._note("free_completed", addr, size)

    def set(self, allocated: int, reserved: int) -> None:
        """Moves the counters to these figures (multiples of 512 bytes) by one segment allocated
        or freed and one allocation or free of the difference."""
        with self.lock:
            if reserved > self.reserved:
                self.segment(reserved - self.reserved)
            if allocated > self.allocated:
                self.alloc(allocated - self.allocated)
            elif allocated < self.allocated:
                self._count(allocated - self.allocated)
                self._note("free_requested", 0, self.allocated - allocated)
            if reserved < self.reserved:
                self.release(self.reserved - reserved)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Puts the fake in torch's place, and a fresh history under the meter (no drain thread:
        the tests that want one say so)."""

        def stats(_device: Any = None) -> dict[str, int]:
            with self.lock:
                return {
                    "allocated_bytes.all.current": self.allocated,
                    "allocated_bytes.all.peak": self.top_allocated,
                    "reserved_bytes.all.current": self.reserved,
                    "reserved_bytes.all.peak": self.top_reserved,
                }

        def reset(_device: Any = None) -> None:
            self.top_allocated, self.top_reserved = self.allocated, self.reserved

        def synchronize(_device: Any = None) -> None:
            self.syncs += 1
            if self.strict:
                raise AssertionError("the meter waited for the device")

        def history_enabled() -> bool:
            if self.backend != "native":
                raise RuntimeError(f"{self.backend} does not yet support recordHistory")
            return self.recording

        def record(
            enabled: str | None = "all",
            context: str | None = "all",
            stacks: str = "all",
            max_entries: int = sys.maxsize,
            device: Any = None,
            clear_history: bool = False,
            compile_context: bool = False,
            global_record_annotations: bool = False,
            skip_actions: list[str] | None = None,
        ) -> None:
            if self.backend != "native":
                raise RuntimeError(f"{self.backend} does not yet support recordHistory")
            with self.lock:
                self.calls.append(
                    {"enabled": enabled, "context": context, "clear": clear_history, "skip": skip_actions}
                )
                self.recording = enabled is not None
                self.skipped = set(skip_actions or ())
                kept = [] if not self.recording or clear_history else list(self.trace)
                self.trace = collections.deque(kept, maxlen=max(1, min(max_entries, 1 << 24)))

        def snapshot(query: Any = None) -> dict[str, Any]:
            with self.lock:
                self.queries.append(query)
                traces = [list(self.trace)]
                self._note("snapshot", 0, self.allocated)
                segments = [{"total_size": self.reserved}] if query is None or tuple(query[:2]) == (0, 0) else []
                return {"segments": segments, "device_traces": traces}

        class Pool:
            id = (0, 7)

        counters = {
            "memory_stats": stats,
            "memory_allocated": lambda _device=None: self.allocated,
            "max_memory_allocated": lambda _device=None: self.top_allocated,
            "memory_reserved": lambda _device=None: self.reserved,
            "max_memory_reserved": lambda _device=None: self.top_reserved,
            "reset_peak_memory_stats": reset,
            "synchronize": synchronize,
            "get_allocator_backend": lambda: self.backend,
            "MemPool": Pool,
        }
        for name, fn in counters.items():
            monkeypatch.setattr(torch.cuda, name, fn)
        monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", record)
        monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda *_a, **_k: snapshot(None))
        monkeypatch.setattr(torch._C, "_cuda_memorySnapshot", snapshot, raising=False)
        monkeypatch.setattr(torch._C, "_cuda_isHistoryEnabled", history_enabled, raising=False)
        monkeypatch.setattr(meter_mod._History, "drain_seconds", 0)
        monkeypatch.setattr(meter_mod, "_HISTORY", meter_mod._History())


@pytest.fixture
def mem(monkeypatch: pytest.MonkeyPatch) -> FakeAllocator:
    fake = FakeAllocator()
    fake.install(monkeypatch)
    return fake


def test_the_device_meter_counts_reserved_growth(mem: FakeAllocator) -> None:
    """The figures are KiB now: the peaks are replayed from the history, whose requests count as
    the allocator's blocks of 512 bytes at least, no longer read from a peak counter reset at
    each window event."""
    meter = Meter(CudaGauge(GPU))
    mem.set(1000 * K, 1000 * K)  # the model's weights
    a = meter.start()
    mem.set(1300 * K, 1600 * K)  # activations whose segments round up: 600 reserved for 300
    mem.set(1000 * K, 1600 * K)
    assert meter.stop(a) == 600 * K
    b = meter.start()  # the same call again: the cache holds its segments
    mem.set(1300 * K, 1600 * K)
    mem.set(1000 * K, 1600 * K)
    assert meter.stop(b) == 300 * K, "memory cached at the start is reused, not counted twice"


def test_the_device_meter_leaves_out_other_models_loads(mem: FakeAllocator) -> None:
    """In KiB, as above: the pauses' actions are replayed and left out, not reset away."""
    meter = Meter(CudaGauge(GPU))
    mem.set(1000 * K, 1000 * K)
    a = meter.start()
    mem.set(1200 * K, 1400 * K)  # A computes
    mem.set(1000 * K, 1400 * K)
    with meter.paused():  # B loads 8000 of weights into 8200 of segments
        mem.set(9000 * K, 9600 * K)
    with meter.paused():  # B is released, and the release empties the cache: A's segments too
        mem.set(1000 * K, 1000 * K)
    mem.set(1200 * K, 1400 * K)  # A computes again
    mem.set(1000 * K, 1400 * K)
    assert meter.stop(a) == 400 * K


def test_the_device_meter_reads_a_loaders_copies_without_waiting_for_the_device(mem: FakeAllocator) -> None:
    """The loader's readings beside the running model do not wait for its compute (nor, now,
    does any reading of the meter: the fake's synchronize fails the test wherever it comes)."""
    meter = Meter(CudaGauge(GPU))
    mem.set(1000 * K, 2048 * K)
    a = meter.start()
    mem.set(1300 * K, 2048 * K)  # the model computes

    def copy() -> int:
        mem.set(1300 * K + 1024 * K, 2048 * K + 1024 * K)  # a tensor of 1024 KiB arrives
        return 1024 * K

    assert meter.moved_in(copy) == 1024 * K
    mem.set(1000 * K + 1024 * K, 2048 * K + 1024 * K)
    assert meter.stop(a) == 300 * K
    assert mem.syncs == 0


def test_a_transient_below_an_earlier_peak_of_the_process_is_measured_exactly(mem: FakeAllocator) -> None:
    """torch's peak counter cannot see a window's transient under the process's earlier peak
    without a reset; the history does, in the blocks the allocator hands out."""
    meter = Meter(CudaGauge(GPU))
    big = mem.alloc(512 * MiB)  # an earlier model, long gone
    mem.free(big)
    weights = mem.alloc(64 * MiB)
    a = meter.start()
    for size in (3 * MiB, 5 * MiB, 300):
        t = mem.alloc(size)
        mem.free(t)
    kept = mem.alloc(2 * MiB)
    assert meter.stop(a) == 5 * MiB
    b = meter.start()
    t = mem.alloc(300)  # 300 bytes asked for, a block of 512 handed out
    mem.free(t)
    assert meter.stop(b) == 512
    mem.free(kept)
    mem.free(weights)
    assert mem.top_allocated == 512 * MiB and mem.syncs == 0


def _windows_after_the_users_peak(mem: FakeAllocator) -> None:
    """The user's own measure around a pipeline: they reset torch's peak, a 256 MiB tensor comes
    and goes, windows of every kind open and close (nested ones, a load paused, tensors moved in
    beside them, blocks freed beside them), and torch's peaks are still the user's."""
    torch.cuda.reset_peak_memory_stats(GPU)
    big = mem.alloc(256 * MiB)
    mem.free(big)
    peaks = (torch.cuda.max_memory_allocated(GPU), torch.cuda.max_memory_reserved(GPU))
    meter = Meter(CudaGauge(GPU))
    for _ in range(3):
        outer = meter.start()
        t = mem.alloc(3 * MiB)
        inner = meter.start()
        with meter.paused():
            loaded = mem.alloc(8 * MiB)
        meter.moved_in(lambda: mem.alloc(MiB) and MiB)
        mem.free(mem.alloc(2 * MiB))
        meter.freed_beside(lambda loaded=loaded: mem.free(loaded) or 8 * MiB)  # type: ignore[misc]
        mem.free(t)
        assert meter.stop(inner) >= 2 * MiB
        assert meter.stop(outer) >= 5 * MiB
    assert (torch.cuda.max_memory_allocated(GPU), torch.cuda.max_memory_reserved(GPU)) == peaks, (
        "the user's peak was reset by the meter"
    )
    assert mem.syncs == 0, "the meter waited for the device"


def test_the_users_peak_survives_any_number_of_windows(mem: FakeAllocator) -> None:
    _windows_after_the_users_peak(mem)
    assert not mem.recording, "the meter's recording outlived its windows"


def test_the_meter_resetting_torchs_peak_is_caught(mem: FakeAllocator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The old gauge (tests/support/faults.py, meter-reset) reset torch's peak at each window event and
    synchronized the device: the user's-peak check fails on it, and so does the synchronize one."""
    faults.apply(monkeypatch, "meter-reset")
    mem.strict = False
    with pytest.raises(AssertionError, match="the user's peak was reset"):
        _windows_after_the_users_peak(mem)
    assert mem.syncs > 0


def test_the_meter_records_the_history_while_a_window_is_open(
    mem: FakeAllocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where nobody records, the meter does while a window is open: no stack traces, the actions
    that do not move the counters left out, cleared after each read, stopped at the last close;
    the snapshots ask for an empty pool's segments only."""
    mem.segment(64 * MiB)  # room in the cache: the windows' segments do not grow
    meter = Meter(CudaGauge(GPU))
    a = meter.start()
    assert mem.recording
    assert mem.calls[0] == {"enabled": "all", "context": None, "clear": True, "skip": ["free_completed", "snapshot"]}
    for _ in range(20):
        mem.free(mem.alloc(MiB))
    b = meter.start()
    assert len(mem.trace) == 0, "what the meter read is still held"
    assert meter.stop(b) == 0
    assert mem.recording, "stopped while a window was still open"
    assert meter.stop(a) == MiB
    assert not mem.recording and len(mem.trace) == 0
    assert mem.queries and all(q is not None and tuple(q[:2]) == (0, 7) for q in mem.queries)


def test_the_meters_own_history_past_its_bound_falls_back_with_one_warning(
    mem: FakeAllocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(meter_mod._History, "max_entries", 8)
    mem.free(mem.alloc(256 * MiB))  # the process's peak, above the window's transients
    meter = Meter(CudaGauge(GPU))
    a = meter.start()
    for _ in range(10):  # 20 actions between two readings
        mem.free(mem.alloc(MiB))
    with pytest.warns(UserWarning, match="more than 8 allocator actions between two readings"):
        assert meter.stop(a) == 0  # the transients are lost: torch's peak did not rise
    b = meter.start()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(10):
            mem.free(mem.alloc(MiB))
        assert meter.stop(b) == 0, "said once"
    c = meter.start()
    mem.free(mem.alloc(MiB))
    assert meter.stop(c) == MiB, "exact again once the history fits"


def test_the_users_own_history_is_read_not_cleared_nor_stopped(mem: FakeAllocator) -> None:
    """A user recording their own history keeps it: the meter reads the actions after the last
    it read, and neither clears nor stops it (nor records with its own settings)."""
    torch.cuda.memory._record_memory_history("all", max_entries=1000)
    for _ in range(30):  # the user's own history before the meter's windows
        mem.free(mem.alloc(4 * MiB))
    before = [e for e in mem.trace if e["action"] != "snapshot"]
    meter = Meter(CudaGauge(GPU))
    for _ in range(3):
        a = meter.start()
        t = mem.alloc(3 * MiB)
        mem.free(t)
        assert meter.stop(a) == 3 * MiB
    assert mem.recording and len(mem.calls) == 1, "the user's recording was restarted or stopped"
    held = [e for e in mem.trace if e["action"] != "snapshot"]
    assert held[: len(before)] == before, "the user's history was cleared"


def test_the_users_wrapped_history_is_read_where_it_goes_on(mem: FakeAllocator) -> None:
    """The user's ring is full and drops its oldest at each action: the meter finds the last
    action it read further back and reads on from there."""
    torch.cuda.memory._record_memory_history("all", max_entries=16)
    mem.free(mem.alloc(64 * MiB))  # torch's peak stays above the window's transients
    for _ in range(20):
        mem.free(mem.alloc(MiB))
    meter = Meter(CudaGauge(GPU))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = meter.start()
        for size in (2 * MiB, 5 * MiB):
            mem.free(mem.alloc(size))
        assert meter.stop(a) == 5 * MiB


def test_a_users_history_that_drops_unread_actions_falls_back_with_one_warning(mem: FakeAllocator) -> None:
    torch.cuda.memory._record_memory_history("all", max_entries=8)
    meter = Meter(CudaGauge(GPU))
    held = mem.alloc(64 * MiB)  # torch's peak stays above the windows' transients
    mem.free(mem.alloc(256 * MiB))
    a = meter.start()
    for _ in range(10):
        mem.free(mem.alloc(MiB))
    with pytest.warns(UserWarning, match="dropped actions the device memory meter had not read"):
        assert meter.stop(a) == 0
    b = meter.start()
    mem.free(mem.alloc(300 * MiB))  # a new peak of the process: torch's counter has it exactly
    assert meter.stop(b) == 300 * MiB
    assert mem.recording
    mem.free(held)


def test_a_users_history_too_long_to_read_at_each_event_is_not_read(
    mem: FakeAllocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(meter_mod._History, "user_limit", 50)
    torch.cuda.memory._record_memory_history("all")
    for _ in range(30):
        mem.free(mem.alloc(8 * MiB))
    meter = Meter(CudaGauge(GPU))
    with pytest.warns(UserWarning, match=r"holds 91 actions, too many to read at each window event"):
        a = meter.start()
    reads = len(mem.queries)
    mem.free(mem.alloc(MiB))
    assert meter.stop(a) == 0  # below the process's peak: not seen, as the warning said
    assert len(mem.queries) == reads, "read at a window event all the same"
    assert mem.recording and len(mem.calls) == 1


def test_an_allocator_without_history_falls_back_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    mem = FakeAllocator(backend="cudaMallocAsync")
    mem.install(monkeypatch)
    torch.cuda.reset_peak_memory_stats(GPU)
    mem.free(mem.alloc(256 * MiB))
    meter = Meter(CudaGauge(GPU))
    with pytest.warns(UserWarning, match="the cudaMallocAsync allocator keeps no history"):
        a = meter.start()
    mem.free(mem.alloc(MiB))
    assert meter.stop(a) == 0  # below the process's peak: not seen, as the warning said
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b = meter.start()
        mem.free(mem.alloc(512 * MiB))
        assert meter.stop(b) == 512 * MiB  # torch's peak rose during the window: exact
    assert mem.top_allocated == 512 * MiB and mem.syncs == 0


def test_a_long_window_is_drained_on_a_thread(mem: FakeAllocator, monkeypatch: pytest.MonkeyPatch) -> None:
    """A window open across more actions than the history holds, with no event to read it: the
    drain thread reads and clears it meanwhile, and the window's transients are all seen."""
    monkeypatch.setattr(meter_mod._History, "max_entries", 64)
    monkeypatch.setattr(meter_mod._History, "drain_seconds", 0.005)
    history = meter_mod._HISTORY
    mem.alloc(256 * MiB)
    mem.segment(64 * MiB)
    meter = Meter(CudaGauge(GPU))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = meter.start()
        for chunk in range(10):
            with history.lock:  # each chunk between two of the thread's reads
                for _ in range(20):
                    mem.free(mem.alloc(MiB))
                if chunk == 6:
                    mem.free(mem.alloc(9 * MiB))
            deadline = time.monotonic() + 10
            while len(mem.trace) and time.monotonic() < deadline:
                time.sleep(0.001)
            assert not len(mem.trace), "the thread did not read the history"
        assert meter.stop(a) == 9 * MiB
    assert history.drain is None and not mem.recording


def test_remove_refuses_up_front_when_the_weights_cannot_fit(
    in_memory: tuple[Tiny, Tiny], sim: SimulatedDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, ref = in_memory
    state = _state(model)
    streamed = sum(b.expanded_bytes for b in state.plan.blocks if b.tier != Tier.DEVICE)
    assert restore_mod.restore_bytes(state) == streamed
    assert restore_mod.refusal(streamed, streamed - 10, 10) is None
    why = restore_mod.refusal(3_000_000_000, 1_000_000_000, 500_000_000)
    assert why is not None and "3.00 GB" in why and "1.00 GB free" in why and "0.50 GB more" in why
    assert "1.50 GB short" in why
    handle = _install(model, state, state.blocks, None, lambda s: DeviceBackend(s, sim))
    held = handle.backend.device_bytes()  # type: ignore[union-attr]
    assert held > 0
    # As a GPU with too little free memory: the CPU model takes the CUDA path's decision.
    monkeypatch.setattr(restore_mod, "_free_on", lambda _state: streamed - held - 1)
    with pytest.raises(StreamError, match="the hooks stay installed"):
        handle.remove()
    assert not handle.removed and state.handle is handle
    with torch.no_grad():
        want = ref(IDS)
        assert torch.equal(model(IDS), want), "the refused remove() changed the model"
    monkeypatch.setattr(restore_mod, "_free_on", lambda _state: streamed - held)
    handle.remove()
    assert handle.removed
    with torch.no_grad():
        assert torch.equal(model(IDS), want)
