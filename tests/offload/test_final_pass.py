"""final_pass() stages nothing past the last block: the engine's look-ahead and a device's copies
ahead stop at the end of the order instead of wrapping into the first blocks, whose memory the
pass has just given back."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

import trash_panda as tp
from support.models import Tiny, on_meta, save
from support.simdevice import SimulatedDevice
from trash_panda import Tier, _core
from trash_panda.offload.backends.copies import SlotCopies
from trash_panda.offload.backends.cuda import DeviceBackend
from trash_panda.offload.handle import _install
from trash_panda.offload.state import ModelState, get_state

LAYERS = 8  # block 0 resident, 7 streamed through 3 staging buffers
IDS = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(3))


def _loaded(tmp_path: Path, gpu: bool) -> tuple[Tiny, Tiny]:
    torch.manual_seed(0)
    dtype = torch.bfloat16 if gpu else torch.float32
    ref = Tiny(dim=64, layers=LAYERS).to(dtype).eval()
    path = save(ref, tmp_path / "m.safetensors", dtype)
    model: Any = on_meta(Tiny, dim=64, layers=LAYERS)
    # A GPU plan is computed on the CPU through the simulated device.
    where: dict[str, Any] = {"vram": "1TB"} if gpu else {"device": "cpu"}
    p = tp.plan(model, path, ram="1TB", resident_blocks=1, lookahead=2, **where)
    if gpu:
        p.assign(Tier.DISK, indices=[5, 6, 7])
    tp.stream_load(model, path, plan=p, device="cpu")
    state = get_state(model)
    assert state is not None and state.engine is not None
    streamed = [b for b in state.blocks if b.engine_index is not None]
    assert len(streamed) == LAYERS - 1 > state.config.staging_buffers == 3
    return model, ref


def test_a_final_pass_on_the_cpu_stages_nothing_after_its_last_block(tmp_path: Path) -> None:
    model, ref = _loaded(tmp_path, gpu=False)
    state = get_state(model)
    assert state is not None and state.engine is not None
    engine = state.engine
    handle = tp.install_offload(model)
    with torch.no_grad():
        want = ref(IDS)
        # A pass that is not the last stages the first blocks for the next one after its end.
        assert torch.equal(model(IDS), want)
        assert engine.wait_idle(5.0)
        skip, opened = len(engine.stagings()), _core.clock()
        with handle.final_pass():
            assert torch.equal(model(IDS), want)
            assert engine.wait_idle(5.0)
        assert engine.wait_idle(5.0)
    staged = engine.stagings()[skip:]
    by_engine = {b.index: b.engine_index for b in state.blocks}
    ended = {by_engine[i]: end for i, start, end, _t in handle.runs if start >= opened and by_engine[i] is not None}
    assert set(ended) == set(engine.order())
    counts = Counter(s.block for s in staged)
    assert max(counts.values()) == 1, counts
    # Each block staged in the final pass was staged for its run, not after it.
    late = [(s.block, s.start - ended[s.block]) for s in staged if s.start >= ended[s.block]]
    assert not late, f"staged after their run in the final pass: {late}"
    # Closed, the pass lets the window wrap again (kept blocks prefetch as usual).
    order = engine.order()
    assert engine.next_blocks(order[-1]) == order[:2]
    tp.release(model, handle)


@pytest.mark.parametrize("in_memory", [False, True])
def test_a_final_pass_on_a_device_copies_nothing_after_its_last_block(
    tmp_path: Path, sim: SimulatedDevice, monkeypatch: pytest.MonkeyPatch, in_memory: bool
) -> None:
    if in_memory:  # RAM-tier blocks are copied from private memory, not staged by the engine
        monkeypatch.setenv("TRASH_PANDA_RAM_IN_MEMORY", "1")
    model, ref = _loaded(tmp_path, gpu=True)
    state = get_state(model)
    assert state is not None and state.engine is not None
    engine = state.engine
    images = [b for b in range(len(engine.order())) if engine.ram_image(b) is not None]
    assert bool(images) == in_memory
    events: list[tuple[str, int]] = []  # ("copy", block) as queued, ("ran", block) after its run
    queue = SlotCopies._queue

    def recorded(self: SlotCopies, block: int, lease: Any, slot: int) -> Any:
        events.append(("copy", block))
        return queue(self, block, lease, slot)

    monkeypatch.setattr(SlotCopies, "_queue", recorded)

    def backend(s: ModelState) -> DeviceBackend:
        return DeviceBackend(s, sim)

    handle = _install(model, state, state.blocks, None, backend)
    streamed = [b for b in state.blocks if b.engine_index is not None]
    for b in streamed:
        b.module.register_forward_hook(lambda *_, i=b.engine_index: events.append(("ran", i)))

    # Before the last block runs, the workers finish what the window queued: a window wrapped
    # into the first blocks has them staged, ready for the last block's copies ahead.
    def settle(*_: Any) -> None:
        assert engine.wait_idle(5.0)

    streamed[-2].module.register_forward_hook(settle)
    with torch.no_grad():
        want = ref(IDS)
        assert torch.equal(model(IDS), want)
        events.clear()
        with handle.final_pass():
            assert torch.equal(model(IDS), want)
    tp.release(model, handle)
    copies = [b for kind, b in events if kind == "copy"]
    assert len(copies) == len(set(copies)), copies
    ran: set[int] = set()
    for kind, b in events:
        if kind == "ran":
            ran.add(b)
        else:
            assert b not in ran, f"block {b} copied to the device after its run in the final pass: {events}"
    assert ran == set(range(len(streamed)))
