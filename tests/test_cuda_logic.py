"""The CUDA backend's decisions, on the CPU: pinning the staging pool and the RAM tier each on its
own with the runtime's errors cleared where they happen, the slot of a block whose bring failed,
the device meter's reserved memory, and remove()'s refusal when the weights cannot fit. A fake
``cudart`` and fake allocator figures stand in for the GPU; tests/test_cuda.py runs the same
paths on one."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import trash_panda as tp
from models import Tiny, on_meta, save
from simdevice import SimulatedDevice
from trash_panda import Tier
from trash_panda.errors import StreamError
from trash_panda.offload import cuda as cuda_mod
from trash_panda.offload import restore as restore_mod
from trash_panda.offload.cuda import CudaBackend, DeviceBackend, register_pinned, register_ram_tier
from trash_panda.offload.hooks import OffloadHandle, _install
from trash_panda.offload.meter import CudaGauge, Meter
from trash_panda.offload.state import ModelState, get_state

LAYERS = 8
IDS = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(3))


class FakeCudart:
    """torch's cudart as the runtime behaves: a failed call leaves its error as the last error
    until cudaGetLastError reads it (and the next kernel launch would report it)."""

    def __init__(self, fail_register: set[int] | None = None, fail_unregister: bool = False) -> None:
        self.fail_register = fail_register or set()  # which calls fail, counted from 1
        self.fail_unregister = fail_unregister
        self.calls = 0
        self.registered: set[int] = set()
        self.last_error = 0

    def cudaHostRegister(self, addr: int, size: int, flags: int) -> int:
        self.calls += 1
        if self.calls in self.fail_register or addr in self.registered:
            self.last_error = 2 if addr not in self.registered else 712  # out of memory / already registered
            return self.last_error
        self.registered.add(addr)
        return 0

    def cudaHostUnregister(self, addr: int) -> int:
        if self.fail_unregister or addr not in self.registered:
            self.last_error = 713  # cudaErrorHostMemoryNotRegistered
            return self.last_error
        self.registered.discard(addr)
        return 0

    def cudaGetLastError(self) -> int:
        err, self.last_error = self.last_error, 0
        return err

    def cudaGetErrorString(self, err: int) -> str:
        return {2: "out of memory", 713: "not registered"}.get(err, "error")


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
        ram = register_ram_tier(fake, engine)
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
    """CudaBackend as a GPU builds it, with the fake runtime and the simulated device."""
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
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
    assert isinstance(backend, CudaBackend) and backend.pipeline is not None
    assert bool(backend.pipeline.images) == ram_pins
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
    handle = _install(model, state, state.blocks, None, lambda s: DeviceBackend(s, sim, torch.device("cpu")))
    backend = handle.backend
    assert isinstance(backend, DeviceBackend) and backend.pipeline is not None
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
    assert backend.pipeline is not None
    # The third tensor: one of the first streamed block's, after its slot was taken.
    monkeypatch.setattr(cuda_mod, "_typed", _failing_on_call(3, cuda_mod._typed))
    with torch.no_grad():
        want = ref(IDS)
        with pytest.raises(RuntimeError, match="injected"):
            model(IDS)
        assert backend.pipeline.running == {}, "the failed block still holds its slot"
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
    assert backend.pipeline is not None
    # The second wait: inside take(), once the copy was queued into its slot.
    monkeypatch.setattr(type(sim), "compute_waits", _failing_on_call(2, type(sim).compute_waits))
    with torch.no_grad():
        want = ref(IDS)
        with pytest.raises(RuntimeError, match="injected"):
            model(IDS)
        pipeline = backend.pipeline
        assert pipeline.running == {}
        held = [h for h in pipeline.holder if h is not None and h not in pipeline.queued]
        assert held == [], "a slot is held by no copy waiting for its block and no running block"
        for _ in range(3):
            assert torch.equal(model(IDS), want)
    handle.remove()


class FakeAllocator:
    """torch's caching allocator's counters: allocated and reserved, with their peaks."""

    def __init__(self) -> None:
        self.allocated = self.reserved = 0
        self.top_allocated = self.top_reserved = 0

    def set(self, allocated: int, reserved: int) -> None:
        self.allocated, self.reserved = allocated, reserved
        self.top_allocated = max(self.top_allocated, allocated)
        self.top_reserved = max(self.top_reserved, reserved)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def reset(_device: Any = None) -> None:
            self.top_allocated, self.top_reserved = self.allocated, self.reserved

        for name, fn in {
            "synchronize": lambda _device=None: None,
            "memory_allocated": lambda _device=None: self.allocated,
            "max_memory_allocated": lambda _device=None: self.top_allocated,
            "memory_reserved": lambda _device=None: self.reserved,
            "max_memory_reserved": lambda _device=None: self.top_reserved,
            "reset_peak_memory_stats": reset,
        }.items():
            monkeypatch.setattr(torch.cuda, name, fn)


def test_the_device_meter_counts_reserved_growth(monkeypatch: pytest.MonkeyPatch) -> None:
    mem = FakeAllocator()
    mem.install(monkeypatch)
    meter = Meter(CudaGauge(torch.device("cuda", 0)))
    mem.set(1000, 1000)  # the model's weights
    a = meter.start()
    mem.set(1300, 1600)  # activations whose segments round up: 600 reserved for 300
    mem.set(1000, 1600)
    assert meter.stop(a) == 600
    b = meter.start()  # the same call again: the cache holds its segments
    mem.set(1300, 1600)
    mem.set(1000, 1600)
    assert meter.stop(b) == 300, "memory cached at the start is reused, not counted twice"


def test_the_device_meter_leaves_out_other_models_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    mem = FakeAllocator()
    mem.install(monkeypatch)
    meter = Meter(CudaGauge(torch.device("cuda", 0)))
    mem.set(1000, 1000)
    a = meter.start()
    mem.set(1200, 1400)  # A computes
    mem.set(1000, 1400)
    with meter.paused():  # B loads 8000 of weights into 8200 of segments
        mem.set(9000, 9600)
    with meter.paused():  # B is released, and the release empties the cache: A's segments too
        mem.set(1000, 1000)
    mem.set(1200, 1400)  # A computes again
    mem.set(1000, 1400)
    assert meter.stop(a) == 400


def test_the_device_meter_reads_a_loaders_copies_without_waiting_for_the_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mem = FakeAllocator()
    mem.install(monkeypatch)
    meter = Meter(CudaGauge(torch.device("cuda", 0)))
    mem.set(1000, 2048)
    a = meter.start()
    mem.set(1300, 2048)  # the model computes

    def settles(_device: Any = None) -> None:
        raise AssertionError("the loader's readings must not wait for the model's compute")

    def copy() -> int:
        mem.set(1300 + 1024, 2048 + 1024)  # a tensor of 1024 bytes arrives
        return 1024

    monkeypatch.setattr(torch.cuda, "synchronize", settles)
    assert meter.moved_in(copy) == 1024
    monkeypatch.setattr(torch.cuda, "synchronize", lambda _device=None: None)
    mem.set(1000 + 1024, 2048 + 1024)
    assert meter.stop(a) == 300


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
    handle = _install(model, state, state.blocks, None, lambda s: DeviceBackend(s, sim, torch.device("cpu")))
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
