"""The device bookkeeping (slots, copies in flight, leases) proven on a simulated asynchronous
device: outputs equal the reference with several copies in flight, and removing any one of the
waits the bookkeeping relies on makes them differ."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import trash_panda as tp
from models import Tiny, on_meta, save
from simdevice import SimulatedDevice
from trash_panda import Tier
from trash_panda.offload import device as device_mod
from trash_panda.offload.cuda import DeviceBackend
from trash_panda.offload.hooks import _install
from trash_panda.offload.state import ModelState, get_state

LAYERS = 8


def _loaded(tmp_path: Path, lookahead: int) -> tuple[Tiny, Tiny]:
    torch.manual_seed(0)
    ref = Tiny(dim=64, layers=LAYERS).to(torch.bfloat16).eval()
    path = save(ref, tmp_path / "m.safetensors", torch.bfloat16)
    model = on_meta(Tiny, dim=64, layers=LAYERS)
    # A GPU plan (device slots, 512-byte alignment), computed on the CPU through the simulation.
    p = tp.plan(model, path, vram="1TB", ram="1TB", resident_blocks=1, lookahead=lookahead)
    p.assign(Tier.DISK, indices=[5, 6, 7])
    tp.stream_load(model, path, plan=p, device="cpu")
    return model, ref


def _run(model: Tiny, ref: Tiny, sim: SimulatedDevice, passes: int = 3, inference: bool = False) -> list[bool]:
    state = get_state(model)
    assert state is not None

    def backend(s: ModelState) -> DeviceBackend:
        return DeviceBackend(s, sim, torch.device("cpu"))

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
    monkeypatch.setattr(device_mod.CopyPipeline, "_may_return", lambda self, copy: True)
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
    monkeypatch.setattr(device_mod.CopyPipeline, "_free_slot", lambda self: 0)
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
        return DeviceBackend(s, sim, torch.device("cpu"))

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
