"""release() frees what the runtime held as its references go, without a full garbage collection
(which walks every object of the process, a third of a second with transformers imported, on
every stage of a pipeline): nothing that holds memory is left in a reference cycle, also when a
loader thread was stopped before it read its blocks."""

from __future__ import annotations

import gc
import sys
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import trash_panda as tp

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import pipeline_stages as ps


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ps.save_pipeline(tmp_path_factory.mktemp("release") / "pipe")


@pytest.fixture
def no_collection() -> Iterator[None]:
    """No automatic collection while the test runs; the cycles left are looked at after."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
        gc.collect()


def cycles() -> list[object]:
    """What only a full collection would free now."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.collect()
    found = list(gc.garbage)
    gc.set_debug(0)
    gc.garbage.clear()
    return found


def holding(found: list[object]) -> list[str]:
    """Of ``found``, what holds memory: tensors off the meta device, the runtime's objects."""
    out = []
    for o in found:
        if isinstance(o, torch.Tensor) and o.device.type != "meta" and o.numel() > 0:
            out.append(f"tensor {tuple(o.shape)} on {o.device}")
        elif type(o).__name__ in ("ResidentLoader", "ModelState", "Engine", "LoadedStage", "OffloadHandle"):
            out.append(type(o).__name__)
    return out


def test_a_stage_read_ahead_and_stopped_before_its_reads_leaves_no_cycle(folder: Path, no_collection: None) -> None:
    """The denoiser is loaded ahead of its turn behind an allowance nobody fills, and released
    before its turn: its loader stops with every block unread, each stored with the error its
    call would raise. The loader goes with the release, not with a collection."""
    from trash_panda.offload import release
    from trash_panda.pipeline.loaded import free_now, load_stage

    model = ps.build(folder, "transformer")
    ckpt = tp.Checkpoint(folder / "transformer")
    p = tp.plan(model, ckpt, device="cpu", resident_blocks=6)
    loaded = load_stage(
        "transformer", model, ckpt, p, free_now(torch.device("cpu")),
        device=torch.device("cpu"), order=None, destination=None, shared={}, key="", ahead=True,
    )  # fmt: skip
    loader = loaded.loader
    assert loader is not None and loaded.allowance is not None
    deadline = time.monotonic() + 60  # guards against a hang; nothing asserts a time
    while loaded.allowance.waiting != 1:
        assert time.monotonic() < deadline, "the loader never waited for its allowance"
        time.sleep(0.005)
    loaded.close()
    assert loader.errors and loader.loaded_bytes == 0
    ref = weakref.ref(loader)
    release(model, loaded.handle)
    del loaded, loader
    assert ref() is None, "the stopped loader is held by a reference cycle"
    assert holding(cycles()) == []


def test_release_after_a_run_leaves_no_cycle_holding_memory(folder: Path, no_collection: None) -> None:
    ids, latents = ps.inputs()
    for overlap in (False, True):
        handles = []
        with torch.no_grad():
            with tp.stage(lambda: ps.build(folder, "text_encoder"), folder / "text_encoder", overlap=overlap) as (
                encoder,
                _,
                handle,
            ):
                text = encoder(ids)
                handles.append(weakref.ref(handle))
            with tp.stage(lambda: ps.build(folder, "transformer"), folder / "transformer", overlap=overlap) as (
                denoiser,
                _,
                handle,
            ):
                ps.denoise_step(denoiser, latents, text, 0)
                handles.append(weakref.ref(handle))
        del encoder, denoiser, handle, _
        assert [h() for h in handles] == [None, None], f"overlap={overlap}: a handle outlived its release"
        assert holding(cycles()) == []
