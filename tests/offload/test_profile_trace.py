"""The profile's Chrome trace: the engine workers' stagings on lanes of their own, on the clock the
hooks time block runs with, so reads can be seen next to the compute they overlap."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import trash_panda as tp
from support.models import Tiny, on_meta, save
from trash_panda import ArgumentError, Plan, Tier, _core

# Blocks 0-1 resident, 2-3 in RAM, 4-5 on disk: every streamed source in one pass.
PLAN = Plan.manual(resident=["blocks.0.", "blocks.1."], streamed=[f"blocks.{i}." for i in range(2, 6)]).assign(
    Tier.DISK, prefixes=["blocks.4.", "blocks.5."]
)
MARGIN_S = 1.0  # install (the first stagings) to the first run, and the last stagings to release


def slices(trace: dict[str, Any], *cats: str) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in cats]


def span(e: dict[str, Any]) -> tuple[float, float]:
    return e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6


def settled(engine: _core.Engine) -> list[_core.Staging]:
    """The stagings once the workers are done with the look-ahead after the last run."""
    seen = engine.stagings()
    for _ in range(50):
        time.sleep(0.1)
        now = engine.stagings()
        if len(now) == len(seen):
            return now
        seen = now
    return seen


def test_trace_draws_each_staging_on_a_worker_lane_beside_the_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    path = save(Tiny().eval(), tmp_path / "m.safetensors")
    log = tmp_path / "run.jsonl"
    monkeypatch.setenv("TRASH_PANDA_PROFILE", "1")
    monkeypatch.setenv("TRASH_PANDA_LOG", str(log))
    monkeypatch.setenv("TRASH_PANDA_LOOKAHEAD", "2")
    model = on_meta(Tiny)
    tp.stream_load(model, path, plan=PLAN, device="cpu")
    handle = tp.install_offload(model)
    # Compute that takes long enough for the look-ahead's reads to happen while a block runs.
    for b in model.blocks:
        b.register_forward_pre_hook(lambda _m, _a: time.sleep(0.03))
    engine = handle.state.engine
    assert engine is not None
    with torch.no_grad():
        for _ in range(2):
            model(torch.randint(0, 100, (2, 5)))
    stagings = [s for s in settled(engine) if s.start >= handle.installed]
    tp.release(model, handle)

    assert stagings and all(s.start <= s.end and s.bytes > 0 for s in stagings)
    assert {s.source for s in stagings} <= {
        _core.StagingSource.DISK,
        _core.StagingSource.RAM_WARM,
        _core.StagingSource.RAM_COLD,
    }
    trace = json.loads(Path(str(log) + ".trace.json").read_text())
    runs = slices(trace, "device", "ram", "disk")
    copies = slices(trace, "copy")
    # One slice per staging, named after its block, with its tier.
    names = {s.block: f"blocks.{s.block + 2}" for s in stagings}
    assert sorted(c["name"] for c in copies) == sorted(names[s.block] for s in stagings)
    for c in copies:
        want = "disk" if c["name"] in ("blocks.4", "blocks.5") else "ram"
        assert c["args"]["tier"] == want, c
        assert c["args"]["worker"] in (0, 1), c
        assert c["tid"] != 1, c
    lanes = {
        e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("ph") == "M" and e["name"] == "thread_name"
    }
    assert {lanes[c["tid"]] for c in copies} <= {"worker 1", "worker 2"}
    # The same clock: every staging lies within the runs' time span (the first ones start at
    # install, just before the first run; the last finish the look-ahead just after the last run).
    first = min(span(r)[0] for r in runs)
    last = max(span(r)[1] for r in runs)
    for c in copies:
        start, end = span(c)
        assert first - MARGIN_S <= start <= end <= last + MARGIN_S, (c, first, last)
    # Prefetched blocks are read while the block before them computes.
    streamed = [r for r in runs if r["cat"] in ("ram", "disk")]
    overlapping = [c for c in copies if any(span(c)[0] < span(r)[1] and span(r)[0] < span(c)[1] for r in streamed)]
    assert overlapping, (copies, streamed)


def test_profile_report_maps_engine_blocks_and_rejects_unknown_ones(tmp_path: Path) -> None:
    torch.manual_seed(0)
    path = save(Tiny().eval(), tmp_path / "m.safetensors")
    model = on_meta(Tiny)
    tp.stream_load(model, path, plan=PLAN, device="cpu")
    handle = tp.install_offload(model)
    before = _core.clock()
    with torch.no_grad():
        model(torch.randint(0, 100, (2, 5)))
    engine = handle.state.engine
    assert engine is not None
    stagings = settled(engine)
    assert stagings and all(s.end <= _core.clock() for s in stagings)
    assert any(s.start >= before for s in stagings)
    blocks = [(f"blocks.{i}", "device" if i < 2 else "ram" if i < 4 else "disk") for i in range(6)]
    _, trace, _ = _core.profile_report(blocks, [], stagings=stagings, engine_blocks=[2, 3, 4, 5])
    names = sorted(e["name"] for e in slices(json.loads(trace), "copy"))
    assert names == sorted(f"blocks.{s.block + 2}" for s in stagings)
    with pytest.raises(ArgumentError, match="engine_blocks"):
        _core.profile_report(blocks, [], stagings=stagings, engine_blocks=[2])
    tp.release(model, handle)


def _ids() -> torch.Tensor:
    return torch.randint(0, 100, (2, 5), generator=torch.Generator().manual_seed(3))


def test_resident_blocks_with_nothing_to_stage_are_in_the_passes(tmp_path: Path) -> None:
    from trash_panda.offload.profile import build

    torch.manual_seed(0)
    path = save(Tiny().eval(), tmp_path / "m.safetensors")
    model = on_meta(Tiny)
    tp.stream_load(model, path, plan=PLAN, device="cpu")
    handle = tp.install_offload(model)
    assert not handle.state.blocks[0].work  # f32 stored, f32 computed: nothing to bring
    # The first block's first run is the slow one (the warm-up the profile has to show).
    slow = model.blocks[0].register_forward_pre_hook(lambda _m, _a: time.sleep(0.3))
    with torch.no_grad():
        model(_ids())
        slow.remove()
        model(_ids())
    report, _trace, line = build(handle)
    tp.release(model, handle)

    assert [p["blocks"] for p in json.loads(line)["passes"]] == [6, 6]
    assert json.loads(line)["passes"][0]["seconds"] >= 0.3
    first = report.split("first pass, main thread time by block:\n")[1].splitlines()[0]
    assert re.fullmatch(
        r"  blocks\.0 \(device\): 0\.[3-9]\d s = staged 0\.00 s \+ gpu 0\.00 s \+ rest 0\.\d+ s", first
    ), report


def test_storage_dtype_reports_the_ram_tier_read_into_memory(tmp_path: Path) -> None:
    from trash_panda.offload.profile import build

    torch.manual_seed(0)
    path = save(Tiny().eval(), tmp_path / "m.safetensors")
    model = on_meta(Tiny)
    report = tp.stream_load(model, path, plan=PLAN, device="cpu", storage_dtype="bf16", compute_dtype="f32")
    handle = tp.install_offload(model)
    threads = handle.state.config.ram_in_memory_threads
    with torch.no_grad():
        model(_ids())
    text, _trace, line = build(handle)
    tp.release(model, handle)

    assert threads is not None and threads >= 1
    load = json.loads(line)["load"]
    assert load["ram"] == {"bytes": 0, "seconds": 0.0}  # not a mapped RAM tier
    read = load["ram_in_memory"]
    assert read["bytes"] == report.ram.bytes > 0 and read["seconds"] == report.ram.seconds
    assert read["threads"] == threads and read["storage"] == "BF16"
    assert " ram " not in text.splitlines()[0 if text.startswith("stream_load") else 1]
    assert re.search(
        rf"read 0\.\d\d GB of streamed-block tensors into memory as bf16 in \d+\.\d\d s "
        rf"\(\d+\.\d\d GB/s, {threads} threads?\)",
        text,
    ), text


def test_memory_points_name_the_runtime_s_own_tensors(tmp_path: Path) -> None:
    from trash_panda.offload.profile import memory_point

    torch.manual_seed(0)
    path = save(Tiny(dim=512), tmp_path / "m.safetensors")
    model = on_meta(Tiny, dim=512)
    # f32 weights computing in bf16: the resident block keeps its stored form and expands it
    # into the expansion buffer on each run.
    tp.stream_load(model, path, plan=PLAN, device="cpu", compute_dtype="bf16")
    handle = tp.install_offload(model)
    names = [str(t["name"]) for t in memory_point("hooks on")["large_tensors"]]  # type: ignore[union-attr]
    tp.release(model, handle)

    assert "resident stored form of Tiny.blocks.0.up.weight float32[2048, 512]" in names, names
    assert any(re.fullmatch(r"expansion buffer of Tiny uint8\[\d+\]", n) for n in names), names


def test_memory_points_name_a_device_backend_s_slots(tmp_path: Path) -> None:
    from support.simdevice import SimulatedDevice
    from trash_panda.offload.backends.cuda import DeviceBackend
    from trash_panda.offload.handle import _install
    from trash_panda.offload.profile import memory_point
    from trash_panda.offload.state import get_state

    torch.manual_seed(0)
    path = save(Tiny(dim=512), tmp_path / "m.safetensors", torch.bfloat16)
    model = on_meta(Tiny, dim=512)
    # A GPU plan on the CPU, its device memory simulated there: the slots are CPU tensors.
    p = tp.plan(model, path, device="cpu", vram="1TB", ram="1TB", resident_blocks=2, compute_dtype="bf16")
    tp.stream_load(model, path, plan=p, device="cpu")
    state = get_state(model)
    assert state is not None
    sim = SimulatedDevice(seed=1)
    try:
        handle = _install(model, state, state.blocks, None, lambda s: DeviceBackend(s, sim))
        with torch.no_grad():
            model(_ids())
        names = [str(t["name"]) for t in memory_point("hooks on")["large_tensors"]]  # type: ignore[union-attr]
        tp.release(model, handle)
    finally:
        sim.stop()
    assert any(re.fullmatch(r"device slot 0 of Tiny uint8\[\d+\]", n) for n in names), names
    assert "Tiny.blocks.0.up.weight bfloat16[2048, 512]" in names, names
