"""The pipeline's pool of pages on the CPU: the pages of a stage let go (released, or blocks it
gave back) take the next stage's reads, already faulted; the pipeline counts the pages kept as
its free memory, holds no more than its budget with them, and gives the ones no stage took back
at the end of each run."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch

import trash_panda as tp
from trash_panda import _core
from trash_panda.offload.materialize import FRESH_BYTES, TENSOR_ALIGN

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import pipeline_stages as ps

from support.runner import one_run, stages

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


def test_a_stage_let_go_hands_its_pages_to_the_stage_read_after_it(folder: Path, want: torch.Tensor) -> None:
    """Stages let go after their turn (``keep=False``): the VAE, read ahead while the denoiser
    runs, is read into the pages the text encoder gave back at its end, not new ones. The image
    is the plain pipeline's, every tensor 64-byte aligned, and no page is kept past the run."""
    with tp.Pipeline(stages(folder, min_free_ram=0), keep=False) as pipe:
        pages = pipe._keeper.pages
        assert pages is not None
        seen: dict[str, int] = {}

        def in_denoiser() -> None:
            denoiser = pipe._keeper.loaded["transformer"].model
            bad = [n for n, p in denoiser.named_parameters() if p.data_ptr() % TENSOR_ALIGN]
            assert not bad, bad

        def in_encoder() -> None:
            seen["encoder"] = _pooled_bytes(pipe._keeper.loaded["text_encoder"].model)

        got = one_run(pipe, final=False, inside={"transformer": in_denoiser, "text_encoder": in_encoder})
        assert torch.equal(got, want)
        vae = _pooled_bytes(ps.COMPONENTS["vae"](**WIDE["vae"]))
        assert vae > 0 and seen["encoder"] >= vae
        # Every large tensor of the VAE in the encoder's pages (the denoiser's came first, new).
        assert pages.reused >= vae, (vae, pages)
        assert pages.idle_bytes == 0
        assert "GB read into pages given back" in pipe.report()
        assert torch.equal(one_run(pipe, final=False), want)
    assert pages.idle_bytes == 0


def test_within_a_budget_the_pages_kept_count_as_the_pipelines(folder: Path, want: torch.Tensor) -> None:
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

        # Pages kept are free memory to the pipeline: a region given back shows in _free().
        before = pipe._keeper._free().ram
        region = torch.from_dlpack(pages.take(8 << 20))
        del region
        assert pages.idle_bytes >= 8 << 20
        after = pipe._keeper._free().ram
        assert after >= before - (1 << 20), (before, after)
        pages.trim()


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
