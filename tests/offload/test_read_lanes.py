"""Every read of a model goes through its lane of the drive's read queue: one queue per drive for
the process, one lane per model, the running model's reads before those of a model that runs
later. Orders are observed (the test holds the queue's places as slow reads would), never timed."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import trash_panda as tp
from support.checkpoints import every_tier
from support.models import Tiny, on_meta
from trash_panda import _core
from trash_panda.errors import ArgumentError
from trash_panda.offload.state import get_state

IDS = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(3))


def build() -> Tiny:
    return on_meta(Tiny)  # type: ignore[return-value]


def no_bypass(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Makes a read outside any lane fail the test; returns the lanes read_block was given."""
    lanes: list[Any] = []
    real = _core.read_block

    def through_a_lane(requests: list[Any], **kwargs: Any) -> tuple[int, float]:
        assert kwargs.get("lane") is not None, "a read outside the model's lane"
        lanes.append(kwargs["lane"])
        return real(requests, **kwargs)

    def bypass(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("_core.read_tensors bypasses the read queue")

    monkeypatch.setattr(_core, "read_block", through_a_lane)
    monkeypatch.setattr(_core, "read_tensors", bypass)
    return lanes


@pytest.mark.parametrize("storage", [None, "bf16"])
def test_stream_load_reads_through_the_models_lane(
    tiny: tuple[Path, Tiny], monkeypatch: pytest.MonkeyPatch, storage: str | None
) -> None:
    path, ref = tiny
    lanes = no_bypass(monkeypatch)
    model = build()
    tp.stream_load(model, path, plan=every_tier(), device="cpu", storage_dtype=storage)
    state = get_state(model)
    assert state is not None and state.lane is not None
    assert lanes and all(lane is state.lane for lane in lanes)
    assert state.lane.priority == _core.Priority.RUN
    assert state.lane.blocks == len(state.blocks)
    grants, _waits, _seconds = state.lane.stats()
    # Outside weights, two resident blocks and buffers in a few calls; with a storage dtype the
    # engine's load of the RAM tier reads through the same lane.
    assert grants >= 1
    # Run order 4, 5, 0, 1, 2, 3: the lane counts positions in it from now on.
    handle = tp.install_offload(model, order=["blocks.4.", "blocks.5."])
    try:
        assert state.lane.blocks == len(state.blocks)
        with pytest.warns(UserWarning, match="ran before the order given"), torch.no_grad():
            out = model(IDS)
        if storage is None:
            assert torch.equal(out, ref(IDS))
        # The disk tier's reads went through the lane too, and the last streamed block run
        # (blocks.5, at position 1 of the order given) is current.
        assert state.lane.stats()[0] > grants
        assert state.lane.current == 1
    finally:
        handle.remove()
        tp.release(model)


def test_overlap_reads_through_the_models_lane(tiny: tuple[Path, Tiny], monkeypatch: pytest.MonkeyPatch) -> None:
    path, ref = tiny
    lanes = no_bypass(monkeypatch)
    with tp.stage(build, path, device="cpu", resident_blocks=3, overlap=True) as (model, _p, h):
        with torch.no_grad():
            assert torch.equal(model(IDS), ref(IDS))
        state = get_state(model)
        assert state is not None and state.lane is not None
        hook = h.hooks.get("overlap_wait")
        assert hook is not None and hook.loader.lane is state.lane
        assert lanes and all(lane is state.lane for lane in lanes)
        assert state.lane.stats()[0] >= 3  # at least the three resident blocks


def test_two_models_share_the_drives_queue(tiny: tuple[Path, Tiny]) -> None:
    path, _ref = tiny
    a, b = build(), build()
    tp.stream_load(a, path, plan=every_tier(), device="cpu")
    tp.stream_load(b, path, plan=every_tier(), device="cpu")
    try:
        sa, sb = get_state(a), get_state(b)
        assert sa is not None and sa.lane is not None and sb is not None and sb.lane is not None
        assert sa.lane.queue_id == sb.lane.queue_id
        assert sa.lane.lane_id != sb.lane.lane_id
        # The queue's counts are every lane's.
        assert sa.lane.queue_stats()[0] >= sa.lane.stats()[0] + sb.lane.stats()[0]
    finally:
        tp.release(a)
        tp.release(b)


def test_checkpoint_read_goes_through_the_drives_queue(tiny: tuple[Path, Tiny]) -> None:
    path, ref = tiny
    ckpt = tp.Checkpoint(path)
    lane = _core.ReadLane([path], 1)
    before = lane.queue_stats()[0]
    t = ckpt.read("blocks.0.up.weight")
    assert torch.equal(t, ref.blocks[0].up.weight)
    assert lane.queue_stats()[0] == before + 1


def test_priority_names(tiny: tuple[Path, Tiny]) -> None:
    path, _ref = tiny
    lane = _core.ReadLane([path], 4, _core.Priority.AHEAD)
    assert lane.priority == _core.Priority.AHEAD
    lane.priority = _core.Priority.RUN
    assert lane.priority == _core.Priority.RUN
    assert _core.Priority("ahead") == _core.Priority.AHEAD and _core.Priority.RUN.value == "run"
    with pytest.raises(ArgumentError, match=r'"soon".*run, ahead'):
        _core.Priority("soon")
    with pytest.raises(TypeError):  # a name does not cross: it is parsed by Priority(name)
        lane.priority = "run"  # type: ignore[assignment]
    with pytest.raises(TypeError):
        _core.ReadLane([path], 4, "later")  # type: ignore[arg-type]


def _until_waiting(lane: _core.ReadLane, n: int) -> None:
    deadline = time.monotonic() + 60  # a guard against a hang, not a timing assertion
    while lane.waiting() < n:
        assert time.monotonic() < deadline, f"{lane.waiting()} reads wait, not {n}"
        time.sleep(0.001)


def test_an_ahead_lanes_read_waits_behind_a_run_lanes(tmp_path: Path) -> None:
    data = tmp_path / "bytes.bin"
    data.write_bytes(bytes(range(256)) * 64)
    run = _core.ReadLane([data], 8, _core.Priority.RUN)
    ahead = _core.ReadLane([data], 8, _core.Priority.AHEAD)
    assert run.queue_id == ahead.queue_id
    run.advance(5)  # block 4 is the run lane's last: it still goes first
    holds = [run.hold_place() for _ in range(run.depth)]  # the drive is busy
    results: list[torch.Tensor] = []

    def read(lane: _core.ReadLane, position: int | None) -> None:
        dst = torch.empty(4096, dtype=torch.uint8)
        _core.read_block([(str(data), 0, dst)], threads=1, lane=lane, position=position)
        results.append(dst)

    run.record(True)
    try:
        first = threading.Thread(target=read, args=(ahead, None))  # needed now, by a later model
        first.start()
        _until_waiting(run, 1)
        second = threading.Thread(target=read, args=(run, 4))
        second.start()
        _until_waiting(run, 2)
        for h in holds:
            h.release()
        first.join()
        second.join()
        served = [s for s in run.served() if s[0] in (run.lane_id, ahead.lane_id)]
    finally:
        run.record(False)
    assert served == [(run.lane_id, 4), (ahead.lane_id, None)]
    assert all(torch.equal(r, torch.arange(4096) % 256) for r in results)
    assert ahead.stats()[1] == 1  # it waited


def _uncached(path: Path) -> None:
    import os

    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _takes_o_direct(path: Path) -> bool:
    import os

    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not hasattr(__import__("os"), "O_DIRECT"), reason="O_DIRECT and posix_fadvise (Linux)")
