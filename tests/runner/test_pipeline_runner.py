"""The pipeline runner (trash_panda.Pipeline): the tiny three-stage pipeline of
examples/pipeline_stages.py run several times equals the plain pipeline bit for bit, while the
next stage is read behind the running one, within a memory budget, kept between runs when it
fits, and planned again when the memory at its start missed the prediction."""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import trash_panda as tp
from support.runner import ahead, arrivals, fixed_holds, fixed_stages, one_run, stages, until
from trash_panda import _core
from trash_panda._core import Arrival, Departure
from trash_panda.errors import ArgumentError, StreamError
from trash_panda.pipeline.loaded import LoadedStage

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import pipeline_stages as ps


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ps.save_pipeline(tmp_path_factory.mktemp("runner") / "pipe")


@pytest.fixture(scope="module")
def want(folder: Path) -> torch.Tensor:
    return ps.plain(folder)


def test_runs_equal_the_plain_pipeline_and_keep_what_fits(folder: Path, want: torch.Tensor) -> None:
    with tp.Pipeline(stages(folder)) as pipe:
        for _ in range(3):
            assert torch.equal(one_run(pipe), want)
        # The first run reads each stage ahead of its turn but the first; with the machine's
        # RAM, later runs find every stage still loaded: the denoiser's final pass frees
        # nothing the VAE does not need.
        assert arrivals(pipe, 1) == [Arrival.READ_AT_START, Arrival.READ_AHEAD, Arrival.READ_AHEAD]
        assert arrivals(pipe, 2) == arrivals(pipe, 3) == [Arrival.KEPT, Arrival.KEPT, Arrival.KEPT]
        assert [r.departure for r in pipe.records if r.run == 2] == [Departure.KEPT, Departure.KEPT, Departure.KEPT]
        assert all(r.given_back == r.read_again == 0 for r in pipe.records)
        assert pipe.loaded == ["text_encoder", "transformer", "vae"]
        text = pipe.report()
        assert "run 2 text_encoder: kept from the run before" in text
        assert "run 1 transformer: read ahead" in text and "free memory predicted RAM" in text
    assert pipe.loaded == []
    with pytest.raises(ArgumentError, match="closed"), pipe.run():
        pass


def test_the_next_stage_is_read_while_the_running_one_computes(folder: Path, want: torch.Tensor) -> None:
    with tp.Pipeline(stages(folder), keep=False) as pipe:

        def denoiser_arrives() -> None:
            denoiser = ahead(pipe, "transformer")
            until(lambda: denoiser.loader is not None and denoiser.loader.remaining_bytes == 0, "never read")
            assert pipe.loaded == ["text_encoder", "transformer"]

        assert torch.equal(one_run(pipe, inside={"text_encoder": denoiser_arrives}), want)
        rec = next(r for r in pipe.records if r.stage == "transformer")
        assert rec.arrival == Arrival.READ_AHEAD
        assert rec.read_before_start == pipe.records[1].read_before_start > 0
        # keep=False: nothing stays once the run is over.
        assert pipe.loaded == []


def test_the_next_stage_is_set_up_while_the_running_one_computes(folder: Path, want: torch.Tensor) -> None:
    """Building, planning and loading the stage read ahead happen on a thread of their own: the
    encoder's block runs while the denoiser's build_fn still waits, and the image is the same."""
    go, built = threading.Event(), threading.Event()

    def build_denoiser() -> torch.nn.Module:
        assert go.wait(60), "the encoder's block never ran while the denoiser was being built"
        built.set()
        return ps.build(folder, "transformer")

    st = stages(folder)
    st[1] = tp.Stage("transformer", build_denoiser, folder / "transformer")
    with tp.Pipeline(st) as pipe:

        def entered() -> None:
            assert not built.is_set()
            go.set()

        assert torch.equal(one_run(pipe, inside={"text_encoder": entered}), want)
        assert built.is_set()
        assert arrivals(pipe, 1) == [Arrival.READ_AT_START, Arrival.READ_AHEAD, Arrival.READ_AHEAD]


