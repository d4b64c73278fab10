"""stage(): release on exceptions, the remembered activation memory, overlap; remove(); pinned
buffers; final_pass()."""

from __future__ import annotations

import gc
import itertools
import json
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import trash_panda as tp
from conftest import ReadsWith
from support.models import Tiny, on_meta, save
from trash_panda import _core, settings
from trash_panda.errors import ArgumentError, StreamError
from trash_panda.offload import overlap
from trash_panda.offload.state import get_state

IDS = torch.randint(0, 100, (3, 11), generator=torch.Generator().manual_seed(5))


def build() -> Tiny:
    return on_meta(Tiny)  # type: ignore[return-value]


def test_stage_runs_and_releases(tiny: tuple[Path, Tiny]) -> None:
    path, ref = tiny
    with tp.stage(build, path, device="cpu", resident_blocks=2) as (model, p, handle):
        assert p.blocks_in("device") == ["blocks.0.", "blocks.1."]
        assert handle.model is model
        with torch.no_grad():
            assert torch.equal(model(IDS), ref(IDS))
    assert get_state(model) is None
    with pytest.raises(tp.TrashPandaError, match="released"):
        model(IDS)


def test_stage_checks_its_arguments(tiny: tuple[Path, Tiny]) -> None:
    path, _ = tiny
    with pytest.raises(ArgumentError, match="build_fn"), tp.stage(None, path):  # type: ignore[arg-type]
        pass
    with pytest.raises(ArgumentError, match="resident_block"), tp.stage(build, path, resident_block=2):
        pass
    bad_order: Any = "blocks.0"
    with pytest.raises(ArgumentError, match="order"), tp.stage(build, path, order=bad_order):
        pass


def test_install_offload_refuses_a_block_named_twice_as_stage_does(tiny: tuple[Path, Tiny]) -> None:
    path, _ = tiny
    twice = ["blocks.1", "blocks.1."]
    with (
        pytest.raises(ArgumentError, match="twice") as staged,
        tp.stage(build, path, device="cpu", resident_blocks=2, order=twice),
    ):
        pass
    model = build()
    tp.stream_load(model, path, device="cpu")
    with pytest.raises(ArgumentError, match="twice") as installed:
        tp.install_offload(model, order=twice)
    assert str(installed.value) == str(staged.value)
    state = get_state(model)
    assert state is not None and state.handle is None  # nothing was installed
    tp.release(model)


@pytest.mark.slow
def test_stage_releases_when_the_block_raises(tmp_path: Path) -> None:
    torch.manual_seed(0)
    big = Tiny(dim=1024, layers=6)  # about 200 MB of fp32 weights
    path = save(big, tmp_path / "big.safetensors")
    del big
    build_big = lambda: on_meta(Tiny, dim=1024, layers=6)  # noqa: E731
    # One stage first, so what a first stage keeps for good (modules imported on first use,
    # torch's kernels warmed up) is in the baseline, whichever tests ran before this one.
    with tp.stage(build_big, path, device="cpu", resident_blocks=3) as (m, _, _h), torch.no_grad():
        m(IDS)
    gc.collect()
    _core.trim_heap()
    start = _core.current_rss()
    with (
        pytest.raises(RuntimeError, match="in the block"),
        tp.stage(build_big, path, device="cpu", resident_blocks=3) as (m, _, _h),
    ):
        with torch.no_grad():
            m(IDS)
        assert _core.current_rss() > start + 100e6  # the resident blocks were loaded
        raise RuntimeError("in the block")
    gc.collect()
    _core.trim_heap()
    end = _core.current_rss()
    assert abs(end - start) <= 0.05 * start, (start, end)


def _peaks() -> dict[str, int]:
    return sys.modules["trash_panda.options"]._PEAKS  # type: ignore[no-any-return]


