"""The pipeline runner's budget: the stages never hold more than ``ram=``, all of which is
theirs (the floor of free RAM comes off the machine); a stage read ahead is planned for what
the others free once their reads are in, and loaded at its start when what its load takes at
once does not fit beside the running stage; loads read past the page cache when the files
could not stay in it."""

from __future__ import annotations

import functools
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import trash_panda as tp
from conftest import ReadsWith
from trash_panda import _core
from trash_panda._core import Arrival, Departure
from trash_panda.errors import ArgumentError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import pipeline_stages as ps

from support.runner import ahead, arrivals, fixed_holds, fixed_stages, one_run, stages, until


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ps.save_pipeline(tmp_path_factory.mktemp("budget") / "pipe")


@pytest.fixture(scope="module")
def want(folder: Path) -> torch.Tensor:
    return ps.plain(folder)


def test_a_budget_holds_the_reads_until_the_running_stage_gives_memory_back(folder: Path, want: torch.Tensor) -> None:
    """Within a RAM budget that fits one stage but not two, the denoiser's reads wait in its
    allowance while the encoder runs, and go on once the encoder's release gives its memory."""
    holds = fixed_holds(folder)
    assert set(holds) == {"text_encoder", "transformer", "vae"}
    biggest = max(h.ram for h in holds.values())
    budget = biggest + holds["text_encoder"].ram // 2
    assert budget < holds["text_encoder"].ram + holds["transformer"].ram
    with tp.Pipeline(fixed_stages(folder), ram=budget) as pipe:
        seen: dict[str, Any] = {}

        def look() -> None:
            gate = ahead(pipe, "transformer").allowance
            assert gate is not None
            until(lambda: gate.waiting == 1, "the denoiser's reads never waited for memory")
            seen["gate"] = gate

        assert torch.equal(one_run(pipe, final=False, inside={"text_encoder": look}), want)
        stats = seen["gate"].stats()
        assert stats.waits >= 1 and stats.given > 0
        # The budget does not hold both: the encoder gave back the blocks the denoiser needed
        # (those it runs last) and kept the rest for the next run.
        encoder_record = pipe.records[0]
        assert encoder_record.departure == Departure.KEPT and 0 < encoder_record.given_back < encoder_record.holds
        assert torch.equal(one_run(pipe, final=False), want)
        assert pipe.records[3].arrival == Arrival.KEPT and pipe.records[3].read_again > 0


def test_the_budget_is_all_the_stages_and_the_floor_of_free_ram_comes_off_the_machine(
    folder: Path, want: torch.Tensor
) -> None:
    """With ``min_free_ram`` left at auto (1 to 4 GB, far more than these stages), a budget
    that holds the three stages keeps them all between runs: the floor is kept once, from what
    the machine has free, not out of the budget by each stage's plan."""
    holds = fixed_holds(folder)
    st = stages(folder, activation_vram=0)  # min_free_ram: auto
    st[1].options["resident_blocks"] = 6
    floor = _core.ram_floor([s.options.get("min_free_ram") for s in st])
    assert floor >= 1_000_000_000 > 4 * sum(h.ram for h in holds.values())
    with tp.Pipeline(st, ram=sum(h.ram for h in holds.values())) as pipe:
        for _ in range(2):
            assert torch.equal(one_run(pipe, final=False), want)
        assert arrivals(pipe, 2) == [Arrival.KEPT, Arrival.KEPT, Arrival.KEPT], pipe.report()
        assert {n: s.holds for n, s in pipe._keeper.loaded.items()} == holds
    # Without a budget the stages may take the machine's free memory less the floor (free
    # memory moves by far less than the floor between the two readings).
    with tp.Pipeline(st) as unbounded:
        assert abs(unbounded._keeper._free().ram - _core.Free.probe().keeping(floor).ram) < floor // 4
    with pytest.raises(ArgumentError, match="min_free_ram"):
        tp.Pipeline(stages(folder, min_free_ram="lots"))


