"""trash_panda.diffusers.load_pipeline on a Stable Diffusion pipeline of tiny components saved in
shards: the image equals the plain pipeline's, with the components streamed together and
chained one stage at a time; after a chained run and release the RSS is back near the start."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

import trash_panda
from hf_folders import make_sd
from trash_panda import _core
from trash_panda.offload.state import get_state

diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")

from diffusers import StableDiffusionPipeline  # noqa: E402

STREAM = ["text_encoder", "unet", "vae"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_sd(tmp_path_factory.mktemp("sd"))


def _image(pipe: StableDiffusionPipeline) -> torch.Tensor:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the UNet runs its middle blocks out of their defined order
        out = pipe(
            "a raccoon at night",
            num_inference_steps=3,
            height=16,
            width=16,
            guidance_scale=3.0,
            output_type="pt",
            generator=torch.Generator().manual_seed(0),
        )
    image = out.images
    assert isinstance(image, torch.Tensor) and image.shape == (1, 3, 16, 16)
    return image


def _every_block_streamed() -> dict[str, object]:
    return {"vram": "1TB", "resident_blocks": 0, "headroom_vram": 0, "device": "cpu"}


@pytest.fixture(scope="module")
def plain_image(folder: Path) -> torch.Tensor:
    return _image(StableDiffusionPipeline.from_pretrained(folder))


def test_streamed_pipeline_image_equals_plain(folder: Path, plain_image: torch.Tensor) -> None:
    pipe = trash_panda.diffusers.load_pipeline(
        StableDiffusionPipeline, folder, stream=STREAM, **_every_block_streamed()
    )
    try:
        for name in STREAM:
            state = get_state(getattr(pipe, name))
            assert state is not None and state.handle is not None, name
            assert state.engine is not None  # its blocks are streamed, none resident
        assert pipe.device == torch.device("cpu")
        assert torch.equal(_image(pipe), plain_image)
        assert torch.isfinite(plain_image).all() and plain_image.std() > 0
    finally:
        trash_panda.diffusers.release_pipeline(pipe)
    assert all(get_state(getattr(pipe, n)) is None for n in STREAM)
    # Each component ran as a stage(): its run order was written beside its checkpoint, the UNet's
    # with the middle block before the up blocks, as forward() runs them.
    order = json.loads((folder / "unet" / "diffusion_pytorch_model_order.json").read_text())["blocks"]
    assert order.index("mid_block.resnets.1") < order.index("up_blocks.0"), order


def test_chained_pipeline_stage_by_stage(folder: Path, plain_image: torch.Tensor) -> None:
    _image(StableDiffusionPipeline.from_pretrained(folder))  # allocator and kernels warm: RSS settles
    _core.trim_heap()
    rss_start = _core.current_rss()
    pipe = trash_panda.diffusers.load_pipeline(
        StableDiffusionPipeline, folder, stream=STREAM, chain=True, **_every_block_streamed()
    )
    loaded: list[list[str]] = []
    for name in STREAM:  # which components are loaded each time one starts to run
        getattr(pipe, name).register_forward_pre_hook(
            lambda _m, _a, p=pipe: loaded.append([n for n in STREAM if get_state(getattr(p, n)) is not None])
        )
    try:
        assert all(get_state(getattr(pipe, n)) is None for n in STREAM)  # nothing loaded before the call
        assert torch.equal(_image(pipe), plain_image)
        assert loaded[0] == ["text_encoder"]
        assert ["unet"] in loaded  # the text encoder was released before the UNet was planned
        assert all(len(now) == 1 for now in loaded)
        assert torch.equal(_image(pipe), plain_image)  # a second call loads each stage again
    finally:
        trash_panda.diffusers.release_pipeline(pipe)
    del pipe
    _core.trim_heap()
    rss_end = _core.current_rss()
    assert abs(rss_end - rss_start) <= 0.05 * rss_start, (rss_start, rss_end)


def test_arguments_are_checked(folder: Path, tmp_path: Path) -> None:
    load = trash_panda.diffusers.load_pipeline
    with pytest.raises(trash_panda.ArgumentError, match="pipeline_cls: expected a diffusers pipeline class"):
        load("sd", folder)
    with pytest.raises(trash_panda.ArgumentError, match="has no model_index.json"):
        load(StableDiffusionPipeline, tmp_path)
    with pytest.raises(trash_panda.ArgumentError, match=r"'transformer' is not a .*components: .*unet"):
        load(StableDiffusionPipeline, folder)
    with pytest.raises(trash_panda.ArgumentError, match="expected a pipeline made by"):
        trash_panda.diffusers.release_pipeline(object())