def test_a_read_ahead_that_fails_is_released_and_loaded_at_its_start(
    folder: Path, want: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error on the read-ahead's thread after the denoiser's load was set up: a warning
    says why, the half-loaded denoiser is released, and it is loaded at its start instead."""
    import trash_panda.pipeline.keeper as pipeline_mod
    from trash_panda.offload.state import get_state

    real = pipeline_mod.remembered_activation
    encoder_key = os.path.abspath(folder / "text_encoder")

    def failing(key: Any) -> int | None:
        # Read for the running stage's peak once the stage ahead is loaded, on its thread.
        if threading.current_thread().name.startswith("trash-panda-ahead") and str(key) == encoder_key:
            raise OSError("the disk went away")
        return real(key)

    monkeypatch.setattr(pipeline_mod, "remembered_activation", failing)
    with tp.Pipeline(stages(folder)) as pipe:

        def look() -> None:
            with pytest.warns(RuntimeWarning, match="(?s)reading stage transformer ahead failed.*the disk went away"):
                pipe.settle()
            assert "transformer" not in pipe._keeper.loaded
            assert get_state(pipe._keeper.models["transformer"]) is None
            monkeypatch.setattr(pipeline_mod, "remembered_activation", real)

        assert torch.equal(one_run(pipe, inside={"text_encoder": look}), want)
        assert arrivals(pipe, 1) == [Arrival.READ_AT_START, Arrival.READ_AT_START, Arrival.READ_AHEAD]


def test_a_build_that_fails_ahead_fails_again_at_the_stage_start(folder: Path) -> None:
    """A build_fn that raises on the read-ahead's thread is warned about, and raises again on
    the caller's when the stage starts."""

    def broken() -> torch.nn.Module:
        raise ValueError("no such model")

    st = stages(folder)
    st[1] = tp.Stage("transformer", broken, folder / "transformer")
    ids, _ = ps.inputs()
    with tp.Pipeline(st) as pipe, torch.no_grad(), pipe.run() as run:
        # Its end gives the encoder's memory to the stage read ahead: it waits for it first.
        warned = pytest.warns(RuntimeWarning, match="reading stage transformer ahead failed")
        with warned, run.stage("text_encoder") as encoder:
            encoder(ids)
        with pytest.raises(ValueError, match="no such model"), run.stage("transformer"):
            pass
        assert pipe.loaded == ["text_encoder"]


def test_a_stage_is_planned_again_when_its_start_misses_the_prediction(folder: Path, want: torch.Tensor) -> None:
    with tp.Pipeline(stages(folder, min_free_ram=0)) as pipe:

        def shrink() -> None:
            # Planned for the machine's free memory the denoiser has every block resident; from
            # its start on, the budget is 1 MB short of what the two stages hold.
            both = pipe._keeper.loaded["text_encoder"].holds.ram + ahead(pipe, "transformer").holds.ram
            pipe._keeper.ram = both - (1 << 20)

        assert torch.equal(one_run(pipe, inside={"text_encoder": shrink}), want)
        rec = next(r for r in pipe.records if r.stage == "transformer")
        assert rec.arrival == Arrival.REPLANNED
        assert "planned again: RAM free at the start was" in pipe.report()


def test_a_stage_that_finds_more_memory_than_predicted_keeps_its_load(folder: Path, want: torch.Tensor) -> None:
    """More memory than predicted at its start, beyond the margin, plans every block of the
    denoiser in the tier it was read into: the stage read ahead is used as it is, not read
    again, and the report shows the prediction against what it found."""
    from trash_panda.pipeline.loaded import free_now

    more = 1 << 30
    if free_now(torch.device("cpu")).ram < 2 * more:
        pytest.skip("needs 2 GiB of free RAM")
    with tp.Pipeline(stages(folder, min_free_ram=0), ram="100MB") as pipe:
        seen: list[LoadedStage] = []

        def grow() -> None:
            seen.append(ahead(pipe, "transformer"))
            pipe._keeper.ram = 100_000_000 + more

        def same() -> None:
            seen.append(pipe._keeper.loaded["transformer"])

        assert torch.equal(one_run(pipe, inside={"text_encoder": grow, "transformer": same}), want)
        assert seen[0] is seen[1]
        rec = next(r for r in pipe.records if r.stage == "transformer")
        assert rec.arrival == Arrival.READ_AHEAD
        assert rec.predicted is not None and rec.actual is not None
        assert rec.actual.ram > rec.predicted.ram and _core.replan(rec.predicted, rec.actual) is not None
        text = pipe.report()
        assert "run 1 transformer: read ahead" in text and "planned again" not in text


def test_a_final_pass_gives_each_freed_block_to_the_stage_read_ahead(folder: Path, want: torch.Tensor) -> None:
    # keep=False: the denoiser is not kept for a next run, so its pass frees every block.
    with tp.Pipeline(stages(folder), keep=False) as pipe:
        before: list[int] = []
        gates: list[_core.Allowance] = []

        def watch() -> None:
            gate = ahead(pipe, "vae").allowance
            assert gate is not None
            before.append(gate.stats().given)
            gates.append(gate)

        assert torch.equal(one_run(pipe, inside={"transformer": watch}), want)
        gate = gates[0]
        denoiser = pipe.records[1]
        assert denoiser.departure == Departure.FINAL_PASS
        # The pass's freed blocks, then the release of the rest: the denoiser's whole holding.
        assert gate.stats().given - before[0] == denoiser.holds > 0


def test_an_error_in_a_stage_releases_it_and_the_next_run_goes_on(folder: Path, want: torch.Tensor) -> None:
    with tp.Pipeline(stages(folder)) as pipe:

        def fail() -> None:
            raise RuntimeError("the user's code failed")

        with pytest.raises(RuntimeError, match="the user's code failed"):
            one_run(pipe, inside={"transformer": fail})
        assert pipe.records[-1].departure == Departure.FAILED
        assert "transformer" not in pipe.loaded
        assert torch.equal(one_run(pipe), want)


def test_arguments_are_checked(folder: Path) -> None:
    build = lambda: ps.build(folder, "vae")  # noqa: E731
    with pytest.raises(ArgumentError, match="not plan\\(\\) options.*max_vram"):
        tp.Stage("vae", build, folder / "vae", options={"max_vrm": "1GB"})
    with pytest.raises(ArgumentError, match="build_fn"):
        tp.Stage("vae", 3, folder / "vae")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="vae named twice"):
        tp.Pipeline([tp.Stage("vae", build, folder / "vae")] * 2)
    with pytest.raises(ArgumentError, match="prefetch: expected True or False"):
        tp.Pipeline(stages(folder), prefetch="yes")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="ram"):
        tp.Pipeline(stages(folder), ram="lots")
    with tp.Pipeline(stages(folder)) as pipe, pipe.run() as run:
        with pytest.raises(ArgumentError, match="no stage is running"), run.final_pass():
            pass
        unknown = "not a stage of this pipeline; its stages are text_encoder"
        with pytest.raises(ArgumentError, match=unknown), run.stage("unet"):
            pass
        with run.stage("transformer"):
            pass
        with pytest.raises(ArgumentError, match="comes before 'transformer'"), run.stage("text_encoder"):
            pass


