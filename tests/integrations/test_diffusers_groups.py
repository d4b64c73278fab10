"""Two models at once through ``load_pipeline(chain=True)``: Wan 2.2's two experts (a group
whose members take turns, learned from the first call), with a LoRA loaded into both, and a
ControlNet beside its UNet (a group loaded together), each giving the plain pipeline's output
bit for bit on budgets where both members fit, where only one does and where neither does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import trash_panda
from support.two_models import controlnet_call, make_sd_controlnet, make_wan22, wan_call, wan_lora
from trash_panda import _core
from trash_panda.errors import ArgumentError

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from diffusers import StableDiffusionControlNetPipeline, WanPipeline

WAN_STREAM = ["text_encoder", "transformer", "transformer_2", "vae"]
CN_STREAM = ["text_encoder", "controlnet", "unet", "vae"]


def _size(folder: Path, name: str) -> int:
    return sum(p.stat().st_size for p in (folder / name).glob("*.safetensors"))


def _budgets(folder: Path, members: list[str]) -> dict[str, int | None]:
    """The chain's budget: everything fits; the larger member fits but not both; neither does."""
    big = max(_size(folder, m) for m in members)
    return {"both": None, "one": big * 3 // 2, "neither": big * 3 // 5}


@pytest.fixture(scope="module")
def wan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_wan22(tmp_path_factory.mktemp("wan22"))


@pytest.fixture(scope="module")
def lora(wan: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wan_lora(wan, tmp_path_factory.mktemp("wan-lora"))


@pytest.fixture(scope="module")
def wan_plain(wan: Path, lora: Path) -> dict[str, torch.Tensor]:
    pipe = WanPipeline.from_pretrained(wan)
    out = {"none": wan_call(pipe)}
    pipe.load_lora_weights(lora, adapter_name="a", load_into_transformer_2=True)
    out["lora"] = wan_call(pipe)
    assert not torch.equal(out["lora"], out["none"])  # the LoRA changes the video
    return out


@pytest.mark.parametrize("fits", ["both", "one", "neither"])
def test_wan22_experts_take_turns_with_a_lora_on_both(
    wan: Path, lora: Path, wan_plain: dict[str, torch.Tensor], fits: str
) -> None:
    ram = _budgets(wan, ["transformer", "transformer_2"])[fits]
    pipe = trash_panda.diffusers.load_pipeline(WanPipeline, wan, stream=WAN_STREAM, chain=True, ram=ram)
    try:
        assert torch.equal(wan_call(pipe), wan_plain["none"])
        pipe.load_lora_weights(lora, adapter_name="a", load_into_transformer_2=True)
        for _ in range(2):
            assert torch.equal(wan_call(pipe), wan_plain["lora"])
        runner = pipe._trash_panda_pipeline.chained.runner
        sharing = [g.sharing for g in runner._keeper.group_records]
        assert sharing == [_core.Sharing.TOGETHER, _core.Sharing.TURNS, _core.Sharing.TURNS]
        report = trash_panda.diffusers.pipeline_report(pipe)
        assert "run 2 group experts: members take turns by the schedule transformer x4, transformer_2 x4" in report
        assert "(learned in run 1)" in report
    finally:
        trash_panda.diffusers.release_pipeline(pipe)
    from diffusers import WanTransformer3DModel

    # Chained, a component reports the chain's device; released, it has its own class again.
    assert type(pipe.transformer) is WanTransformer3DModel and type(pipe.transformer_2) is WanTransformer3DModel


@pytest.fixture(scope="module")
def controlnet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_sd_controlnet(tmp_path_factory.mktemp("sd-controlnet") / "pipe")


@pytest.mark.parametrize("fits", ["both", "one", "neither"])
def test_a_controlnet_and_its_unet_are_loaded_together(controlnet: Path, fits: str) -> None:
    want = controlnet_call(StableDiffusionControlNetPipeline.from_pretrained(controlnet))
    ram = _budgets(controlnet, ["controlnet", "unet"])[fits]
    pipe = trash_panda.diffusers.load_pipeline(
        StableDiffusionControlNetPipeline, controlnet, stream=CN_STREAM, chain=True, ram=ram
    )
    try:
        for _ in range(2):
            assert torch.equal(controlnet_call(pipe), want)
        records = pipe._trash_panda_pipeline.chained.runner._keeper.group_records
        assert [g.sharing for g in records] == [_core.Sharing.TOGETHER] * 2
        assert str(records[0].ran) == "(controlnet x1, unet x1) x3"
        # One run of the pipeline per call: the alternation never starts a new run.
        assert [r.run for r in pipe._trash_panda_pipeline.chained.runner.records if r.stage == "unet"] == [1, 2]
    finally:
        trash_panda.diffusers.release_pipeline(pipe)


def test_chain_groups_are_checked(controlnet: Path) -> None:
    with pytest.raises(ArgumentError, match="groups: expected chain=True"):
        trash_panda.diffusers.load_pipeline(
            StableDiffusionControlNetPipeline, controlnet, stream=CN_STREAM, groups={"g": ["controlnet", "unet"]}
        )
    with pytest.raises(ArgumentError, match="expected them next to one another in stream="):
        trash_panda.diffusers.load_pipeline(
            StableDiffusionControlNetPipeline, controlnet, stream=["controlnet", "text_encoder", "unet"], chain=True
        )
    with pytest.raises(ArgumentError, match="vae not streamed"):
        trash_panda.diffusers.load_pipeline(
            StableDiffusionControlNetPipeline,
            controlnet,
            stream=["controlnet", "unet"],
            chain=True,
            groups={"g": ["unet", "vae"]},
        )
