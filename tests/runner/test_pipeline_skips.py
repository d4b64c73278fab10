"""Runs of a pipeline that leave stages out, fail inside a stage, or come in any order of
those, under budgets from roomy to too small to keep anything: every image equals the plain
pipeline's, the stages never hold more than the budget, no run waits forever, and the pipeline
gives everything back."""

from __future__ import annotations

import contextlib
import random
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import trash_panda as tp
from support.runner import within_seconds
from trash_panda import _core

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import pipeline_stages as ps

from support.runner import fixed_holds, fixed_stages, one_run, stages


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ps.save_pipeline(tmp_path_factory.mktemp("skips") / "pipe")


@pytest.fixture(scope="module")
def want(folder: Path) -> torch.Tensor:
    return ps.plain(folder)


@pytest.fixture(scope="module")
def text(folder: Path) -> torch.Tensor:
    """The plain text encoder's output for the example's prompt: what a run without the encoder
    reuses."""
    from safetensors.torch import load_file

    encoder = ps.build(folder, "text_encoder", device="cpu")
    encoder.load_state_dict(load_file(str(folder / "text_encoder" / "diffusion_pytorch_model.safetensors")))
    with torch.no_grad():
        return encoder(ps.inputs()[0])


def test_runs_that_skip_stages_equal_the_plain_pipeline_within_the_budget(folder: Path, want: torch.Tensor) -> None:
    """A run may leave stages out: a second image of the same prompt reuses its text embedding
    (no encoder), and a run may stop before the denoiser that was read for it. Under a budget
    that holds the three stages but for half the VAE, every image still equals the plain one,
    the stages never hold more than the budget, and the pipeline gives everything back."""
    holds = {name: h.ram for name, h in fixed_holds(folder).items()}
    budget = sum(holds.values()) - holds["vae"] // 2
    ids, latents0 = ps.inputs()

    def denoise_and_decode(run: tp.PipelineRun, text: torch.Tensor) -> torch.Tensor:
        latents = latents0
        with run.stage("transformer") as denoiser:
            for step in range(ps.STEPS - 1):
                latents = ps.denoise_step(denoiser, latents, text, step)
            with run.final_pass():
                latents = ps.denoise_step(denoiser, latents, text, ps.STEPS - 1)
        with run.stage("vae") as vae:
            return vae(latents)

    def within_budget() -> None:
        # What the stages hold once the reads they have begun are in (a stage read for a turn
        # the run skipped may still be reading).
        pipe.settle()
        assert sum(s.committed().ram for s in pipe._keeper.loaded.values()) <= budget, pipe.report()

    with tp.Pipeline(fixed_stages(folder), ram=budget) as pipe, torch.no_grad():
        with pipe.run() as run:
            with run.stage("text_encoder") as encoder:
                text = encoder(ids)
            assert torch.equal(denoise_and_decode(run, text), want)
        for _ in range(2):  # the same prompt again: the encoder is not entered
            with pipe.run() as run:
                assert torch.equal(denoise_and_decode(run, text), want)
            within_budget()
        # The encoder alone: the denoiser read for this run is not used.
        with pipe.run() as run, run.stage("text_encoder") as encoder:
            assert torch.equal(encoder(ids), text)
        within_budget()
        with pipe.run() as run:  # a whole run after it
            with run.stage("text_encoder") as encoder:
                assert torch.equal(encoder(ids), text)
            assert torch.equal(denoise_and_decode(run, text), want)
        within_budget()
        assert [r.run for r in pipe.records] == [1, 1, 1, 2, 2, 3, 3, 4, 5, 5, 5], pipe.report()
    assert pipe.loaded == [] and pipe._keeper.pending is None


def test_blocks_read_ahead_for_a_skipped_turn_are_given_back_without_waiting(folder: Path, want: torch.Tensor) -> None:
    """A kept stage reading its given-back blocks ahead of a turn that a run skips waits for
    memory no stage will free; when another stage then needs room from it, the reads stop (the
    blocks not read stay given back) instead of being waited for, and its next turn reads them."""
    with tp.Pipeline(fixed_stages(folder)) as pipe:
        assert torch.equal(one_run(pipe), want)
        encoder = pipe._keeper.loaded["text_encoder"]
        gave = encoder.give_back(1)
        assert gave > 0 and encoder.given
        encoder.refill(_core.Allowance("text_encoder", 0))  # never given memory
        assert encoder.loader is not None and not encoder.loader.done

        def give_more() -> None:
            more = encoder.give_back(gave + 1)
            assert more >= gave + 1

        within_seconds(60, give_more)
        given = [b.prefix for b in encoder.given]
        assert encoder.given_back == _core.resident_among(encoder.plan, given).bytes > gave
        assert encoder.pending() == _core.Holds()
        for _ in range(2):
            assert torch.equal(one_run(pipe), want)
        assert next(r for r in pipe.records if r.run == 2 and r.stage == "text_encoder").read_again > gave


