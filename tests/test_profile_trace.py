"""The profile's Chrome trace: the engine workers' stagings on lanes of their own, on the clock the
hooks time block runs with, so reads can be seen next to the compute they overlap."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import trash_panda as tp
from models import Tiny, on_meta, save
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
    engine = handle._state.engine
    assert engine is not None
    with torch.no_grad():
        for _ in range(2):
            model(torch.randint(0, 100, (2, 5)))
    stagings = [s for s in settled(engine) if s.start >= handle.installed]
    tp.release(model, handle)

    assert stagings and all(s.start <= s.end and s.bytes > 0 for s in stagings)
    assert {s.source for s in stagings} <= {"disk", "ram_warm", "ram_cold"}
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
    engine = handle._state.engine
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
