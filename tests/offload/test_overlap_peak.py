"""stage(overlap=True) remembers its peak without the weights its loader put on the device while
the block ran: the same figure as a stage without overlap, which the next plan of the key uses.

The device memory here is simulated where the figures must be exact: the CPU meter reads a
counter that the loaded tensors and the blocks' activations move (a tensor's bytes are there
from the start of its read, as on CUDA, where a tensor is allocated before it is copied in). The
last test measures the real private memory."""

from __future__ import annotations

import gc
import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import trash_panda as tp
from conftest import ReadsWith
from support.models import Tiny, on_meta, save
from trash_panda import _core
from trash_panda.offload import meter, outside, overlap
from trash_panda.offload import reads as reads_mod
from trash_panda.offload.meter import Meter
from trash_panda.options import remembered_activation

IDS = torch.randint(0, 100, (3, 11), generator=torch.Generator().manual_seed(5))
# The activation memory of each of the six blocks while it runs: the peak is block 1's.
ACT = [30_000, 70_000, 20_000, 50_000, 40_000, 10_000]
RESIDENT = 3  # blocks 0-2 are read by the loader; block 0 before the stage's block opens


class DeviceMemory:
    """A device's memory counter, moved by hand: one peak for the whole device, as torch's."""

    exact = True  # each tensor counted at its bytes, as torch's allocator counts them

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.top = 0
        self.highest = 0  # never reset by the meter: what a window would see without subtraction

    def add(self, n: int) -> None:
        with self.lock:
            self.now += n
            self.top = max(self.top, self.now)
            self.highest = max(self.highest, self.now)

    def current(self) -> int:
        return self.now

    def peak(self, settle: bool = True) -> int:
        with self.lock:
            return self.top

    def reset(self, settle: bool = True) -> None:
        with self.lock:
            self.top = self.now

    def close(self) -> None:
        pass


def block_bytes(ref: Tiny) -> int:
    return sum(p.nbytes for p in ref.blocks[0].parameters())


@pytest.fixture
def memory(monkeypatch: pytest.MonkeyPatch) -> DeviceMemory:
    """The CPU meter reads a DeviceMemory; the stage's peaks start empty."""
    mem = DeviceMemory()
    monkeypatch.setitem(meter._METERS, "cpu", Meter(mem))
    monkeypatch.setattr(sys.modules["trash_panda.options"], "_PEAKS", {})
    return mem


def build() -> Tiny:
    return on_meta(Tiny)  # type: ignore[return-value]


def activations(model: Tiny, mem: DeviceMemory, during: dict[int, Callable[[str], None]] | None = None) -> None:
    """Each block holds ACT[i] bytes while it runs; ``during[i]("in")`` runs once they are taken,
    ``during[i]("out")`` once they are given back."""
    during = during or {}
    for i, b in enumerate(model.blocks):  # after the offload hooks: the block's weights are there

        def pre(_m: Any, _a: Any, i: int = i) -> None:
            mem.add(ACT[i])
            if i in during:
                during[i]("in")

        def post(_m: Any, _a: Any, _o: Any, i: int = i) -> None:
            mem.add(-ACT[i])
            if i in during:
                during[i]("out")

        b.register_forward_pre_hook(pre)
        b.register_forward_hook(post)