def test_runs_that_skip_a_stage_reading_ahead_do_not_wait_for_it(folder: Path, want: torch.Tensor) -> None:
    """The run patterns that hung: the encoder kept and reading its blocks ahead of a run
    that starts at another stage, which takes room from it."""
    holds = {name: h.ram for name, h in fixed_holds(folder).items()}
    ids, latents0 = ps.inputs()

    def runs() -> None:
        with tp.Pipeline(stages(folder, min_free_ram=0), ram=sum(holds.values()) * 95 // 100) as pipe:
            for pattern, final in [("transformer", False), ("vae", False), ("transformer", True), ("text vae", False)]:
                with torch.no_grad(), pipe.run() as run:
                    if "text" in pattern:
                        with run.stage("text_encoder") as encoder:
                            encoder(ids)
                    if "transformer" in pattern:
                        with run.stage("transformer") as denoiser:
                            latents = latents0
                            for step in range(ps.STEPS - 1):
                                latents = ps.denoise_step(denoiser, latents, torch.zeros(1, 12, 128), step)
                            with run.final_pass() if final else contextlib.nullcontext():
                                ps.denoise_step(denoiser, latents, torch.zeros(1, 12, 128), ps.STEPS - 1)
                    if "vae" in pattern:
                        with run.stage("vae") as vae:
                            vae(latents0)
            assert torch.equal(one_run(pipe), want)

    within_seconds(120, runs)


class _StopError(Exception):
    """Raised inside a stage by the random runs, as a user's code might fail there."""


def _random_runs(folder: Path, want: torch.Tensor, text_ref: torch.Tensor, rng: random.Random) -> str:
    """One pipeline, a few runs of random stages, some failing inside a stage; returns what was
    run, for the failure message."""
    holds = sum(h.ram for h in fixed_holds(folder).values())
    share = rng.choice([0.15, 0.5, 0.8, 0.9, 0.95, 1.5, None])
    budget = None if share is None else int(holds * share)
    options: dict[str, Any] = rng.choice(
        [{}, {"min_free_ram": 0}, {"min_free_ram": 0}]
        + ([{"resident_blocks": 1, "min_free_ram": 0}] if (share or 2) >= 0.7 else [])
    )
    keep, prefetch = rng.random() < 0.8, rng.random() < 0.8
    ids, latents0 = ps.inputs()
    said = [f"budget {budget} ({share}), options {options}, keep {keep}, prefetch {prefetch}"]
    with tp.Pipeline(stages(folder, **options), ram=budget, keep=keep, prefetch=prefetch) as pipe, torch.no_grad():
        for _ in range(rng.randint(2, 5)):
            entered = rng.choice(["etv", "etv", "tv", "e", "et", "v", "t", "ev", "t", "v"])
            final = rng.random() < 0.6
            stop = rng.choice(["", "", "", "", "", "e", "t", "f", "v"])
            said.append(f"run {entered} final={final} stop={stop or '-'}")
            with contextlib.suppress(_StopError), pipe.run() as run:
                if "e" in entered:
                    with run.stage("text_encoder") as encoder:
                        assert torch.equal(encoder(ids), text_ref), said
                        if stop == "e":
                            raise _StopError
                latents = latents0
                if "t" in entered:
                    with run.stage("transformer") as denoiser:
                        for step in range(ps.STEPS - 1):
                            latents = ps.denoise_step(denoiser, latents, text_ref, step)
                            if stop == "t" and step == 1:
                                raise _StopError
                        with run.final_pass() if final else contextlib.nullcontext():
                            if stop == "f":  # the final pass stops halfway: some blocks freed
                                ps.denoise_step(denoiser, latents, text_ref, ps.STEPS - 1)
                                raise _StopError
                            latents = ps.denoise_step(denoiser, latents, text_ref, ps.STEPS - 1)
                if "v" in entered:
                    with run.stage("vae") as vae:
                        image = vae(latents)
                        # Without the denoiser this run, the VAE decodes the starting latents.
                        assert "t" not in entered or torch.equal(image, want), said
                        if stop == "v":
                            raise _StopError
            pipe.settle()
            committed = sum(s.committed().ram for s in pipe._keeper.loaded.values())
            assert budget is None or committed <= budget, (committed, said, pipe.report())
    assert pipe.loaded == [] and pipe._keeper.pending is None, said
    return "; ".join(said)


@pytest.mark.parametrize("seed", range(40))
def test_random_runs_equal_the_plain_pipeline_within_the_budget(
    folder: Path, want: torch.Tensor, text: torch.Tensor, seed: int
) -> None:
    within_seconds(120, lambda: _random_runs(folder, want, text, random.Random(seed)))
