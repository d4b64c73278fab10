"""skip_prefixes leaves parts of a model unloaded (a vision tower of a text encoder, say): the
checkpoint need not have them, the planner does not count them, and they stay as built."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import trash_panda as tp
from support.models import Block, Tiny

IDS = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(4))


class WithTower(Tiny):
    """A language model with parts its checkpoint lacks: a tower of blocks and a projection."""

    def __init__(self) -> None:
        super().__init__()
        self.tower = nn.Module()
        self.tower.layers = nn.ModuleList(Block(64) for _ in range(3))
        self.extra = nn.Linear(64, 64)


def build() -> WithTower:
    with torch.device("meta"):
        return WithTower()


@pytest.fixture
def path(tmp_path: Path) -> tuple[Path, Tiny]:
    torch.manual_seed(0)
    ref = Tiny().eval()
    out = tmp_path / "text.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(out))
    return out, ref


def test_skipped_parts_are_not_loaded_nor_planned(path: tuple[Path, Tiny]) -> None:
    file, ref = path
    skip = ["tower.", "extra."]
    p = tp.plan(build(), file, device="cpu", skip_prefixes=skip)
    assert [b.name for b in p.blocks] == [f"blocks.{i}." for i in range(6)]
    with tp.stage(build, file, device="cpu", resident_blocks=2, skip_prefixes=skip) as (model, plan, _h):
        assert [b.name for b in plan.blocks] == [f"blocks.{i}." for i in range(6)]
        assert model.extra.weight.is_meta and model.tower.layers[0].up.weight.is_meta
        with torch.no_grad():
            assert torch.equal(model(IDS), ref(IDS))


def test_a_missing_parameter_outside_the_skipped_parts_is_still_an_error(path: tuple[Path, Tiny]) -> None:
    file, _ref = path
    with (
        pytest.raises(
            tp.CheckpointError,
            match=r"2 parameter\(s\) of the model are not in the checkpoint: extra\.weight.*extra\.bias",
        ),
        tp.stage(build, file, device="cpu", skip_prefixes=["tower."]),
    ):
        pass
