"""diffusers' own LoRA calls on a pipeline from trash_panda.diffusers.load_pipeline, on every
tier: load_lora_weights (UNet, convolutions included, and text encoder), a second adapter,
set_adapters with new weights, fuse_lora, unfuse_lora and unload_lora_weights each give the
image the plain pipeline gives after the same calls (unfuse_lora: the streamed weights are the
checkpoint's exact bits again, where the plain model subtracts what it added)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import trash_panda
from support.adapters import sd_loras
from support.hf_folders import make_sd
from support.sd import STREAM, sd_image
from trash_panda.offload.merges import merged_copies, merged_layers
from trash_panda.offload.state import get_state

diffusers = pytest.importorskip("diffusers")
peft = pytest.importorskip("peft")

from diffusers import StableDiffusionPipeline  # noqa: E402

TIERS = {
    "ram": {"resident_blocks": 0, "ram": "1TB"},
    "disk": {"resident_blocks": 0, "ram": "1KB"},
    "resident_and_ram": {"resident_blocks": 2, "ram": "1TB"},
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_sd(tmp_path_factory.mktemp("sd"))


@pytest.fixture(scope="module")
def loras(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return sd_loras(folder, tmp_path_factory.mktemp("loras"))


def _steps(loras: dict[str, Path]) -> list[tuple[str, Callable[[Any], None]]]:
    """The calls a user makes, in order; the image is compared after each."""
    return [
        ("load a", lambda p: p.load_lora_weights(loras["a"], adapter_name="a")),
        ("load b", lambda p: p.load_lora_weights(loras["b"], adapter_name="b")),
        ("set_adapters", lambda p: p.set_adapters(["a", "b"], adapter_weights=[0.7, -0.5])),
        ("unload", lambda p: p.unload_lora_weights()),
        ("load a again", lambda p: p.load_lora_weights(loras["a"], adapter_name="a")),
        ("fuse_lora", lambda p: p.fuse_lora(components=["unet", "text_encoder"], adapter_names=["a"], lora_scale=0.8)),
        ("unfuse_lora", lambda p: p.unfuse_lora(components=["unet", "text_encoder"])),
    ]


@pytest.fixture(scope="module")
def plain_images(folder: Path, loras: dict[str, Path]) -> dict[str, torch.Tensor]:
    plain = StableDiffusionPipeline.from_pretrained(folder)
    images = {"none": sd_image(plain)}
    for name, step in _steps(loras):
        step(plain)
        images[name] = sd_image(plain)
    return images


@pytest.mark.parametrize("tier", list(TIERS))
def test_diffusers_lora_calls_equal_plain(
    folder: Path, loras: dict[str, Path], plain_images: dict[str, torch.Tensor], tier: str
) -> None:
    assert not torch.equal(plain_images["load a"], plain_images["none"])  # the LoRA changes the image
    assert not torch.equal(plain_images["set_adapters"], plain_images["load b"])
    pipe = trash_panda.diffusers.load_pipeline(
        StableDiffusionPipeline, folder, stream=STREAM, vram="1TB", headroom_vram=0, device="cpu", **TIERS[tier]
    )
    try:
        assert torch.equal(sd_image(pipe), plain_images["none"])
        for name, step in _steps(loras):
            step(pipe)
            image = sd_image(pipe)
            if name == "unfuse_lora":
                # The plain model subtracts what it added, which is not always the bits it had;
                # the streamed layers hold the checkpoint's again (the UNet's middle block,
                # outside the blocks, is real and PEFT's own, as on the plain model).
                torch.testing.assert_close(image, plain_images[name])
                for component in (pipe.unet, pipe.text_encoder):
                    state = get_state(component)
                    assert state is not None
                    assert not any(merged_layers(m) for m in component.modules())
            else:
                assert torch.equal(image, plain_images[name]), name
            if name == "load a":
                layer = pipe.unet.up_blocks[-1].resnets[-1].conv1
                assert layer.lora_A["a"].weight.device == torch.device("cpu")
                assert layer.lora_A["a"].weight.dtype == torch.float32
                assert get_state(pipe.unet) is not None and layer.base_layer.weight.is_meta  # streamed
            if name == "fuse_lora":
                tuner = pipe.unet.up_blocks[-1].resnets[-1].conv1
                conv = tuner.base_layer
                assert [m.adapters for m in merged_layers(conv)] == [["a"]]
                where = next(n for n, m in pipe.unet.named_modules() if m is tuner)
                report = trash_panda.adapter_report(pipe.unet, per_layer=True)
                assert f"    {where} [a]: a merged into the streamed weight" in report, report
            if name == "unload":
                assert torch.equal(image, plain_images["none"])
    finally:
        trash_panda.diffusers.release_pipeline(pipe)


def test_unload_after_fuse_keeps_the_merge(folder: Path, loras: dict[str, Path]) -> None:
    """As on the plain model, a fused weight keeps its scale when set_adapters changes it, and
    unload_lora_weights() after fuse_lora() keeps the fused weights."""
    plain = StableDiffusionPipeline.from_pretrained(folder)
    pipe = trash_panda.diffusers.load_pipeline(
        StableDiffusionPipeline, folder, stream=STREAM, vram="1TB", headroom_vram=0, device="cpu", **TIERS["ram"]
    )
    try:
        for p in (plain, pipe):
            p.load_lora_weights(loras["a"], adapter_name="a")
            p.fuse_lora()
        assert torch.equal(sd_image(pipe), sd_image(plain))
        for p in (plain, pipe):  # a fused weight keeps the scale it was fused with
            p.set_adapters(["a"], adapter_weights=[0.3])
        assert torch.equal(sd_image(pipe), sd_image(plain))
        copies = merged_copies(get_state(pipe.unet))
        assert copies.kept > 0 and copies.reused > 0  # merged once, kept for the next steps
        for p in (plain, pipe):
            p.unload_lora_weights()
        assert torch.equal(sd_image(pipe), sd_image(plain))
    finally:
        trash_panda.diffusers.release_pipeline(pipe)


@pytest.mark.parametrize("resident_blocks", [0, None], ids=["streamed", "resident"])
def test_chained_pipeline_takes_loras_before_its_first_call(
    folder: Path, loras: dict[str, Path], resident_blocks: int | None
) -> None:
    """A chained pipeline's components are built on meta and loaded when they first run: LoRAs
    loaded (and fused) before that land on the chain's device, and each call's image is the
    plain pipeline's; the adapters outlive each component's release between calls."""
    plain = StableDiffusionPipeline.from_pretrained(folder)
    kw: dict[str, Any] = {} if resident_blocks is None else {"resident_blocks": resident_blocks}
    pipe = trash_panda.diffusers.load_pipeline(
        StableDiffusionPipeline, folder, stream=STREAM, chain=True, vram="1TB", headroom_vram=0, device="cpu", **kw
    )
    try:
        assert all(get_state(getattr(pipe, n)) is None for n in STREAM)  # nothing loaded yet
        for p in (plain, pipe):
            p.load_lora_weights(loras["a"], adapter_name="a")
            p.load_lora_weights(loras["b"], adapter_name="b")
            p.set_adapters(["a", "b"], adapter_weights=[0.7, -0.5])
        layer = pipe.text_encoder.encoder.layers[0].self_attn.k_proj
        assert layer.lora_A["a"].weight.device == torch.device("cpu")  # not the meta device
        assert torch.equal(sd_image(pipe), sd_image(plain))
        assert torch.equal(sd_image(pipe), sd_image(plain))  # again: loaded, released, loaded
        for p in (plain, pipe):
            p.fuse_lora(components=["unet", "text_encoder"], adapter_names=["a", "b"])
        assert torch.equal(sd_image(pipe), sd_image(plain))
        for p in (plain, pipe):
            p.unfuse_lora(components=["unet", "text_encoder"])
            p.unload_lora_weights()
        torch.testing.assert_close(sd_image(pipe), sd_image(plain))
    finally:
        trash_panda.diffusers.release_pipeline(pipe)


def test_chained_pipeline_fused_before_its_first_call(folder: Path, loras: dict[str, Path]) -> None:
    """fuse_lora() on a chained pipeline before any component is loaded: the merges are
    recorded on the streamed layers and made when each is loaded and runs."""
    plain = StableDiffusionPipeline.from_pretrained(folder)
    pipe = trash_panda.diffusers.load_pipeline(
        StableDiffusionPipeline, folder, stream=STREAM, chain=True, vram="1TB", headroom_vram=0, device="cpu",
        resident_blocks=0,
    )  # fmt: skip
    try:
        for p in (plain, pipe):
            p.load_lora_weights(loras["a"], adapter_name="a")
            p.fuse_lora(components=["unet", "text_encoder"], lora_scale=0.9)
        conv = pipe.unet.up_blocks[-1].resnets[-1].conv1.base_layer
        assert conv.weight.is_meta and [m.adapters for m in merged_layers(conv)] == [["a"]]
        assert torch.equal(sd_image(pipe), sd_image(plain))
        assert torch.equal(sd_image(pipe), sd_image(plain))
    finally:
        trash_panda.diffusers.release_pipeline(pipe)
