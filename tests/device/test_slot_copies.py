"""The device bookkeeping (slots, copies in flight, leases) proven on the simulated devices with
the real engine: on the threaded one, outputs equal the reference with several copies in flight,
and removing any one of the waits the bookkeeping relies on makes them differ; on the one that
runs ahead in virtual time as CUDA does (vtdevice.py), outputs equal the reference and no rule is
broken at any virtual moment. The schedule's timing is tests/device/test_copy_schedule.py's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import trash_panda as tp
from support.models import Tiny, on_meta, save
from support.simdevice import SimulatedDevice
from support.vtdevice import VirtualDevice
from trash_panda import Tier
from trash_panda.offload.backends import copies as device_mod
from trash_panda.offload.backends.cuda import DeviceBackend
from trash_panda.offload.handle import _install
from trash_panda.offload.state import ModelState, get_state

LAYERS = 8


def _loaded(tmp_path: Path, lookahead: int, resident: int = 1, disk: tuple[int, ...] = (5, 6, 7)) -> tuple[Tiny, Tiny]:
    torch.manual_seed(0)
    ref = Tiny(dim=64, layers=LAYERS).to(torch.bfloat16).eval()
    path = save(ref, tmp_path / "m.safetensors", torch.bfloat16)
    model = on_meta(Tiny, dim=64, layers=LAYERS)
    # A GPU plan (device slots, 512-byte alignment), computed on the CPU through the simulation.
    p = tp.plan(model, path, vram="1TB", ram="1TB", resident_blocks=resident, lookahead=lookahead)
    p.assign(Tier.DISK, indices=list(disk))
    tp.stream_load(model, path, plan=p, device="cpu")
    return model, ref


def _run(model: Tiny, ref: Tiny, sim: SimulatedDevice, passes: int = 3, inference: bool = False) -> list[bool]:
    state = get_state(model)
    assert state is not None

    def backend(s: ModelState) -> DeviceBackend:
        return DeviceBackend(s, sim)

    handle = _install(model, state, state.blocks, None, backend)
    x = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(3))
    same = []
    with torch.inference_mode() if inference else torch.no_grad():
        want = ref(x)
        for _ in range(passes):
            same.append(torch.equal(model(x), want))
    tp.release(model, handle)
    return same


@pytest.mark.parametrize("lookahead", [1, 2, 3])
def test_copies_in_flight_give_the_reference(tmp_path: Path, sim: SimulatedDevice, lookahead: int) -> None:
    model, ref = _loaded(tmp_path, lookahead)
    assert _run(model, ref, sim) == [True] * 3
    assert sim.copied >= 3 * (LAYERS - 1)


def test_under_inference_mode(tmp_path: Path, sim: SimulatedDevice) -> None:
    model, ref = _loaded(tmp_path, 2)
    assert all(_run(model, ref, sim, inference=True))


def test_returning_a_lease_before_its_copy_completed_is_caught(
    tmp_path: Path, sim: SimulatedDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, ref = _loaded(tmp_path, 2)
    sim.max_delay = 0.02
    monkeypatch.setattr(device_mod.SlotCopies, "_may_return", lambda self, copy: True)
    assert not all(_run(model, ref, sim))


def test_computing_before_the_copy_completed_is_caught(
    tmp_path: Path, sim: SimulatedDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, ref = _loaded(tmp_path, 2)
    sim.max_delay = 0.02
    monkeypatch.setattr(SimulatedDevice, "compute_waits", lambda self, event: None)
    assert not all(_run(model, ref, sim))


def test_refilling_a_slot_whose_block_runs_is_caught(
    tmp_path: Path, sim: SimulatedDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, ref = _loaded(tmp_path, 2)
    # Slot choice that forgets which slots are held: always the first.
    monkeypatch.setattr(device_mod.SlotCopies, "_free_slot", lambda self: 0)
    assert not all(_run(model, ref, sim))


def test_a_gpu_plan_stages_every_tensor_for_use_in_place(tmp_path: Path) -> None:
    """On a GPU every staged tensor starts at a 512-byte offset, the caching allocator's own
    alignment, so a bf16 block computing in bf16 is used in place in its slot: no expansion."""
    model, _ref = _loaded(tmp_path, 2)
    state = get_state(model)
    assert state is not None and state.engine is not None
    assert (state.config.gpu, state.config.align, state.config.expansion_bytes) == (True, 512, 0)
    for block in state.blocks:
        if block.engine_index is None:
            continue
        for staged in state.engine.layout(block.engine_index):
            assert staged.offset % 512 == 0 and staged.expand_at is None, staged.name
    tp.release(model)


def test_an_in_memory_ram_tier_is_copied_to_the_device_directly(
    tmp_path: Path, sim: SimulatedDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the RAM tier in private memory, its blocks go from there to the device slots: the
    engine stages none of them, and the outputs equal the reference."""
    monkeypatch.setenv("TRASH_PANDA_RAM_IN_MEMORY", "1")
    model, ref = _loaded(tmp_path, 2)
    state = get_state(model)
    assert state is not None and state.engine is not None and state.config.pin_ram_tier
    ram = [b.engine_index for b in state.blocks if b.tier == Tier.RAM]
    assert ram and all(state.engine.ram_image(i) is not None for i in ram)

    def backend(s: ModelState) -> DeviceBackend:
        return DeviceBackend(s, sim)

    handle = _install(model, state, state.blocks, None, backend)
    x = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = ref(x)
        for _ in range(3):
            assert torch.equal(model(x), want)
    stats = handle.stats()
    assert stats is not None
    assert stats.ram_bytes == 0, "a RAM-tier block went through a staging buffer"
    assert stats.disk_bytes > 0 and stats.acquires >= 3 * (LAYERS - 1)
    tp.release(model, handle)


