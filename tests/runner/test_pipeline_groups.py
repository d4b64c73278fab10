"""Groups of a pipeline's stages run together under one budget: experts that take turns, a
ControlNet beside its denoiser, a draft beside its target. Outputs are bit-equal to the plain
models on budgets where both members fit, where only one does and where neither does; the
schedule (given, or learned from the first run) decides how the members share the memory,
and the report says it."""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
import torch
from torch import nn

import trash_panda as tp
from support import groups as gs
from trash_panda import _core
from trash_panda.errors import ArgumentError

EXPERTS = ["high", "low"]
GUIDED = ["controlnet", "unet"]
ASSISTED = ["draft", "target"]
MiB = 1 << 20


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gs.save_members(tmp_path_factory.mktemp("groups"), EXPERTS + GUIDED + ASSISTED)


def holds(folder: Path, names: list[str], ram: int | str = "1GB") -> dict[str, int]:
    """What each member holds with every block resident (RAM, on the CPU); with ``ram=0``,
    the least it needs (every block streamed)."""
    out = {}
    for name in names:
        plan = tp.plan(gs.build(name), folder / name, ram=ram, min_free_ram=0, activation_vram=0, device="cpu")
        out[name] = plan.holds(name).ram
    return out


def budgets(folder: Path, names: list[str]) -> dict[str, int | None]:
    """Both members fit; only the larger does; neither does. Members that take turns have the
    budget to themselves at their turn; members loaded together need at least what each needs
    with every block streamed, so their "neither" is that and a little."""
    h = holds(folder, names)
    big = max(h.values())
    least = sum(holds(folder, names, ram=0).values())
    neither = big * 3 // 4 if names == EXPERTS else least + 64 * 1024
    assert neither < min(h.values()) or names != EXPERTS
    assert neither < big and neither < sum(h.values()) - 64 * 1024
    return {"both": None, "one": big + big // 2, "neither": neither}


def runs(
    folder: Path,
    names: list[str],
    ram: int | None,
    work: Callable[[Mapping[str, nn.Module]], torch.Tensor],
    schedule: object = None,
    count: int = 3,
    **options: object,
) -> tp.Pipeline:
    """``count`` runs of the group, each compared with the plain models; the pipeline, closed."""
    want = work(gs.plain(folder, names))
    pipe = tp.Pipeline(gs.stages(folder, names, **options), groups=[tp.Group("g", names)], ram=ram)
    with pipe:
        for number in range(count):
            with pipe.run() as run, run.group("g", schedule=schedule) as members:  # type: ignore[arg-type]
                assert set(members) == set(names)
                got = work(members)
            assert torch.equal(got, want), f"run {number + 1}\n{pipe.report()}"
    return pipe


@pytest.mark.parametrize("fits", ["both", "one", "neither"])
@pytest.mark.parametrize("given", [False, True], ids=["learned", "given"])
def test_experts_take_turns_bit_equal(folder: Path, fits: str, given: bool) -> None:
    schedule = {"high": gs.BOUNDARY, "low": gs.STEPS - gs.BOUNDARY} if given else None
    pipe = runs(folder, EXPERTS, budgets(folder, EXPERTS)[fits], gs.experts, schedule)
    records = pipe._keeper.group_records
    if given:
        assert [g.sharing for g in records] == [_core.Sharing.TURNS] * 3
        assert all(g.learned_in is None for g in records)
    else:
        # No schedule yet: loaded together and learned; then turns by what was learned.
        assert [g.sharing for g in records] == [_core.Sharing.TOGETHER] + [_core.Sharing.TURNS] * 2
        assert records[1].learned_in == 1 and str(records[1].schedule) == "high x4, low x2"
    report = pipe.report()
    assert "run 2 group g: members take turns by the schedule high x4, low x2" in report, report
    assert "; planned at its turn for the budget less what the others held then" in report or fits == "both", report


def test_a_given_schedule_frees_the_last_call_for_the_next_member(folder: Path) -> None:
    """Only one expert fits: the high-noise expert's last call is a final pass whose blocks go
    to the low-noise expert; a call past the schedule is refused, saying why."""
    ram = budgets(folder, EXPERTS)["one"]
    schedule = {"high": gs.BOUNDARY, "low": gs.STEPS - gs.BOUNDARY}
    pipe = runs(folder, EXPERTS, ram, gs.experts, schedule, count=2)
    high = [r for r in pipe.records if r.stage == "high"]
    assert all(r.given_back > 0 for r in high), pipe.report()
    again = tp.Pipeline(gs.stages(folder, EXPERTS), groups=[tp.Group("g", EXPERTS)], ram=ram)
    with again, pytest.raises(ArgumentError, match=r"high called 5 times, and the schedule gives it 4"):  # noqa: SIM117
        with again.run() as run, run.group("g", schedule=schedule) as members:
            gs.experts({"high": members["high"], "low": members["high"]})


@pytest.mark.parametrize("fits", ["both", "one", "neither"])
def test_a_controlnet_runs_together_with_its_denoiser(folder: Path, fits: str) -> None:
    ram = budgets(folder, GUIDED)[fits]
    pipe = runs(folder, GUIDED, ram, gs.guided)
    records = pipe._keeper.group_records
    assert all(g.sharing == _core.Sharing.TOGETHER for g in records)
    assert str(records[0].ran) == f"(controlnet x1, unet x1) x{gs.STEPS}"
    assert records[1].learned_in == 1
    # Both loaded at once, within the budget: the members' plans hold no more than it.
    loaded = pipe.records[-2:]
    assert {r.stage for r in loaded} == set(GUIDED)
    if ram is not None:
        first = [r for r in pipe.records if r.run == 1]
        assert sum(r.holds for r in first) <= ram, pipe.report()


def test_a_draft_is_planned_first_and_kept_resident(folder: Path) -> None:
    """The draft runs three times per call of the target: it is planned first and, where the
    budget holds it beside the least the target needs, every block of it is resident."""
    h = holds(folder, ASSISTED)
    ram = h["draft"] + holds(folder, ["target"], ram=0)["target"] + 256 * 1024
    schedule = [("draft", gs.DRAFTS), ("target", 1)] * 3
    pipe = runs(folder, ASSISTED, ram, gs.assisted, schedule, count=2, activation_vram=0)
    first = {r.stage: r for r in pipe.records if r.run == 1}
    assert str(first["draft"].share) == "planned first (9 calls in the run): the budget less the least the others need"
    assert str(first["target"].share).startswith("planned after draft (3 calls in the run)")
    assert first["draft"].holds == h["draft"], pipe.report()
    assert first["target"].holds < h["target"]
    assert "(draft x3, target x1) x3" in pipe.report()


@pytest.mark.slow
def test_members_loaded_together_hold_no_more_private_memory_than_their_plans(tmp_path: Path) -> None:
    """Two 64 MiB experts loaded together under a 128 MiB budget: the private memory the group
    takes stays within the budget (what the plans hold together), plus 48 MiB of slack."""
    shapes = {"high": lambda: gs.ps.Denoiser(dim=1024, layers=4), "low": lambda: gs.ps.Denoiser(dim=1024, layers=4)}
    gs.save_members(tmp_path, EXPERTS, shapes)
    st = [tp.Stage(n, (lambda n=n: gs.build(n, shapes)), tmp_path / n, options={"min_free_ram": 0}) for n in EXPERTS]
    ram = 128 * MiB
    gc.collect()
    _core.trim_heap()
    before = _core.private_memory()
    latents = torch.randn(1, 64, 16)
    text = torch.randn(1, 12, 128)
    with tp.Pipeline(st, groups=[tp.Group("g", EXPERTS)], ram=ram) as pipe:
        with torch.no_grad(), pipe.run() as run, run.group("g") as members:
            for step in range(2):
                latents = gs.ps.denoise_step(members["high"], latents, text, step)
                latents = gs.ps.denoise_step(members["low"], latents, text, step)
            rise = _core.private_memory() - before
        plans = sum(r.holds for r in pipe.records)
    assert plans <= ram, pipe.report()
    assert rise <= ram + 48 * MiB, f"private memory rose {rise / MiB:.0f} MiB under a {ram / MiB:.0f} MiB budget"


def test_groups_and_schedules_are_checked(folder: Path) -> None:
    st = gs.stages(folder, EXPERTS + GUIDED)
    with pytest.raises(ArgumentError, match="not next to one another"):
        tp.Pipeline(st, groups=[tp.Group("g", ["high", "controlnet"])])
    with pytest.raises(ArgumentError, match="'mid' is not a stage"):
        tp.Pipeline(st, groups=[tp.Group("g", ["high", "mid"])])
    with pytest.raises(ArgumentError, match="member of group a already"):
        tp.Pipeline(st, groups=[tp.Group("a", EXPERTS), tp.Group("b", ["low", "controlnet"])])
    with pytest.raises(ArgumentError, match="two or more different"):
        tp.Group("g", ["high"])
    with pytest.raises(ArgumentError, match=r"names \"mid\", not a member; expected one of high, low"):
        tp.Group("g", EXPERTS, schedule={"mid": 3})
    with pytest.raises(ArgumentError, match="no calls"):
        tp.Group("g", EXPERTS, schedule=[("high", 0)])
    with tp.Pipeline(st, groups=[tp.Group("g", EXPERTS)]) as pipe, pipe.run() as run:
        with (
            pytest.raises(ArgumentError, match=r"member of group 'g'; expected run.group\('g'\) to start it"),
            run.stage("high"),
        ):
            pass
        with pytest.raises(ArgumentError, match="not a group of this pipeline"), run.group("experts"):
            pass
        with (
            pytest.raises(
                ArgumentError, match="takes turns in the order low, high; members that take turns run in pipeline order"
            ),
            run.group("g", schedule={"low": 1, "high": 1}),
        ):
            pass


def test_members_loaded_together_share_one_run_order_in_the_read_queue(folder: Path) -> None:
    """The guide's blocks run before the denoiser's at each step: the first run records that
    order across both, and from the second run on their lanes of the drive's read queue share
    it (each position of a member's order placed in it), as the report says."""
    with tp.Pipeline(gs.stages(folder, GUIDED), groups=[tp.Group("g", GUIDED)], ram=None) as pipe:
        places: dict[str, list[int] | None] = {}
        for _ in range(2):
            with pipe.run() as run, run.group("g") as members:
                gs.guided(members)
                for name in GUIDED:
                    lane = pipe._keeper.loaded[name].state.lane
                    assert lane is not None
                    places[name] = lane.joint_places
        first, second = pipe._keeper.group_records
        guide_blocks = len(gs.build("controlnet").controlnet_blocks)  # type: ignore[arg-type]
        unet_blocks = len(gs.build("unet").transformer_blocks)  # type: ignore[arg-type]
        assert first.run_order == [("controlnet", i) for i in range(guide_blocks)] + [
            ("unet", i) for i in range(unet_blocks)
        ]
        assert not first.reads_in_order and second.reads_in_order
        assert places == {
            "controlnet": list(range(guide_blocks)),
            "unet": list(range(guide_blocks, guide_blocks + unet_blocks)),
        }
        report = pipe.report()
        assert "one run order across members (blocks): controlnet 0-2, unet 0-5; the reads followed it" in report
        # Once the group's turn ends, each lane ranks in its own order again.
        assert all(pipe._keeper.loaded[n].state.lane.joint_places is None for n in GUIDED)  # type: ignore[union-attr]
