"""The pipeline runner tests' pipeline (examples/pipeline_stages.py): its stages, one run of it,
plans that do not move, and waiting for the read-ahead."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import trash_panda as tp
from trash_panda import _core
from trash_panda.pipeline.loaded import LoadedStage

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import pipeline_stages as ps


def stages(folder: Path, **options: Any) -> list[tp.Stage]:
    return [tp.Stage(n, (lambda n=n: ps.build(folder, n)), folder / n, options=dict(options)) for n in ps.COMPONENTS]


def one_run(pipe: tp.Pipeline, final: bool = True, inside: dict[str, Callable[[], None]] | None = None) -> torch.Tensor:
    """One image; ``inside[name]()`` is called in the stage ``name`` after its first call."""
    inside = inside or {}
    ids, latents = ps.inputs()
    with torch.no_grad(), pipe.run() as run:
        with run.stage("text_encoder") as encoder:
            text = encoder(ids)
            inside.get("text_encoder", lambda: None)()
        with run.stage("transformer") as denoiser:
            for step in range(ps.STEPS - 1):
                latents = ps.denoise_step(denoiser, latents, text, step)
            inside.get("transformer", lambda: None)()
            if final:
                with run.final_pass():
                    latents = ps.denoise_step(denoiser, latents, text, ps.STEPS - 1)
            else:
                latents = ps.denoise_step(denoiser, latents, text, ps.STEPS - 1)
        with run.stage("vae") as vae:
            return vae(latents)


def fixed_stages(folder: Path) -> list[tp.Stage]:
    """Plans that do not move with the peaks earlier tests left: every block of the denoiser
    resident, no activation memory counted."""
    out = stages(folder, min_free_ram=0, activation_vram=0)
    out[1].options["resident_blocks"] = 6
    return out


def fixed_holds(folder: Path) -> dict[str, _core.Holds]:
    """What each stage of :func:`fixed_stages` holds, loaded with no budget."""
    with tp.Pipeline(fixed_stages(folder)) as probe:
        one_run(probe, final=False)
        return {name: s.holds for name, s in probe._keeper.loaded.items()}


def arrivals(pipe: tp.Pipeline, run: int) -> list[_core.Arrival]:
    return [r.arrival for r in pipe.records if r.run == run]


def ahead(pipe: tp.Pipeline, name: str) -> LoadedStage:
    """The stage ``name`` read ahead, once its thread has set it up."""
    pipe.settle()
    return pipe._keeper.loaded[name]


def until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60  # guards against a hang; nothing asserts a time
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def within_seconds(seconds: float, work: Callable[[], None]) -> None:
    """Runs ``work`` on a thread of its own and fails (instead of hanging) past ``seconds``."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as e:
            failure.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s: a wait that never ends"
    if failure:
        raise failure[0]
