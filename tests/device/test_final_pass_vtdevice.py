"""Stage k's final pass on a device that runs ahead in virtual time (vtdevice.py), and stage k+1
read into the memory it frees by the real handover: stage k's feeder (``LoadedStage.feed``) takes
the pass's FreedBlock events and hands their bytes to stage k+1's allowance, and stage k+1's
loader (``load_stage(ahead=True)``) reads its blocks as the bytes arrive.

Each block of stage k queues its kernels on the device and the host frees it at once and goes on:
the block's memory is still read until those kernels end, at their virtual time, which its event
marks. Proven: (a) no write of stage k+1 lands in a freed block's memory before that block's
event (the device records one that would, at its virtual moment); (b) the host's time of the pass
is what it is without a feeder (the feeder's waits are its own, and hold it in real time until
the pass has ended); (c) stage k+1's weights are its checkpoint's bits, fp8 kept in fp8.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

import trash_panda as tp
from conftest import bits
from support.checkpoints import fp8_checkpoint, reference
from support.models import Tiny, on_meta, save
from support.vtdevice import EPS, VirtualDevice
from trash_panda import _core
from trash_panda.offload import final_pass as final_pass_mod
from trash_panda.offload import outside, overlap
from trash_panda.offload.backends.cuda import DeviceBackend
from trash_panda.offload.final_pass import final_pass
from trash_panda.offload.handle import OffloadHandle, _install
from trash_panda.offload.state import ModelState, get_state
from trash_panda.pipeline.loaded import LoadedStage, load_stage

K_LAYERS = 4  # bf16: about 265 kB freed, more than stage k+1's six fp8 blocks (about 205 kB)
COMPUTE_S = 0.004  # each block's kernels
IDS = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(3))


@dataclass
class _Freed:
    name: str
    reusable: float  # when the last kernels reading it end
    left: int  # bytes not written yet


class HandoverDevice(VirtualDevice):
    """The virtual device with the memory a final pass frees and the next stage fills.

    A block's memory is read by its kernels until they end. Freed, it joins the free memory in
    the order it was freed, and the next stage's writes fill that memory in that order (the
    allocator's reuse, simplified to first freed, first filled). A write lands at the writing
    thread's clock, and no earlier than the hand-over of its bytes (the allowance it took them
    from: a take is served once the bytes handed over reach what was taken). The rule, checked
    at the write's virtual moment: it never lands in memory that queued kernels still read."""

    def __init__(self) -> None:
        # The tiny blocks stand for blocks of about 1 GB; nothing here is copied over the link.
        super().__init__(link_bps=50e9, scale=15_000.0)
        self._lock = threading.Lock()  # the host, the feeder and the loader call in
        self.reading: dict[str, float] = {}  # a held block -> the end of its last kernels
        self.free_list: deque[_Freed] = deque()
        self.freed: list[tuple[str, int]] = []  # (what, bytes), in the order it was freed
        self.handed: list[tuple[float, int]] = []  # (when, bytes handed over by then)
        self.written = 0
        self.writes: dict[str, float] = {}  # what the next stage wrote -> when
        # Cleared: another thread's waits also hold it in real time until set, so a host
        # that waited for that thread would never end its pass.
        self.let_go = threading.Event()
        self.let_go.set()

    def wait(self, event: Any) -> None:
        if threading.get_ident() != self.host and not self.let_go.wait(60):
            self._broken("a thread's wait was held for a minute: the host waits for it")
        super().wait(event)

    def run_block(self, name: str, seconds: float) -> None:
        end = self.run_compute(seconds, block=name).end
        with self._lock:
            self.reading[name] = end

    def free(self, name: str, nbytes: int) -> None:
        with self._lock:
            self.free_list.append(_Freed(name, self.reading.pop(name, 0.0), nbytes))
            self.freed.append((name, nbytes))

    def hand_over(self, nbytes: int) -> None:
        with self._lock:
            total = (self.handed[-1][1] if self.handed else 0) + nbytes
            self.handed.append((self.clock(), total))

    def fill(self, what: str, nbytes: int) -> None:
        with self._lock:
            end = self.written + nbytes
            handed = next((t for t, total in self.handed if total >= end), None)
            if handed is None:
                self._broken(f"{what} written into {nbytes} bytes nobody handed over")
            at = max(self.clock(), handed or 0.0)
            self.move_clock(at)
            left = nbytes
            while left and self.free_list:
                region = self.free_list[0]
                if region.reusable > at + EPS:
                    self._broken(
                        f"{what} written at {at:.6f} s into the memory of {region.name}, "
                        f"which its kernels read until {region.reusable:.6f} s"
                    )
                took = min(left, region.left)
                region.left -= took
                left -= took
                if not region.left:
                    self.free_list.popleft()
            if left:
                self._broken(f"{what} written into {left} bytes more than were freed")
            self.written = end
            self.writes[what] = at


