"""Reading ahead only where it pays: the running stage's ``pace`` hook weighs the compute the
next stage's reads cost it against what they take alone, and pauses the read-ahead (its
allowance held) where they cost more; what was not read ahead is read at the stage's start."""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import trash_panda as tp
from conftest import ReadsWith
from support.models import Tiny, on_meta, save
from trash_panda import _core
from trash_panda.offload import overlap
from trash_panda.pipeline.pace import Pacer, Rates


@dataclass
class FakeLoader:
    """What the pacer reads of a loader."""

    reads_begun: int = 0
    reads_ended: int = 0
    loaded_bytes: int = 0
    load_seconds: float = 0.0
    done: bool = True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeBlock:
    def __init__(self, index: int) -> None:
        self.index = index


def _run(pacer: Pacer, clock: Clock, block: int, seconds: float, reader: FakeLoader | None = None) -> None:
    """One block run of ``seconds``, with a read of ``reader`` in flight throughout."""
    if reader is not None:
        reader.reads_begun += 1
    pacer.pre_forward(FakeBlock(block))  # type: ignore[arg-type]
    clock.now += seconds
    pacer.post_forward(FakeBlock(block))  # type: ignore[arg-type]
    if reader is not None:
        reader.reads_ended += 1


def _pacer(extra: float) -> tuple[Pacer, _core.Allowance, FakeLoader]:
    """A stage of 2 blocks of 10 ms that loaded 1 GB at its start in 1 s, a quiet pass, then 20
    runs beside the next stage's reads, each ``extra`` seconds slower, while it reads 0.2 GB."""
    own = FakeLoader(loaded_bytes=1_000_000_000, load_seconds=1.0)
    pacer = Pacer(2, own, Rates())  # type: ignore[arg-type]
    clock = Clock()
    pacer.clock = clock
    ahead, allowance = FakeLoader(done=False), _core.Allowance("next", 10**12)
    pacer.watch(ahead, allowance)  # type: ignore[arg-type]
    assert allowance.is_held  # no quiet pass known yet: it waits for one
    _run(pacer, clock, 0, 0.010)
    _run(pacer, clock, 1, 0.010)
    assert not allowance.is_held
    for i in range(20):
        ahead.loaded_bytes = (i + 1) * 10_000_000
        _run(pacer, clock, i % 2, 0.010 + extra, ahead)
    return pacer, allowance, ahead


def test_reads_that_cost_the_compute_more_than_they_take_alone_pause_the_read_ahead() -> None:
    # 20 runs x 30 ms lost for 0.2 GB: 3 s/GB, against 1 s/GB alone.
    pacer, allowance, _ = _pacer(0.030)
    assert allowance.is_held
    verdict = pacer.beside()
    assert verdict is not None and verdict.choice == _core.PaceChoice.PAUSE, verdict
    assert verdict.alone_per_gb == pytest.approx(1.0)
    assert "paused" in verdict.reason and "1.00 s" in verdict.reason, verdict.reason
    # The stage the reads are for starts: everything left is read then.
    allowance.open()
    assert not allowance.is_held and allowance.try_take(1)


def test_reads_that_cost_the_compute_less_than_they_take_alone_go_on() -> None:
    pacer, allowance, _ = _pacer(0.002)  # 0.2 s/GB
    assert not allowance.is_held
    verdict = pacer.beside()
    assert verdict is not None and verdict.choice == _core.PaceChoice.READ, verdict
    assert verdict.lost_per_gb == pytest.approx(0.2)


def test_runs_beside_the_stage_s_own_load_are_not_counted() -> None:
    own = FakeLoader(loaded_bytes=1_000_000_000, load_seconds=1.0, done=False)
    pacer = Pacer(1, own, Rates())  # type: ignore[arg-type]
    clock = Clock()
    pacer.clock = clock
    ahead, allowance = FakeLoader(done=False), _core.Allowance("next", 10**12)
    pacer.watch(ahead, allowance)  # type: ignore[arg-type]
    for _ in range(30):  # its own load under way: not quiet, and not the read-ahead's cost
        own.reads_begun += 1
        _run(pacer, clock, 0, 0.5, ahead)
        own.reads_ended += 1
    assert allowance.is_held  # still no quiet run to compare with
    ahead.loaded_bytes = 10**9
    verdict = pacer.beside()
    assert verdict is not None and verdict.choice == _core.PaceChoice.MEASURING, verdict
    # Nothing measured its drive either (its load had not ended): nothing to weigh against.
    assert "no load" in verdict.reason
    pacer.close()  # the turn ends: the hold for quiet runs goes with it
    assert not allowance.is_held