@pytest.mark.parametrize("direct", [True, False])
def test_a_direct_lane_reads_past_the_page_cache_into_pages_placed_like_the_file(tmp_path: Path, direct: bool) -> None:
    """Through a ``direct`` lane, tensors read into pages of their own leave nothing in the page
    cache; through a buffered lane the file's pages stay cached. Either way, the bytes are the
    file's, and a tensor whose file offset is not 64-byte aligned (these line up with no page)
    starts 64-byte aligned in its pages, as torch's own do: the direct read passes through the
    core's bounce buffer rather than leave it where the file has it."""
    from safetensors.torch import save_file

    from trash_panda.checkpoint import Checkpoint
    from trash_panda.offload.materialize import DIRECT_ALIGN, FRESH_BYTES, TENSOR_ALIGN, read_many

    g = torch.Generator().manual_seed(5)
    # An odd-sized first tensor puts the others at offsets no page lines up with.
    tensors = {
        "a": torch.randn(7, generator=g),
        "b": torch.randn(3 * FRESH_BYTES // 4 + 5, generator=g),
        "c": torch.randn(2 * FRESH_BYTES // 2 + 3, generator=g).to(torch.bfloat16),
    }
    path = tmp_path / "odd.safetensors"
    save_file(tensors, str(path))
    ckpt = Checkpoint(path)
    infos = [ckpt.info(n) for n in ("b", "c")]
    assert all(i.start % TENSOR_ALIGN for i in infos)
    if direct and not _takes_o_direct(path):
        pytest.skip("this file system refuses O_DIRECT (tmpfs): a direct lane reads buffered there")
    _uncached(path)
    if _core.cached_bytes(path) > DIRECT_ALIGN:
        pytest.skip("this file system keeps the file cached after posix_fadvise")
    lane = _core.ReadLane([path], 1, direct=direct)
    assert lane.direct is direct
    read = read_many(infos, threads=2, lane=lane)
    for info, t in zip(infos, read, strict=True):
        assert torch.equal(t, tensors[info.name])
        assert t.data_ptr() % TENSOR_ALIGN == 0
    cached = _core.cached_bytes(path)
    if direct:
        # Through the bounce buffer, still direct.
        assert cached <= 2 * DIRECT_ALIGN, cached
    else:
        assert cached > sum(i.nbytes for i in infos) // 2, cached