class Watched:
    """The next stage's allowance as the feeder gives to it: the device notes each hand-over
    at the giving thread's clock, before the bytes can be taken."""

    def __init__(self, allowance: _core.Allowance, dev: HandoverDevice) -> None:
        self.allowance, self.dev = allowance, dev

    def give(self, nbytes: int) -> None:
        self.dev.hand_over(nbytes)
        self.allowance.give(nbytes)


def _running(tmp_path: Path, dev: HandoverDevice) -> tuple[Tiny, OffloadHandle, LoadedStage]:
    """Stage k: every block resident (what a final pass frees), hooked to the device; each
    block queues its kernels there and the host goes on."""
    torch.manual_seed(0)
    ref = Tiny(layers=K_LAYERS).to(torch.bfloat16).eval()
    path = save(ref, tmp_path / "k.safetensors", torch.bfloat16)
    model: Any = on_meta(Tiny, layers=K_LAYERS)
    p = tp.plan(model, path, vram="1TB", ram="1TB", resident_blocks=K_LAYERS)
    tp.stream_load(model, path, plan=p, device="cpu")
    state = get_state(model)
    assert state is not None and all(b.engine_index is None for b in state.blocks)

    def backend(s: ModelState) -> DeviceBackend:
        return DeviceBackend(s, dev)

    handle = _install(model, state, state.blocks, None, backend)
    for b in state.blocks:
        b.module.register_forward_pre_hook(lambda *_, name=b.prefix: dev.run_block(name, COMPUTE_S))
    stage = LoadedStage("k", model, p, handle, None, _core.Holds(0, 0), _core.Free(0, 0), None)  # type: ignore[arg-type]
    return ref, handle, stage


_FREE = final_pass_mod._free


def _watch_frees(monkeypatch: pytest.MonkeyPatch, dev: HandoverDevice) -> None:
    def freed(state: Any, block: Any, keep_cache: bool, retire: Any) -> int:
        n = _FREE(state, block, keep_cache, retire)
        dev.free(block.prefix, n)
        return n

    monkeypatch.setattr(final_pass_mod, "_free", freed)


def _pass_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> float:
    """The host's clock at the end of stage k's final pass with no feeder and no next stage."""
    dev = HandoverDevice()
    tmp_path.mkdir()
    with monkeypatch.context() as m:
        _watch_frees(m, dev)
        ref, handle, _running_stage = _running(tmp_path, dev)
        with torch.no_grad(), final_pass(handle):
            assert torch.equal(handle.model(IDS), ref(IDS))
            host = dev.now
    tp.release(handle.model, handle)
    return host


@dataclass
class HandedOver:
    dev: HandoverDevice
    host: float  # the host's clock at the end of stage k's pass
    running: LoadedStage  # stage k
    nxt: LoadedStage  # stage k+1, read
    nxt_path: Path
    expected: Tiny  # stage k+1's reference expansion
    costs: dict[tuple[str, int], int]  # its loader's reads, by what it takes from the allowance