def test_a_turn_s_end_leaves_no_timer_thread_behind() -> None:
    """The wait for a quiet pass has a timer; the turn's end stops it, so no thread of it is
    left waiting (one still waiting when the interpreter exits aborts the process)."""
    before = set(threading.enumerate())
    pacer = Pacer(2, None, Rates())
    allowance = _core.Allowance("next", 10**12)
    pacer.watch(FakeLoader(done=False), allowance)  # type: ignore[arg-type]
    started = [t for t in threading.enumerate() if t not in before]
    assert len(started) == 1 and started[0].is_alive()
    pacer.close()
    assert not started[0].is_alive()
    assert not allowance.is_held


def test_a_read_ahead_waiting_for_a_quiet_pass_reads_after_a_while_without_one() -> None:
    pacer = Pacer(4, None, Rates())
    clock = Clock()
    pacer.clock = clock
    allowance = _core.Allowance("next", 10**12)
    pacer.watch(FakeLoader(done=False), allowance)  # type: ignore[arg-type]
    _run(pacer, clock, 0, 0.4)  # one quiet run of four: the first starts the wait
    assert allowance.is_held
    _run(pacer, clock, 1, 0.4)
    assert not allowance.is_held  # 0.4 s of quiet runs since the first, over QUIET_WAIT


# -- a pipeline whose read-ahead costs its running stage more than it saves --------------------


DIM = 768  # a block is 18.9 MB of fp32: the first stage 4 blocks, the second 8


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], dict[str, Tiny]]:
    folder = tmp_path_factory.mktemp("pace")
    torch.manual_seed(0)
    refs = {"a": Tiny(dim=DIM, layers=4).eval(), "b": Tiny(dim=DIM, layers=8).eval()}
    return {n: save(m, folder / f"{n}.safetensors") for n, m in refs.items()}, refs


def _step(a: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return torch.cat([ids[:, 1:], a(ids)[:, -1:].argmax(-1)], dim=1)


def test_a_pipeline_pauses_a_costly_read_ahead_and_reads_the_rest_at_the_stage_s_start(
    two: tuple[dict[str, Path], dict[str, Tiny]], loader_reads: ReadsWith
) -> None:
    paths, refs = two
    slow = threading.Event()  # set once stage a's own load is in: only b's reads are costly
    paused = threading.Event()  # set once a's pacer has paused b's reads
    costly_blocks = [0]

    def costly(*args: object, **kwargs: object) -> None:
        overlap.load_block(*args, **kwargs)  # type: ignore[arg-type]
        if slow.is_set():
            costly_blocks[0] += 1
            until = time.perf_counter() + 0.2
            while time.perf_counter() < until:  # Python, holding the GIL in turns
                pass
            if costly_blocks[0] == 6:
                # However slowly a computes on a loaded machine, b's last blocks wait for the
                # pacer's weighing: some of b is in before its start, the rest is not.
                paused.wait(60)

    loader_reads(block=costly)
    steps = 0
    with torch.no_grad():
        layers = {n: len(m.blocks) for n, m in refs.items()}
        stages = [
            tp.Stage(
                n, functools.partial(on_meta, Tiny, dim=DIM, layers=layers[n]), paths[n], options={"min_free_ram": 0}
            )
            for n in ("a", "b")
        ]
        with tp.Pipeline(stages, device="cpu") as pipe, pipe.run() as run:
            with run.stage("a") as a:
                a(torch.arange(4).reshape(1, 4))
                pipe_a = pipe._keeper.loaded["a"]
                assert pipe_a.loader is not None
                pipe_a.loader.join()  # its own load is in: what it read at is the drive's pace
                slow.set()
                # It computes until the pacer has weighed the reads beside it (or long enough
                # that it should have): how long that takes depends on the machine's load.
                ids, deadline = torch.arange(4).reshape(1, 4), time.monotonic() + 60
                while steps < 20 or not (pipe_a.pacer is not None and pipe_a.pacer.paused):
                    ids, steps = _step(a, ids), steps + 1
                    if time.monotonic() > deadline:
                        break
                paused.set()
            with run.stage("b") as b:
                got = b(ids)
        record_a, record_b = pipe.records
        want_ids = torch.arange(4).reshape(1, 4)
        for _ in range(steps):
            want_ids = _step(refs["a"], want_ids)
        want = refs["b"](want_ids)
    assert torch.equal(ids, want_ids) and torch.equal(got, want)
    assert record_a.beside is not None and record_a.beside.choice == _core.PaceChoice.PAUSE, record_a.beside
    assert record_b.arrival == _core.Arrival.READ_AHEAD
    # Paused part-way: some of b was in before its start, the rest read at it.
    assert 0 < record_b.read_before_start < record_b.holds, (record_b.read_before_start, record_b.holds)
    assert "paused" in pipe.report()