def _run_ahead(model: Tiny, ref: Tiny, dev: VirtualDevice, passes: int = 3) -> list[bool]:
    """Passes on the device that runs ahead: each streamed block's kernels are queued on its
    compute stream once its weights are in their slot (a pre-hook added after the offload's runs
    after it), and the host goes on at once."""
    state = get_state(model)
    assert state is not None

    def backend(s: ModelState) -> DeviceBackend:
        return DeviceBackend(s, dev)

    def kernels(module: torch.nn.Module, _args: object) -> None:
        dev.run_compute(0.004, reads=next(module.parameters()))

    handle = _install(model, state, state.blocks, None, backend)
    queued = [b.module.register_forward_pre_hook(kernels) for b in state.blocks if b.engine_index is not None]
    x = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(3))
    same = []
    with torch.no_grad():
        want = ref(x)
        for _ in range(passes):
            same.append(torch.equal(model(x), want))
    for q in queued:
        q.remove()
    tp.release(model, handle)
    return same


def _virtual() -> VirtualDevice:
    # The tiny blocks stand for blocks of about 1 GB on a 50 GB/s link.
    return VirtualDevice(link_bps=50e9, scale=15_000.0)


@pytest.mark.parametrize(
    ("lookahead", "resident", "disk", "in_memory"),
    [
        (1, 1, (5, 6, 7), False),
        (2, 1, (5, 6, 7), False),
        (3, 1, (5, 6, 7), False),
        (2, 1, (5, 6, 7), True),  # the RAM tier copied to the device from pinned memory
        (3, 6, (6, 7), False),  # fewer streamed blocks than staging buffers
    ],
)
def test_the_real_engine_on_a_device_that_runs_ahead(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    lookahead: int,
    resident: int,
    disk: tuple[int, ...],
    in_memory: bool,
) -> None:
    if in_memory:
        monkeypatch.setenv("TRASH_PANDA_RAM_IN_MEMORY", "1")
    model, ref = _loaded(tmp_path, lookahead, resident, disk)
    dev = _virtual()
    assert _run_ahead(model, ref, dev) == [True] * 3
    assert dev.violations == []
    assert len(dev.computes) == 3 * (LAYERS - resident)
    assert dev.now > 3 * (LAYERS - resident) * 0.004  # the host waited for the device at the end


@pytest.mark.parametrize(
    ("broken", "symptom"),
    [
        ("_may_return", "returned to the engine while a copy reads it"),
        ("compute_waits", "the copy into it lands at"),
        # The device cannot tell which block a real engine staged: a later copy is what it sees.
        ("_free_slot", "the copy into it lands at"),
    ],
)
def test_breaking_a_rule_on_the_device_that_runs_ahead_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broken: str, symptom: str
) -> None:
    model, ref = _loaded(tmp_path, 2)
    if broken == "_may_return":
        monkeypatch.setattr(device_mod.SlotCopies, "_may_return", lambda self, copy: True)
    elif broken == "compute_waits":
        monkeypatch.setattr(VirtualDevice, "compute_waits", lambda self, event: None)
    else:
        monkeypatch.setattr(device_mod.SlotCopies, "_free_slot", lambda self: 0)
    dev = _virtual()
    same = _run_ahead(model, ref, dev)
    assert any(symptom in v for v in dev.violations), dev.violations[:3]
    if broken == "_free_slot":  # the bytes were overwritten before the block ran
        assert not all(same)