def _hand_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> HandedOver:
    """Stage k's final pass with its feeder; stage k+1 read ahead into what it frees."""
    dev = HandoverDevice()
    _watch_frees(monkeypatch, dev)
    ref, handle, running = _running(tmp_path, dev)

    nxt_path = tmp_path / "next.safetensors"
    expected = fp8_checkpoint(reference(torch.float32), nxt_path)
    nxt_model = on_meta(Tiny)
    p = tp.plan(nxt_model, nxt_path, vram="1TB", ram="1TB", resident_blocks=6)
    # Where a read lands is the device's to say: each of the loader's reads fills the bytes
    # it took from the allowance.
    costs: dict[tuple[str, int], int] = {}
    load, load_out = overlap.load_block, outside.load_outside

    def load_block(block: Any, *a: Any, **k: Any) -> None:
        dev.fill(block.prefix, costs[("block", block.index)])
        load(block, *a, **k)

    def load_outside(*a: Any, **k: Any) -> None:
        dev.fill("outside weights", costs[("outside", 0)])
        load_out(*a, **k)

    with overlap.reading_with(block=load_block, outside=load_outside):  # the loader keeps them
        nxt = load_stage(
            "next", nxt_model, tp.Checkpoint(nxt_path), p, _core.Free(0, 0),
            device=torch.device("cpu"), order=None, destination=None, shared={}, key="", ahead=True,
        )  # fmt: skip
    assert nxt.loader is not None and nxt.allowance is not None
    costs.update(nxt.loader.costs)
    watched = Watched(nxt.allowance, dev)
    # Its weights outside the blocks go into the memory free before the pass.
    dev.free("memory free before the pass", costs[("outside", 0)])
    watched.give(costs[("outside", 0)])

    dev.let_go.clear()  # the feeder's waits hold it until the pass has ended
    with torch.no_grad(), final_pass(handle) as fp:
        running.feed(fp, watched)  # type: ignore[arg-type]
        assert torch.equal(handle.model(IDS), ref(IDS))
        host = dev.now
    dev.let_go.set()
    running.stop_feeding()
    deadline = time.monotonic() + 60  # guards against a hang; nothing asserts a time
    while not nxt.loader.done:
        assert time.monotonic() < deadline, f"the loader still waits: {nxt.allowance!r}, {dev.violations[:3]}"
        time.sleep(0.005)
    tp.release(handle.model, handle)
    return HandedOver(dev, host, running, nxt, nxt_path, expected, costs)


def test_the_next_stage_is_read_into_freed_memory_only_after_each_block_s_kernels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = _hand_over(tmp_path, monkeypatch)
    dev, nxt, costs = r.dev, r.nxt, r.costs
    assert nxt.allowance is not None and not nxt.allowance.is_open  # read into what the pass freed alone

    # (a) Each block was written only into memory whose kernels had ended: the first while
    # stage k's kernels still ran, the last into stage k's last block.
    assert dev.violations == []
    blocks = [b.prefix for b in nxt.state.blocks]
    assert set(blocks) <= set(dev.writes)
    sizes = [n for name, n in dev.freed if name != "memory free before the pass"]
    assert len(sizes) == K_LAYERS and r.running.freed == sum(sizes) == dev.handed[-1][1] - costs[("outside", 0)]
    assert sum(costs.values()) > dev.handed[-1][1] - sizes[-1], "the test needs the last block's memory"
    assert dev.writes[blocks[0]] < dev.compute_free <= dev.writes[blocks[-1]] + EPS

    # (b) The host queued every block and went on, its feeder held meanwhile: its time is the
    # pass's without a feeder, less than one block's kernels.
    assert r.host == _pass_alone(tmp_path / "alone", monkeypatch) < COMPUTE_S

    # (c) Its weights are its checkpoint's bits, fp8 still fp8 (expanded only when run).
    want = load_file(str(r.nxt_path))
    stored = {}
    for b in nxt.state.blocks:
        for spec in b.tensors:
            stored[spec.info.name] = spec.resident if spec.resident is not None else spec.held()
            if spec.resident_scale is not None:
                assert spec.scale is not None
                stored[spec.scale.name] = spec.resident_scale
    assert {n for n in want if n.startswith("blocks.")} == set(stored)
    for name, t in stored.items():
        assert t.dtype == want[name].dtype and torch.equal(bits(t), bits(want[name])), name
    assert sum(t.dtype == torch.float8_e4m3fn for t in stored.values()) == 12
    nxt.allowance.open()
    with torch.no_grad():
        assert torch.equal(nxt.model(IDS), r.expected(IDS))
    nxt.close()
    tp.release(nxt.model, nxt.handle)


def test_a_feeder_that_does_not_wait_for_the_event_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The device catches the hand-over the issue forbids: the events' waits return at once, so
    the feeder hands a block's memory over while its kernels are queued."""
    from trash_panda.offload import final_pass

    monkeypatch.setattr(final_pass._Done, "synchronize", lambda self: None)
    r = _hand_over(tmp_path, monkeypatch)
    early = [v for v in r.dev.violations if "blocks.0., which its kernels read until" in v]
    assert early, r.dev.violations[:3]
    r.nxt.close()
    tp.release(r.nxt.model, r.nxt.handle)