def test_the_next_stage_is_planned_for_what_the_others_free_with_their_reads_still_coming(
    loader_reads: ReadsWith, folder: Path, want: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stage read ahead is planned for the memory it gets once the others give theirs:
    what each holds when its reads are in, not what has arrived so far. With the denoiser's
    reads held back while the VAE is set up, the VAE is still planned for the whole budget
    (every other stage given back), as when they are all in."""
    from trash_panda.offload import overlap

    holds = fixed_holds(folder)
    budget = sum(h.ram for h in holds.values()) - holds["vae"].ram // 2
    gate = threading.Event()
    real = overlap.load_block

    def held_back(block: Any, *args: Any) -> None:
        if block.prefix.startswith("transformer_blocks.") and block.prefix != "transformer_blocks.0.":
            gate.wait(30)
        real(block, *args)

    loader_reads(block=held_back)
    ids, latents = ps.inputs()
    with tp.Pipeline(fixed_stages(folder), ram=budget) as pipe, torch.no_grad(), pipe.run() as run:
        with run.stage("text_encoder") as encoder:
            text = encoder(ids)
        with run.stage("transformer") as denoiser:
            try:
                vae = ahead(pipe, "vae")  # set up while the denoiser's reads are held back
                assert pipe._keeper.loaded["transformer"].pending().ram > 0
            finally:
                gate.set()
            for step in range(ps.STEPS):
                latents = ps.denoise_step(denoiser, latents, text, step)
        with run.stage("vae") as decoder:
            assert torch.equal(decoder(latents), want)
    # Its stages keep no floor of free RAM and use no staging pool: the budget, whole.
    assert vae.plan.budgets is not None and vae.plan.budgets.usable_ram == budget


def test_a_stage_whose_own_staging_does_not_fit_beside_the_running_one_is_loaded_at_its_start(
    folder: Path, want: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load takes its own staging buffers as it is set up, before any read its allowance
    gates: a stage read ahead whose buffers do not fit in the memory free beside the running
    stage is loaded at its start instead, and the stages never hold more than the budget. (Its
    buffers are its own where the pipeline's pool was not made: held off here.)"""
    from trash_panda.pipeline.staging import SharedStaging

    def no_pool(self: SharedStaging, plans: Any) -> None:
        self.sized = True

    monkeypatch.setattr(SharedStaging, "size_for", no_pool)
    holds = fixed_holds(folder)
    st = fixed_stages(folder)
    st[2].options["resident_blocks"] = 0  # the VAE streams: staging buffers of its own
    budget = holds["text_encoder"].ram + holds["transformer"].ram + (64 << 10)
    held: list[int] = []

    def note(pipe: tp.Pipeline) -> None:
        pipe.settle()
        held.append(sum(s.held_now().ram for s in pipe._keeper.loaded.values()))

    with tp.Pipeline(st, ram=budget) as pipe:
        noting = {n: functools.partial(note, pipe) for n in ps.COMPONENTS}
        assert torch.equal(one_run(pipe, final=False, inside=noting), want)
        assert held and max(held) <= budget, (held, budget)
        vae = pipe._keeper.loaded["vae"].plan.budgets
        assert vae is not None and vae.host_staging > 64 << 10 and not vae.shared_staging
        assert arrivals(pipe, 1) == [Arrival.READ_AT_START, Arrival.READ_AHEAD, Arrival.READ_AT_START], pipe.report()


def test_a_stage_read_at_its_start_finds_no_more_than_its_budget(folder: Path, want: torch.Tensor) -> None:
    """Within a budget, the memory a stage read at its start found is at most the budget (what
    its loader has read by then is not counted twice)."""
    with tp.Pipeline(stages(folder, min_free_ram=0), ram="100MB", prefetch=False) as pipe:
        assert torch.equal(one_run(pipe), want)
        for r in pipe.records:
            assert r.arrival in (Arrival.READ_AT_START, Arrival.KEPT)
            if r.actual is not None:
                assert r.actual.ram <= 100_000_000, (r.stage, r.actual.ram)


@pytest.mark.parametrize("budget", ["tight", "roomy", "roomy_let_go"])
def test_loads_read_past_the_page_cache_unless_the_files_are_read_again_from_it(
    folder: Path, want: torch.Tensor, budget: str
) -> None:
    """A budget that could not hold the stages and their files' pages together reads past the
    page cache (a copy through it would only take CPU from the running stage); so does one
    that holds every stage loaded, since each file is then read once. Stages let go after their
    turn (``keep=False``) are read again each run, and with the room read through the cache.
    The images are the plain pipeline's either way, and the report says which and why."""
    files = sum(p.stat().st_size for p in folder.rglob("*.safetensors"))
    ram = files + files // 2 if budget == "tight" else 4 * files + (64 << 20)
    buffered = budget == "roomy_let_go"
    with tp.Pipeline(stages(folder, min_free_ram=0), ram=ram, keep=budget != "roomy_let_go") as pipe:
        for _ in range(2):
            assert torch.equal(one_run(pipe), want)
        # What is still loaded read its files as the report says (stages let go hold nothing).
        lanes = [s.state.lane for s in pipe._keeper.loaded.values() if s.state.lane is not None]
        assert bool(lanes) is not buffered and all(lane.direct for lane in lanes)
        first = pipe.report().splitlines()[0]
        why = {
            "tight": "would not stay in the page cache",
            "roomy": "is read once",
            "roomy_let_go": "for their next load",
        }
        assert first.startswith("loads: buffered reads" if buffered else "loads: direct reads"), first
        assert why[budget] in first, first
        assert f"{files / 1e6:.2f} MB of files" in first, first  # its files are a few MB
