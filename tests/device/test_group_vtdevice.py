"""Two experts of a group that take turns, on the virtual-time device (vtdevice.py), run by the
real pipeline runner: the second expert is read ahead while the first computes, into what the
budget has beside it (one expert and half of the other), and the first expert's last scheduled
call is a final pass whose freed blocks go to the second expert's remaining reads.

Proven: no access of device memory races another (the device records any); the second
expert's reads of what the final pass frees, and their copies, run during the first expert's
last step, each read once the kernels of the block that freed its bytes are done; each
expert's outputs are its reference's, bit for bit.

The device here has room for both: where it has not, a copy into memory the first expert freed
comes from the compute stream's pool and waits for everything queued there, so for the end of a
step whose blocks are all resident (loader_copies.py; tests/device/test_stream_order.py holds
that rule).
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import trash_panda as tp
from support.models import Tiny, on_meta, save
from support.vtdevice import VirtualDevice
from trash_panda.offload import handle as handle_mod
from trash_panda.offload import reads
from trash_panda.offload.backends.cuda import DeviceBackend
from trash_panda.pipeline.keeper import StageKeeper
from trash_panda.pipeline.loaded import LoadedStage

IDS = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(3))
LINK = 50e9
SCALE = 15_000.0  # the tiny blocks stand for blocks of about 1 GB
DRIVE = 2e9  # bytes/s the loader's reads take, in virtual time
KERNELS = 0.15  # seconds of kernels per block: a step (six blocks) takes about two reads of a block
STEPS = 3  # calls of each expert
EXPERTS = ["high", "low"]


def _expert(name: str, kernels: dict[str, list[Any]], dev: VirtualDevice) -> nn.Module:
    """The expert on meta, each block queueing its kernels on the device as it runs (reading
    its weights where the hooks left them)."""
    model = on_meta(Tiny, layers=6)

    def queue(module: nn.Module, _args: object) -> None:
        weights = [p for p in module.parameters() if not p.is_meta]
        kernels[name].append(dev.run_compute(KERNELS, reads=weights, what=f"{name} block"))

    for block in model.blocks:
        block.register_forward_pre_hook(queue)
    return model


def test_the_second_expert_is_read_while_the_first_computes_its_last_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refs, paths = {}, {}
    for i, name in enumerate(EXPERTS):
        torch.manual_seed(10 + i)
        refs[name] = Tiny(layers=6).to(torch.bfloat16).eval()
        paths[name] = save(refs[name], tmp_path / f"{name}.safetensors", torch.bfloat16)
    size = paths["high"].stat().st_size
    dev = VirtualDevice(LINK, scale=SCALE, poison=False)
    sides: list[str] = []
    side = dev.side

    def named_side() -> Any:
        made = side()
        sides.append(made.stream.name)  # type: ignore[attr-defined]
        return made

    # When the second expert's allowance was given each of its bytes, in virtual time: a read
    # of them starts no sooner (the allowance holds the loader's thread until then).
    handed: list[tuple[float, int]] = []
    read_log: list[tuple[int, float, float]] = []  # (thread, start, end) of each loader read
    read_by: dict[int, int] = {}  # bytes each loader thread read
    read_many = reads.read_many

    def timed_read(infos: list[Any], *args: Any, **kwargs: Any) -> Any:
        out = read_many(infos, *args, **kwargs)
        me = threading.get_ident()
        nbytes = sum(i.nbytes for i in infos)
        read_by[me] = read_by.get(me, 0) + nbytes
        start = dev.clock()
        if len(read_by) > 1 and me == list(read_by)[1]:  # the second expert's loader
            start = max([start, *(t for t, total in handed[:1] or [(0.0, 0)])])
            start = max(start, next((t for t, total in handed if total >= read_by[me]), start))
        dev.move_clock(start + nbytes * SCALE / DRIVE)
        read_log.append((me, start, dev.clock()))
        return out

    def noted(allowance: Any, at: float) -> None:
        if allowance is not None:
            handed.append((at, allowance.stats().given))

    give_now, feed, end = StageKeeper._give_now, LoadedStage.feed, StageKeeper.end

    def noted_give_now(self: StageKeeper, loaded: LoadedStage, running: LoadedStage) -> None:
        give_now(self, loaded, running)
        noted(loaded.allowance, dev.clock())

    class Fed:
        """The allowance as the feeder gives to it: each hand-over at the feeder's clock (once
        the freed block's kernels are done)."""

        def __init__(self, allowance: Any) -> None:
            self.allowance = allowance

        def give(self, nbytes: int) -> None:
            self.allowance.give(nbytes)
            noted(self.allowance, dev.clock())

    def noted_feed(self: LoadedStage, final: Any, to: Any) -> None:
        feed(self, final, Fed(to) if to is not None else None)

    def noted_end(self: StageKeeper, run: int, index: int, loaded: LoadedStage, *rest: Any) -> None:
        following = self.ahead_allowance(index)
        end(self, run, index, loaded, *rest)
        noted(following, dev.compute_free)  # what it gives at its end is free once its kernels are done

    monkeypatch.setattr(StageKeeper, "_give_now", noted_give_now)
    monkeypatch.setattr(LoadedStage, "feed", noted_feed)
    monkeypatch.setattr(StageKeeper, "end", noted_end)

    monkeypatch.setattr(dev, "side", named_side)
    monkeypatch.setattr(reads, "read_many", timed_read)
    monkeypatch.setattr(handle_mod, "make_backend", lambda s: DeviceBackend(s, dev))
    kernels: dict[str, list[Any]] = {n: [] for n in EXPERTS}
    options = {"min_free_ram": 0, "activation_vram": 0, "resident_blocks": 6}
    stages = [tp.Stage(n, functools.partial(_expert, n, kernels, dev), paths[n], options=options) for n in EXPERTS]
    # The RAM budget holds one expert and half of the other too: what the second reads beyond
    # that waits for the first one's final pass to free it.
    with tp.Pipeline(stages, groups=[tp.Group("experts", EXPERTS)], ram=size + size // 2) as pipe:
        with torch.no_grad(), pipe.run() as run, run.group("experts", schedule={"high": STEPS, "low": STEPS}) as m:
            for name in EXPERTS:
                for _ in range(STEPS):
                    assert torch.equal(m[name](IDS), refs[name](IDS))
        report = pipe.report()
    assert dev.violations == [], dev.violations[:3]
    high = next(r for r in pipe.records if r.stage == "high")
    assert high.given_back > 0 or high.departure == tp._core.Departure.FINAL_PASS, report

    # The first expert's last step: its last six blocks' kernels.
    last = kernels["high"][-6:]
    last_start, last_end = last[0].start, last[-1].end
    # The second expert's loader copies go on a stream of their own, made after the first's.
    assert len(sides) >= 2, sides
    low_copies = [c for c in dev.copies if c.stream in sides[1:]]
    # Its loader (the second thread that read) read what the final pass freed during that
    # step, and copied it then.
    threads = list(dict.fromkeys(t for t, _, _ in read_log))
    assert len(threads) == 2, threads
    low_reads = [(a, b) for t, a, b in read_log if t == threads[1]]
    in_last = [(a, b) for a, b in low_reads if last_start <= a < last_end]
    assert in_last, (
        f"no read of the second expert during the first's last step ({last_start:.3f}-{last_end:.3f} s): "
        f"{[(round(a, 3), round(b, 3)) for a, b in low_reads]}"
    )
    assert any(last_start <= c.start.t < last_end for c in low_copies), "no copy during the last step"
    # Before that step, it read only what the budget had beside the first expert.
    before = [(a, b) for a, b in low_reads if a < last_start]
    assert before and len(before) < len(low_reads)
    # Its first kernels ran once its copies were in, after the first expert's.
    assert kernels["low"][0].start >= last_end - 1e-9