def test_the_peak_is_remembered_for_the_next_plan_of_the_key(tiny: tuple[Path, Tiny]) -> None:
    path, _ = tiny
    options_module = sys.modules["trash_panda.options"]
    _peaks().clear()
    with tp.stage(build, path, device="cpu", key="tiny") as (model, p, _h):
        assert json.loads(p.to_json())["options"]["activation_vram"] is None
        with torch.no_grad():
            model(torch.randint(0, 100, (64, 512)))  # activations of several MB
    peak = options_module.remembered_activation("tiny")
    assert peak is not None and peak > 1_000_000
    with tp.stage(build, path, device="cpu", key="tiny") as (_m, p, _h):
        assert json.loads(p.to_json())["options"]["activation_vram"] == peak
    # An explicit value wins; another key has nothing remembered.
    with tp.stage(build, path, device="cpu", key="tiny", activation_vram=12345) as (_m, p, _h):
        assert json.loads(p.to_json())["options"]["activation_vram"] == 12345
    with tp.stage(build, path, device="cpu") as (_m, p, _h):
        assert json.loads(p.to_json())["options"]["activation_vram"] is None
    # With overlap too (tests/offload/test_overlap_peak.py: without the weights it loaded meanwhile).
    _peaks().clear()
    with tp.stage(build, path, device="cpu", key="tiny", overlap=True) as (model, _p, _h), torch.no_grad():
        model(IDS)
    assert options_module.remembered_activation("tiny") is not None