def test_two_threads_starting_runs_at_once_get_one_run(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs go one after another: of two threads that start a run at the same moment, one
    gets it and the other the error, even when setting the run up takes a while."""
    import trash_panda.pipeline.runner as pipeline_mod

    real = pipeline_mod.PipelineRun

    def slow(*args: Any) -> Any:
        time.sleep(0.2)  # the window between the check and the run being set
        return real(*args)

    monkeypatch.setattr(pipeline_mod, "PipelineRun", slow)
    barrier, outcomes = threading.Barrier(2), []

    def start(pipe: tp.Pipeline) -> None:
        barrier.wait()
        try:
            with pipe.run():
                time.sleep(0.5)
            outcomes.append("ran")
        except ArgumentError as e:
            outcomes.append(str(e))

    with tp.Pipeline(stages(folder)) as pipe:
        threads = [threading.Thread(target=start, args=(pipe,)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(outcomes) == [
        "a run of this pipeline is already going on; runs go one after another",
        "ran",
    ], outcomes


def test_the_allowance_waits_without_the_gil() -> None:
    gate = _core.Allowance("next", 10)
    done = threading.Event()

    def reader() -> None:
        gate.take(100)
        done.set()

    t = threading.Thread(target=reader)
    t.start()
    until(lambda: gate.waiting == 1, "the read never waited")
    # Python runs while the reader waits, and the memory it gives wakes it.
    counted = sum(range(10_000))
    gate.give(90)
    t.join(timeout=60)
    assert done.is_set() and counted == 49_995_000
    assert gate.available == 0 and gate.stats().waits == 1
    gate.close()
    with pytest.raises(StreamError, match='allowance of stage "next" was closed'):
        gate.take(1)


def test_holds_counts_what_a_loaded_stage_holds(folder: Path) -> None:
    """On the CPU a loaded stage holds its resident blocks and outside weights as the plan
    counts them, and Holds adds the staging pool and the expansion buffer to them."""
    from trash_panda.offload.reads import held_bytes

    with tp.Pipeline(stages(folder)) as pipe, pipe.run() as run, run.stage("transformer") as model:
        loaded = pipe._keeper.loaded["transformer"]
        assert loaded.loader is not None
        until(lambda: loaded.loader.remaining_bytes == 0, "the loader never finished")  # type: ignore[union-attr]
        state = loaded.state
        budgets = loaded.plan.budgets
        assert budgets is not None
        on_device = [b for b in state.blocks if b.tier == tp.Tier.DEVICE]
        resident = sum(held_bytes(spec, state.device) for b in on_device for spec in b.tensors)
        outside = sum(p.nbytes for name, m in state.outside_modules.items() for p in m.parameters(recurse=False))
        assert resident == budgets.device_used > 0
        assert outside == budgets.outside > 0
        assert loaded.holds.ram == budgets.device_used + budgets.outside + budgets.host_staging + budgets.expansion
        assert loaded.holds.vram == 0
        assert model is loaded.model


def test_a_ram_tier_held_in_memory_is_read_ahead_on_the_loader(
    folder: Path, want: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With TRASH_PANDA_RAM_IN_MEMORY=1, a stage read ahead leaves its RAM tier to its loader
    thread (through its lane, within its allowance) instead of reading it on the caller's."""
    monkeypatch.setenv("TRASH_PANDA_RAM_IN_MEMORY", "1")
    threads: list[str] = []
    real = _core.Engine.load_ram_tier

    def watched(engine: Any) -> Any:
        threads.append(threading.current_thread().name)
        return real(engine)

    monkeypatch.setattr(_core.Engine, "load_ram_tier", watched, raising=False)
    # Two of the denoiser's blocks on the RAM tier.
    st = stages(folder)
    st[1].options["resident_blocks"] = 4
    st[1].options["vram"] = "1TB"
    with tp.Pipeline(st, keep=False) as pipe:
        assert torch.equal(one_run(pipe), want)
        assert "trash-panda-loader" in threads, threads


def test_each_model_is_built_once_and_loaded_as_often_as_needed(folder: Path, want: torch.Tensor) -> None:
    builds: list[str] = []

    def counted(name: str) -> torch.nn.Module:
        builds.append(name)
        return ps.build(folder, name)

    st = [tp.Stage(n, (lambda n=n: counted(n)), folder / n) for n in ps.COMPONENTS]
    with tp.Pipeline(st, keep=False) as pipe:
        for _ in range(2):
            assert torch.equal(one_run(pipe), want)
        # keep=False released every stage after each run, and each was loaded again.
        assert [r.arrival for r in pipe.records if r.run == 2] == [
            Arrival.READ_AT_START,
            Arrival.READ_AHEAD,
            Arrival.READ_AHEAD,
        ]
    assert sorted(builds) == sorted(ps.COMPONENTS)


def test_a_kept_stage_gives_back_only_what_the_next_one_needs(folder: Path, want: torch.Tensor) -> None:
    """Under a budget that holds the three stages but for half the VAE, the denoiser's final
    pass frees just the blocks the VAE needs, the rest stays for the next run, which reads the
    freed blocks again ahead of the denoiser's turn; every image equals the plain one."""
    holds = {name: h.ram for name, h in fixed_holds(folder).items()}
    budget = sum(holds.values()) - holds["vae"] // 2
    with tp.Pipeline(fixed_stages(folder), ram=budget) as pipe:
        assert torch.equal(one_run(pipe), want)
        denoiser = pipe.records[1]
        assert denoiser.departure == Departure.KEPT, pipe.report()
        assert 0 < denoiser.given_back < denoiser.holds
        model = pipe._keeper.models["transformer"]
        ids, latents = ps.inputs()
        with pytest.raises(StreamError, match="given back to make room for another stage"), torch.no_grad():
            ps.denoise_step(model, latents, torch.zeros(ids.shape[0], ids.shape[1], 128), 0)
        for _ in range(2):
            assert torch.equal(one_run(pipe), want)
            # The encoder gave back blocks during this run: the next run's first stage read
            # them again behind the VAE's compute, before that run began.
            gave = next(r.given_back for r in reversed(pipe.records) if r.stage == "text_encoder")
            encoder = pipe._keeper.loaded["text_encoder"]
            pipe.settle()
            assert encoder.given == [] and encoder.read_again == gave
        assert any(r.stage == "text_encoder" and r.read_again for r in pipe.records), pipe.report()
        # Run 2 reads the denoiser's freed blocks again; later runs take from whichever stage
        # is needed again last, so what each reads again varies, but no stage is read whole.
        again = next(r for r in pipe.records if r.stage == "transformer" and r.run == 2)
        assert again.arrival == Arrival.KEPT and again.read_again == denoiser.given_back, pipe.report()
        assert all(r.arrival == Arrival.KEPT for r in pipe.records if r.run > 1)
        assert "given back meanwhile and read again" in pipe.report()
        # Never more than the budget's worth of stages held at once.
        assert sum(s.held_now().ram for s in pipe._keeper.loaded.values()) <= budget


def test_the_next_run_is_not_read_beside_a_stage_no_run_has_measured(
    folder: Path, want: torch.Tensor, tmp_path: Path
) -> None:
    """The first stage's blocks given back are read again for a run that may not come: beside
    a last stage whose working memory is not known yet (its first run), that waits for the
    stage's end; once it is known, it goes behind the stage's compute."""
    fresh = [dataclasses.replace(s, key=tmp_path / s.name) for s in stages(folder)]
    with tp.Pipeline(fresh) as pipe:
        ids, latents = ps.inputs()
        for run_number in (1, 2):
            with torch.no_grad(), pipe.run() as run:
                with run.stage("text_encoder") as encoder:
                    text = encoder(ids)
                with run.stage("transformer") as denoiser:
                    x = latents
                    for step in range(ps.STEPS):
                        x = ps.denoise_step(denoiser, x, text, step)
                    first = pipe._keeper.loaded["text_encoder"]
                    gave = first.give_back(first.sheddable())
                    assert gave > 0
                with run.stage("vae") as vae:
                    image = vae(x)
                    refill = ahead(pipe, "text_encoder").allowance
                    assert refill is not None and first.read_again == gave
                    if run_number == 1:  # the VAE's need is unknown: nothing read yet
                        time.sleep(0.1)
                        assert refill.stats().taken == 0, pipe.report()
                    else:
                        until(lambda r=refill: r.stats().taken > 0, "the refill behind the VAE")
            assert torch.equal(image, want)
            # Either way the blocks were read again before the next run's first stage.
            until(lambda s=first: s.loader is not None and s.loader.done, "the refill")
    encoder_runs = [r for r in pipe.records if r.stage == "text_encoder"]
    assert encoder_runs[1].arrival == Arrival.KEPT and encoder_runs[1].read_again == gave, pipe.report()


def test_blocks_given_back_beside_a_running_stage_do_not_hide_its_activations(folder: Path, want: torch.Tensor) -> None:
    """An idle stage gives back blocks while another stage's window is open (the next stage's
    set-up does it on its own thread): the memory it frees is not taken off that window's
    activations."""
    from trash_panda.offload.meter import measured

    with tp.Pipeline(stages(folder)) as pipe:
        assert torch.equal(one_run(pipe), want)
        idle = pipe._keeper.loaded["transformer"]
        freed = idle.sheddable()
        activations = freed + 8 * 2**20
        with measured(torch.device("cpu")) as peak:
            assert idle.give_back(freed) == freed
            x = torch.ones(activations // 4)
            time.sleep(0.1)  # the meter samples every millisecond, on a thread a busy machine may delay
            del x
        # Taken off, the freed bytes would leave activations - freed; the heap's own pages
        # blur the reading by a megabyte or so, far less than half of them.
        assert peak[0] >= activations - freed // 2, (peak[0], activations, freed)
        assert torch.equal(one_run(pipe), want)  # its blocks are read again at its turn


def test_the_report_repeats_the_warnings_of_each_plan_a_stage_is_loaded_by(folder: Path, want: torch.Tensor) -> None:
    """A budget too small to keep the denoiser's blocks in RAM streams them from disk; its plan
    says so, and so does the pipeline's report, once per load (a kept stage was reported)."""
    holds = {name: h.ram for name, h in fixed_holds(folder).items()}
    with tp.Pipeline(stages(folder, resident_blocks=1, min_free_ram=0), ram=sum(holds.values()) * 4 // 5) as pipe:
        for _ in range(2):
            assert torch.equal(one_run(pipe), want)
        first = next(r for r in pipe.records if r.stage == "transformer")
        assert any("read from disk every pass" in w for w in first.plan_warnings), pipe.report()
        assert f"its plan warns: {first.plan_warnings[0]}" in pipe.report()
        kept = [r for r in pipe.records if r.arrival == Arrival.KEPT]
        assert kept and all(r.plan_warnings == [] for r in kept), pipe.report()
