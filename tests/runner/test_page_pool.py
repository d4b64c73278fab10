"""The pipeline's pool of pages on the CPU: the pages of a stage let go (released, or blocks it
gave back) take the next stage's reads, already faulted; the pipeline counts the pages kept as
its free memory, holds no more than its budget with them, and gives the ones no stage took back
at the end of each run."""

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
from trash_panda.offload.materialize import FRESH_BYTES, TENSOR_ALIGN

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import pipeline_stages as ps

from support.runner import one_run, stages, until

pytestmark = pytest.mark.skipif(not _core.PagePool.keeps_pages(), reason="this platform keeps no pages")

# Wide enough that the blocks' weights are read into pages of their own (FRESH_BYTES and up).
WIDE = {"text_encoder": {"dim": 512}, "transformer": {"dim": 512, "text_dim": 512}, "vae": {"dim": 512}}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = ps.save_pipeline(tmp_path_factory.mktemp("pages") / "pipe", configs=WIDE)
    return out


@pytest.fixture(scope="module")
def want(folder: Path) -> torch.Tensor:
    return ps.plain(folder)


def _pooled_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.numel() * p.element_size() >= FRESH_BYTES)


def _pending(pipe: tp.Pipeline) -> int:
    return sum(s.pending().ram for s in pipe._keeper.loaded.values())


@pytest.mark.parametrize("denoiser_reads", ["after_the_encoder", "beside_it"])
def test_a_stage_let_go_hands_its_pages_to_the_reads_still_to_come(
    loader_reads: ReadsWith, folder: Path, want: torch.Tensor, denoiser_reads: str
) -> None:
    """Stages let go after their turn (``keep=False``). With the denoiser's reads held back
    until after the encoder's end, the encoder's pages take them, already faulted; with them
    done beside the encoder, no read is left to take its pages and they go to the system at its
    end. The pool never keeps more than the reads still to come will take (the rest would be
    memory held for nothing, which the stages' activations cannot use), and nothing past the
    run. The image is the plain pipeline's, every tensor 64-byte aligned."""
    from trash_panda.offload import overlap

    real = overlap.load_block
    gate = threading.Event()

    def held_back(block: Any, *args: Any) -> None:
        if block.prefix.startswith("transformer_blocks."):
            gate.wait(30)
        real(block, *args)

    held = denoiser_reads == "after_the_encoder"
    if held:
        loader_reads(block=held_back)
    with tp.Pipeline(stages(folder, min_free_ram=0), keep=False) as pipe:
        pages = pipe._keeper.pages
        assert pages is not None
        seen: dict[str, int] = {}
        kept: list[tuple[int, int]] = []

        def note() -> None:
            pipe.settle()
            kept.append((pages.idle_bytes, _pending(pipe)))

        def in_denoiser() -> None:
            note()
            denoiser = pipe._keeper.loaded["transformer"].model
            bad = [n for n, p in denoiser.named_parameters() if p.data_ptr() % TENSOR_ALIGN]
            assert not bad, bad

        def in_encoder() -> None:
            note()
            seen["encoder"] = _pooled_bytes(pipe._keeper.loaded["text_encoder"].model)
            if held:  # the denoiser's blocks go on once the encoder has ended (its end is next)
                threading.Timer(0.5, gate.set).start()
            else:
                until(lambda: pipe._keeper.loaded["transformer"].pending().ram == 0, "the denoiser's reads never ended")

        try:
            got = one_run(pipe, final=False, inside={"transformer": in_denoiser, "text_encoder": in_encoder})
        finally:
            gate.set()
        assert torch.equal(got, want)
        assert seen["encoder"] > 0
        # The encoder's large tensors took the denoiser's reads still to come at its end, or
        # nothing did (the VAE is read ahead after that end, into new pages).
        assert (pages.reused > 0) is held, pages
        assert all(idle <= pending for idle, pending in kept), kept
        assert pages.idle_bytes == 0
        assert "GB read into pages given back" in pipe.report()
        assert torch.equal(one_run(pipe, final=False), want)
    assert pages.idle_bytes == 0