def test_overlap_waits_for_a_slow_read(
    loader_reads: ReadsWith, tiny: tuple[Path, Tiny], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, ref = tiny
    real = overlap.load_block
    order: list[str] = []
    loaded_on: set[str] = set()
    gate = threading.Event()

    def slow(block, *args):  # type: ignore[no-untyped-def]
        gate.wait(10)  # no block is read before the stage's block has started
        time.sleep(0.05)
        order.append(block.prefix)
        loaded_on.add(threading.current_thread().name)
        real(block, *args)

    loader_reads(block=slow)
    with (
        pytest.warns(UserWarning, match=r"blocks\.0\. ran before the order given \(blocks\.2\."),
        tp.stage(build, path, device="cpu", resident_blocks=3, overlap=True, order=["blocks.2"]) as (model, _, h),
    ):
        assert order == []  # the stage did not wait for the resident blocks
        gate.set()
        with torch.no_grad():
            assert torch.equal(model(IDS), ref(IDS))
        assert h.hooks.get("overlap_wait") is not None
    assert order == ["blocks.2.", "blocks.0.", "blocks.1."]  # one at a time, in run order
    assert loaded_on == {"trash-panda-loader"}


def test_profile_reports_the_loader_thread_and_private_memory(
    tiny: tuple[Path, Tiny], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path, ref = tiny
    monkeypatch.setenv("TRASH_PANDA_PROFILE", "1")
    with tp.stage(build, path, device="cpu", resident_blocks=3, overlap=True) as (model, _, _h), torch.no_grad():
        assert torch.equal(model(IDS), ref(IDS))
    report = capsys.readouterr().err
    assert re.search(r"loader thread: 3 resident blocks \(\d+\.\d+ GB\) in \d", report), report
    points = [line for line in report.splitlines() if "working set" in line]
    assert len(points) == 5 and all(re.search(r"private \d+\.\d+ GB", p) for p in points), report


def test_overlap_raises_in_the_call_that_needs_a_failed_block(
    loader_reads: ReadsWith, tiny: tuple[Path, Tiny], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = tiny
    real = overlap.load_block

    def failing(block, *args):  # type: ignore[no-untyped-def]
        if block.prefix == "blocks.1.":
            raise OSError("injected read failure")
        real(block, *args)

    loader_reads(block=failing)
    with (
        pytest.raises(StreamError, match=r"blocks\.1\..*injected read failure"),
        tp.stage(build, path, device="cpu", resident_blocks=3, overlap=True) as (model, _, h),
        torch.no_grad(),
    ):
        try:
            model(IDS)
        finally:
            # A block whose weights never came did not run: the order file must not say so.
            assert h.ran == ["blocks.0."]


def test_remove_leaves_a_runnable_model_with_mapped_weights(tiny: tuple[Path, Tiny]) -> None:
    path, ref = tiny
    p = tp.Plan.manual(resident=["blocks.0."], streamed=[f"blocks.{i}." for i in range(1, 6)])
    p.assign(tp.Tier.DISK, prefixes=["blocks.5."])
    model = build()
    tp.stream_load(model, path, plan=p, device="cpu")
    handle = tp.install_offload(model)
    with torch.no_grad():
        want = ref(IDS)
        assert torch.equal(model(IDS), want)
        handle.remove()
        assert torch.equal(model(IDS), want)  # plainly, with no hooks
    state = get_state(model)
    assert state is not None
    for i in (3, 5):  # a RAM-tier block and a disk-tier block
        w = model.blocks[i].up.weight
        assert not w.is_meta
        assert w.data_ptr() == state.checkpoint.read(f"blocks.{i}.up.weight").data_ptr()  # a view of the map
    tp.release(model)


def test_pinned_buffers_argument_beats_environment_beats_default(
    tiny: tuple[Path, Tiny], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, ref = tiny
    model = build()

    def buffers(**kw: object) -> int:
        b = tp.plan(model, path, device="cpu", resident_blocks=1, **kw).budgets  # type: ignore[arg-type]
        assert b is not None
        return b.staging_buffers

    monkeypatch.delenv("TRASH_PANDA_PINNED_BUFFERS", raising=False)
    assert buffers() == 3  # lookahead 2 + 1
    assert buffers(lookahead=0) == 1
    monkeypatch.setenv("TRASH_PANDA_PINNED_BUFFERS", "5")
    assert buffers() == 5
    assert buffers(pinned_buffers=1) == 1
    assert settings.DEFAULTS["pinned_buffers"] == "0"  # in the settings table (0: lookahead + 1)
    # The engine allocates exactly the plan's figure, and one buffer still runs every tier.
    p = tp.plan(model, path, device="cpu", resident_blocks=1, pinned_buffers=1)
    tp.stream_load(model, path, plan=p, device="cpu")
    state = get_state(model)
    assert state is not None and state.engine is not None
    assert len(state.engine.staging_buffers()) == 1
    handle = tp.install_offload(model)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(model(IDS), ref(IDS))
    tp.release(model, handle)
    monkeypatch.setenv("TRASH_PANDA_PINNED_BUFFERS", "many")
    with pytest.raises(ArgumentError, match="TRASH_PANDA_PINNED_BUFFERS"):
        buffers()


def test_max_lookahead_is_counted_by_the_plan_and_the_run_stays_exact(
    tiny: tuple[Path, Tiny], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path, ref = tiny
    monkeypatch.delenv("TRASH_PANDA_PINNED_BUFFERS", raising=False)
    monkeypatch.delenv("TRASH_PANDA_MAX_LOOKAHEAD", raising=False)
    assert settings.DEFAULTS["max_lookahead"] == "0"  # 0: the look-ahead, a fixed depth
    fixed = tp.plan(build(), path, device="cpu", resident_blocks=1).budgets
    assert fixed is not None and fixed.staging_buffers == 3
    monkeypatch.setenv("TRASH_PANDA_MAX_LOOKAHEAD", "4")
    monkeypatch.setenv("TRASH_PANDA_PROFILE", "1")
    with tp.stage(build, path, device="cpu", resident_blocks=1) as (model, p, _h), torch.no_grad():
        b = p.budgets
        assert b is not None and b.staging_buffers == 5  # staged 4 ahead, and the one that runs
        assert b.staging_buffer_bytes == fixed.staging_buffer_bytes
        assert b.host_staging == 5 * b.staging_buffer_bytes > fixed.host_staging
        assert "lookahead 2 (grows to 4 where the compute waits)" in str(p)
        state = get_state(model)
        assert state is not None and state.engine is not None
        assert len(state.engine.staging_buffers()) == 5  # what the plan counted, no more
        for _ in range(3):
            assert torch.equal(model(IDS), ref(IDS))
    report = capsys.readouterr().err
    depths = re.findall(r"staging depth, engine pass (\d+): (\d+)(?:\.\.(\d+))? blocks ahead", report)
    assert [int(d[0]) for d in depths] == [1, 2, 3], report
    assert all(2 <= int(d[1]) <= int(d[2] or d[1]) <= 4 for d in depths), report


def rss_file() -> int:
    """The file-backed pages mapped in this process (RssFile)."""
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssFile:"))


@pytest.mark.slow
def test_final_pass_gives_memory_back_block_by_block(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = Tiny(dim=512, layers=6).eval()  # 8 MB of fp32 weights per block
    path = save(ref, tmp_path / "m.safetensors")
    want = ref(IDS).detach()
    del ref
    with tp.stage(lambda: on_meta(Tiny, dim=512, layers=6), path, device="cpu", resident_blocks=4) as (m, _, h):
        with torch.no_grad():
            assert torch.equal(m(IDS), want)
        private: list[int] = []
        for b in m.blocks:  # registered after the offload hooks, so it sees each block freed
            b.register_forward_hook(lambda *_: private.append(_core.private_memory()))
        before = _core.private_memory()
        mapped_before = rss_file()
        with h.final_pass(keep_prefixes=["blocks.3."]) as fp, torch.no_grad():
            assert torch.equal(m(IDS), want)
        mapped_after = rss_file()
        events = []
        while not fp.events.empty():
            events.append(fp.events.get_nowait())
        block_bytes = sum(p.nbytes for p in Tiny(dim=512, layers=1).blocks[0].parameters())
        # What the block's runs of the file cover, whole pages, on Linux (elsewhere: 0).
        ram_bytes = events[3].bytes
        assert block_bytes <= ram_bytes < block_bytes + 4 * 4096
        assert [(e.block, e.bytes, e.tier) for e in events] == [
            ("blocks.0.", block_bytes, tp.Tier.DEVICE),
            ("blocks.1.", block_bytes, tp.Tier.DEVICE),
            ("blocks.2.", block_bytes, tp.Tier.DEVICE),
            ("blocks.4.", ram_bytes, tp.Tier.RAM),
            ("blocks.5.", ram_bytes, tp.Tier.RAM),
        ]
        # The RAM-tier blocks gave back their mapped pages: the file's pages mapped in the
        # process fell by about a block each.
        assert mapped_before - mapped_after > 1.6 * block_bytes, (mapped_before, mapped_after)
        # Private memory falls by about a block after each of the first three blocks.
        steps = [before, *private[:3]]
        for a, b in itertools.pairwise(steps):
            assert a - b > 0.8 * block_bytes, (steps, block_bytes)
        assert m.blocks[0].up.weight.is_meta and not m.blocks[3].up.weight.is_meta
        assert not m.head.weight.is_meta  # outside weights left alone
        with pytest.raises(StreamError, match=r"blocks\.0\. was freed by final_pass"), torch.no_grad():
            m(IDS)


@pytest.mark.skipif(sys.platform != "linux", reason="the page cache is dropped and measured on Linux")
@pytest.mark.parametrize("keep", [False, True])
def test_a_final_pass_keeps_the_page_cache_when_asked(tmp_path: Path, keep: bool) -> None:
    """Both ways the RAM-tier blocks say they gave their pages back; with keep_page_cache the
    file's pages stay in the page cache (a pipeline run again reads them from there), without
    it they go."""
    torch.manual_seed(0)
    ref = Tiny(dim=512, layers=4).eval()
    path = save(ref, tmp_path / "m.safetensors")
    del ref
    _core.drop_cache(path)  # written back: the page cache drops only clean pages
    with tp.stage(lambda: on_meta(Tiny, dim=512, layers=4), path, device="cpu", resident_blocks=2) as (m, _, h):
        with torch.no_grad():
            m(IDS)  # the RAM-tier blocks' pages are read in
        cached = _core.cached_bytes(path)
        with h.final_pass(keep_page_cache=keep) as fp, torch.no_grad():
            m(IDS)
        ram = [fp.events.get_nowait() for _ in range(fp.events.qsize())][2:]
        assert [e.tier for e in ram] == [tp.Tier.RAM, tp.Tier.RAM] and all(e.bytes > 0 for e in ram)
        freed = sum(e.bytes for e in ram)
        dropped = cached - _core.cached_bytes(path)
        if keep:
            assert dropped < 0.1 * freed, (cached, dropped, freed)
        else:
            assert dropped > 0.8 * freed, (cached, dropped, freed)


def test_memory_points_name_what_holds_a_tensor(tmp_path: Path) -> None:
    from trash_panda.offload.profile import memory_point

    torch.manual_seed(0)
    path = save(Tiny(dim=512), tmp_path / "m.safetensors")
    model = on_meta(Tiny, dim=512)
    tp.stream_load(model, path, offload_prefixes=["blocks."], resident_prefixes=["blocks.0."], device="cpu")
    names = [t["name"] for t in memory_point("loaded")["large_tensors"]]  # type: ignore[union-attr]
    assert "Tiny.blocks.0.up.weight float32[2048, 512]" in names
    tp.release(model)


@pytest.mark.skipif(sys.platform != "linux", reason="the page cache is dropped and measured on Linux")
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("budget", ["tight", "roomy", "setting"])
def test_a_stage_reads_past_the_page_cache_when_its_file_could_not_stay_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overlap: bool, budget: str
) -> None:
    """A model on its own follows the pipeline's rule with its plan's RAM: a budget that holds
    its weights but not also its file's pages reads past the page cache (nothing of the file
    stays cached); a roomy one reads through it when the file is read again (stage() releases
    the model, and its next call loads it again: the file stays cached for it), and past it
    when the model stays loaded (stream_load: read once); TRASH_PANDA_DISK_MODE wins over the
    rule; the outputs are the plain model's every way."""
    torch.manual_seed(0)
    ref = Tiny(dim=512, layers=4).eval()
    path = save(ref, tmp_path / "m.safetensors")
    with torch.no_grad():
        want = ref(IDS)
    del ref
    size = path.stat().st_size
    ram = size + size // 2 if budget != "roomy" else 4 * size + (64 << 20)
    if budget == "setting":
        monkeypatch.setenv("TRASH_PANDA_DISK_MODE", "buffered")
    _core.drop_cache(path)
    build = lambda: on_meta(Tiny, dim=512, layers=4)  # noqa: E731
    with tp.stage(build, path, device="cpu", ram=ram, min_free_ram=0, overlap=overlap) as (m, p, _h):
        assert all(b.tier == tp.Tier.DEVICE for b in p.blocks), p  # every block held: the tight case's point
        with torch.no_grad():
            assert torch.equal(m(IDS), want)
        lane = get_state(m).lane  # type: ignore[union-attr]
        assert lane is not None and lane.direct is (budget == "tight")
        cached = _core.cached_bytes(path)
        if budget == "tight":
            assert cached < 0.1 * size, (cached, size)
        else:
            assert cached > 0.9 * size, (cached, size)
    reads = p.load_reads(size, read_again=True)  # as stage() asked: its next call reads it again
    assert reads.direct is (budget == "tight")
    assert reads.reason.startswith("direct reads: the model's" if budget == "tight" else "buffered reads"), reads
    # A model loaded and kept reads its file once: past the page cache, with that room or not.
    once = p.load_reads(size)
    assert once.direct is (budget != "setting"), once
    if budget == "roomy":
        assert "reads them once" in once.reason, once
    model = build()
    report = tp.stream_load(model, path, plan=p, device="cpu")
    try:
        assert report.reads == once.reason and f"loads: {once.reason}" in str(report), str(report)
    finally:
        tp.release(model)