class Loader:
    """The loader's functions wrapped: each tensor's bytes go on the counter when its read starts
    (a block's tensors are read together, into memory allocated before the read);
    the first block is read before the stage's block opens, the others each wait for their
    gate."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, reads: ReadsWith, mem: DeviceMemory, ref: Tiny) -> None:
        self.gates = {f"blocks.{i}.": threading.Event() for i in range(1, RESIDENT)}
        self.loader: overlap.ResidentLoader | None = None
        read, read_many, start = overlap.load_block, reads_mod.read_many, overlap.start_loader
        sizes = {name: p.nbytes for name, p in ref.named_parameters()}

        def load_block(block: Any, *args: Any) -> None:
            gate = self.gates.get(block.prefix)
            if gate is not None:
                assert gate.wait(10)
            read(block, *args)

        def read_counted(infos: list[Any], *args: Any, **kwargs: Any) -> Any:
            for info in infos:
                mem.add(sizes[info.name])
            return read_many(infos, *args, **kwargs)

        def start_loader(handle: Any, *args: Any, **kwargs: Any) -> Any:
            loader = start(handle, *args, **kwargs)
            self.loader = handle.state.loader
            assert self.loader.ready[0].wait(10)  # blocks.0. landed before the window opened
            # The final norm and the head, which the order file places after the last block,
            # land when the norm is first called (before its wait for them), once every block's
            # activations are given back: the peaks below stay the blocks'.
            handle.model.norm.register_forward_pre_hook(lambda _m, _a: self.outside_gate.set(), prepend=True)
            return loader

        self.outside_gate = threading.Event()
        load_outside = outside.load_outside  # its reads are counted by read_counted, as the blocks'

        def load_outside_gated(
            specs: list[Any], device: Any, threads: int, queue: Any = None, position: Any = None, copies: Any = None
        ) -> None:
            if position is not None:  # on the loader
                assert self.outside_gate.wait(10)
            load_outside(specs, device, threads, queue, position, copies)

        reads(block=load_block, outside=load_outside_gated)
        monkeypatch.setattr(reads_mod, "read_many", read_counted)
        monkeypatch.setattr(overlap, "start_loader", start_loader)

    def open_all(self) -> None:
        for gate in self.gates.values():
            gate.set()

    def wait(self, index: int) -> None:
        assert self.loader is not None and self.loader.ready[index].wait(10)


def plain_peak(path: Path, ref: Tiny, mem: DeviceMemory) -> int:
    with tp.stage(build, path, device="cpu", key="plain", resident_blocks=RESIDENT) as (model, _p, _h):
        activations(model, mem)
        with torch.no_grad():
            assert torch.equal(model(IDS), ref(IDS))
    peak = remembered_activation("plain")
    assert peak == max(ACT)
    return peak


def test_the_overlap_peak_is_remembered_and_used_by_the_next_plan(
    loader_reads: ReadsWith, tiny: tuple[Path, Tiny], memory: DeviceMemory, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, ref = tiny
    plain = plain_peak(path, ref, memory)
    nbytes = block_bytes(ref)
    loads = Loader(monkeypatch, loader_reads, memory, ref)
    with tp.stage(build, path, device="cpu", key="lap", resident_blocks=RESIDENT, overlap=True) as (model, p, _h):
        assert p.budgets is not None and not p.budgets.reserve_measured  # nothing remembered yet
        assert memory.now == nbytes  # blocks.0. is in the window's baseline
        base = memory.highest = memory.now
        loads.open_all()
        for i in range(1, RESIDENT):
            loads.wait(i)  # the other two land inside the window
        activations(model, memory)
        with torch.no_grad():
            assert torch.equal(model(IDS), ref(IDS))  # bit for bit
        seen = memory.highest - base
    got = remembered_activation("lap")
    assert got == plain
    # What the window saw: the two blocks it loaded on top of the activations. Subtracting
    # blocks.0., loaded before the window, as well would leave plain - nbytes.
    assert seen == plain + (RESIDENT - 1) * nbytes
    # The next plan of the key keeps what was remembered free, not the default headroom.
    with tp.stage(build, path, device="cpu", key="lap", resident_blocks=RESIDENT, overlap=True) as (model, p, _h):
        assert json.loads(p.to_json())["options"]["activation_vram"] == got
        assert p.budgets is not None and p.budgets.reserve_measured and p.budgets.reserve == got
        loads.open_all()
        with torch.no_grad():
            assert torch.equal(model(IDS), ref(IDS))


def test_blocks_that_land_while_the_model_runs_are_not_counted(
    loader_reads: ReadsWith, tiny: tuple[Path, Tiny], memory: DeviceMemory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """blocks.1. lands while blocks.0.'s activations are held, and blocks.2. after the peak
    (blocks.1.'s activations): restarting the measurement once the loader is done would lose the
    peak, subtracting every block loaded in the window would take blocks.2. off it as well, and
    reading the peak before moving the baseline by a block that landed would count the block."""
    path, ref = tiny
    plain = plain_peak(path, ref, memory)
    nbytes = block_bytes(ref)
    loads = Loader(monkeypatch, loader_reads, memory, ref)

    def block_0(when: str) -> None:
        if when == "in":
            loads.gates["blocks.1."].set()
            loads.wait(1)

    def block_1(when: str) -> None:
        if when == "out":
            loads.gates["blocks.2."].set()
            loads.wait(2)

    with tp.stage(build, path, device="cpu", key="lap", resident_blocks=RESIDENT, overlap=True) as (model, _p, _h):
        base = memory.highest = memory.now
        activations(model, memory, {0: block_0, 1: block_1})
        with torch.no_grad():
            assert torch.equal(model(IDS), ref(IDS))
        seen = memory.highest - base
    assert remembered_activation("lap") == plain
    assert seen == max(ACT[0] + nbytes, ACT[1] + nbytes, max(ACT[2:]) + 2 * nbytes)


def test_the_private_memory_peak_of_an_overlapped_stage_is_the_plain_one(
    loader_reads: ReadsWith, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real meter on the CPU: five blocks of 32 MB are read while the model runs, and the
    peak remembered is the plain stage's, not 160 MB more."""
    torch.manual_seed(0)
    ref = Tiny(dim=1024, layers=6).eval()
    path = save(ref, tmp_path / "m.safetensors")
    ids = torch.randint(0, 100, (4, 256), generator=torch.Generator().manual_seed(1))  # about 40 MB
    want = ref(ids).detach()
    loaded = 5 * block_bytes(ref)  # blocks.1. to blocks.5., read inside the stage's block
    monkeypatch.setattr(sys.modules["trash_panda.options"], "_PEAKS", {})
    read = overlap.load_block

    def build_big() -> Tiny:
        return on_meta(Tiny, dim=1024, layers=6)  # type: ignore[return-value]

    for _ in range(2):
        gc.collect()
        _core.trim_heap()
        with tp.stage(build_big, path, device="cpu", key="plain", resident_blocks=6) as (m, _p, _h), torch.no_grad():
            assert torch.equal(m(ids), want)
        gate = threading.Event()

        def load_block(block: Any, *args: Any, gate: threading.Event = gate) -> None:
            if block.prefix != "blocks.0.":
                assert gate.wait(10)
            read(block, *args)

        loader_reads(block=load_block)
        gc.collect()
        _core.trim_heap()
        with tp.stage(build_big, path, device="cpu", key="lap", resident_blocks=6, overlap=True) as (m, _p, _h):
            gate.set()
            with torch.no_grad():
                assert torch.equal(m(ids), want)
        plain, lap = remembered_activation("plain"), remembered_activation("lap")
        assert plain is not None and lap is not None
        # Private memory is not exact: the heap keeps some of what a run freed, and two runs of
        # the same stage differ by tens of MB here, the loaded weights by 168 MB.
        assert abs(lap - plain) < loaded / 2, (plain, lap, loaded)