def test_within_a_budget_the_pages_kept_count_as_the_pipelines(
    folder: Path, want: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Within a RAM budget that holds one stage and a half, the encoder gives back the blocks
    the denoiser needs and the denoiser's reads take their pages. What the stages hold and what
    the pool keeps stay within the budget at every point, and the pipeline counts the kept pages
    as free memory for its stages (they take them before new ones)."""
    probe_sizes: dict[str, int] = {}
    with tp.Pipeline(stages(folder, min_free_ram=0, activation_vram=0)) as probe:
        one_run(probe, final=False)
        probe_sizes = {n: s.holds.ram for n, s in probe._keeper.loaded.items()}
    budget = max(probe_sizes.values()) + probe_sizes["text_encoder"] // 2
    assert budget < probe_sizes["text_encoder"] + probe_sizes["transformer"]
    totals: list[int] = []

    with tp.Pipeline(stages(folder, min_free_ram=0, activation_vram=0), ram=budget) as pipe:
        pages = pipe._keeper.pages
        assert pages is not None

        def note() -> None:
            pipe.settle()
            held = sum(s.held_now().ram for s in pipe._keeper.loaded.values())
            totals.append(held + pages.idle_bytes)

        noting = {n: note for n in ps.COMPONENTS}
        for _ in range(2):
            assert torch.equal(one_run(pipe, final=False, inside=noting), want)
        assert pages.reused > 0, pipe.report()
        assert totals and max(totals) <= budget, (totals, budget)

    # Pages kept are free memory to the pipeline, on top of what the machine has free (held
    # still here, as the machine's own figure moves by more than a test's pages between two
    # readings; no budget, which would cap it).
    from trash_panda.pipeline import loaded

    monkeypatch.setattr(loaded, "free_now", lambda device: _core.Free(10 << 30))
    with tp.Pipeline(stages(folder, min_free_ram=0)) as pipe:
        pages = pipe._keeper.pages
        assert pages is not None
        before = pipe._keeper._free().ram
        region = torch.from_dlpack(pages.take(64 << 20))
        pages.want(64 << 20)  # kept when given back
        del region
        assert pages.idle_bytes == 64 << 20
        assert pipe._keeper._free().ram == before + (64 << 20)


def test_a_released_stage_gives_the_system_only_what_the_pool_did_not_keep() -> None:
    """The meter moves a running stage's baseline down by what an idle stage's give-back
    returned to the system: the pages the pool keeps are still the process's."""
    from trash_panda.pipeline.loaded import _to_system

    pages = _core.PagePool()
    kept = [torch.from_dlpack(pages.take(4 << 20))]

    def free() -> int:
        kept.clear()
        return 4 << 20

    assert _to_system(free, pages) == 0
    assert pages.idle_bytes == (4 << 20)
    assert _to_system(functools.partial(int, 1 << 20), None) == 1 << 20
    pages.close()


def test_pages_given_back_beside_a_stage_move_its_window_s_baseline(folder: Path) -> None:
    """The pool gives kept pages back to the system beside a running stage (no read will take
    them): that drop is not the stage's, so its window's baseline moves down by it, and what the
    stage allocates after it still counts as its activations."""
    from trash_panda.offload.meter import measured

    with tp.Pipeline(stages(folder, min_free_ram=0)) as pipe:
        keeper = pipe._keeper
        pages = keeper.pages
        assert pages is not None
        region = torch.from_dlpack(pages.take(64 << 20))
        region.fill_(1)  # its pages present
        pages.want(64 << 20)  # kept when given back
        del region
        assert pages.idle_bytes == 64 << 20
        with measured(torch.device("cpu")) as peak:
            keeper._want_pages()  # nothing loaded reads: the pages go back
            assert pages.idle_bytes == 0
            activations = torch.ones(32 << 20, dtype=torch.uint8)
        del activations
        assert peak[0] >= 30 << 20, peak
