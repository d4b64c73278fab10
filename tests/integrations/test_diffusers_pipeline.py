"""trash_panda.diffusers.load_pipeline on a Stable Diffusion pipeline of tiny components saved in
shards: the image equals the plain pipeline's, with the components streamed together and
chained one stage at a time; after a chained run and release the RSS is back near the start."""

from __future__ import annotations

import functools
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import trash_panda
from conftest import ReadsWith
from support.hf_folders import make_sd
from support.sd import STREAM, sd_call, sd_image
from trash_panda import _core
from trash_panda.offload.state import get_state

diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")

from diffusers import StableDiffusionPipeline  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_sd(tmp_path_factory.mktemp("sd"))


def _every_block_streamed() -> dict[str, object]:
    return {"vram": "1TB", "resident_blocks": 0, "headroom_vram": 0, "device": "cpu"}


@pytest.fixture(scope="module")
def plain_image(folder: Path) -> torch.Tensor:
    return sd_image(StableDiffusionPipeline.from_pretrained(folder))


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
        assert torch.equal(sd_image(pipe), plain_image)
        assert torch.isfinite(plain_image).all() and plain_image.std() > 0
    finally:
        trash_panda.diffusers.release_pipeline(pipe)
    assert all(get_state(getattr(pipe, n)) is None for n in STREAM)
    # Each component ran as a stage(): its run order was written beside its checkpoint, the UNet's
    # with the middle block before the up blocks, as forward() runs them.
    order = json.loads((folder / "unet" / "diffusion_pytorch_model_order.json").read_text())["blocks"]
    assert order.index("mid_block.resnets.1") < order.index("up_blocks.0"), order


def test_chained_pipeline_stage_by_stage(folder: Path, plain_image: torch.Tensor) -> None:
    sd_image(StableDiffusionPipeline.from_pretrained(folder))  # allocator and kernels warm: RSS settles
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
        assert torch.equal(sd_image(pipe), plain_image)
        # The chain is a Pipeline: the UNet is read while the text encoder runs (set up on the
        # runner's thread, loaded by the time the encoder's call ends), and the VAE while the
        # UNet runs.
        assert loaded[0][0] == "text_encoder" and loaded[1] == ["text_encoder", "unet"]
        assert ["text_encoder", "unet", "vae"] in loaded or ["unet", "vae"] in loaded
        assert torch.equal(sd_image(pipe), plain_image)  # a second call: kept or read again
        report = trash_panda.diffusers.pipeline_report(pipe)
        assert "run 1 text_encoder: read at its start" in report, report
        assert "run 1 unet: read ahead" in report and "run 2 text_encoder" in report, report
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


def _some_blocks_resident() -> dict[str, object]:
    return {"vram": "1TB", "resident_blocks": 2, "headroom_vram": 0, "device": "cpu"}


def _note_loader(seen: list[bool], model: torch.nn.Module, _args: object) -> None:
    state = get_state(model)
    seen.append(state is not None and state.handle is not None and state.handle.hooks.get("overlap_wait") is not None)


@pytest.mark.parametrize("chain", [False, True])
def test_overlap_gives_the_same_image(
    loader_reads: ReadsWith, folder: Path, plain_image: torch.Tensor, chain: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """overlap=True goes to each component's stage(): its resident blocks, and the weights
    outside them that its order file (written by the first run) places later, are read by the
    loader thread; the image is bit for bit the one without it. A chain's Pipeline reads on a
    loader thread either way."""
    from trash_panda.offload import outside as outside_mod

    later: list[int] = []  # the positions where a loader read outside weights
    real = outside_mod.load_outside

    def load(*args: Any) -> None:
        later.append(args[4])
        real(*args)

    loader_reads(outside=load)
    images = {}
    for overlap in (False, True):  # the first writes the order files the second reads
        pipe = trash_panda.diffusers.load_pipeline(
            StableDiffusionPipeline, folder, stream=STREAM, chain=chain, overlap=overlap, **_some_blocks_resident()
        )
        loaders: list[bool] = []  # whether each component's stage had a loader when it ran
        for name in STREAM:
            getattr(pipe, name).register_forward_pre_hook(functools.partial(_note_loader, loaders))
        try:
            images[overlap] = sd_image(pipe)
        finally:
            trash_panda.diffusers.release_pipeline(pipe)
        # A chain runs on a Pipeline, which always reads on a loader thread.
        assert loaders and all(had == (overlap or chain) for had in loaders), loaders
    order = json.loads((folder / "unet" / "diffusion_pytorch_model_order.json").read_text())
    assert any(at > 0 for at in order["outside"].values()), order["outside"]
    # A stage read ahead reads its outside weights needed first on its loader too (at 0).
    assert later and any(at > 0 for at in later) and (chain or all(at > 0 for at in later)), later
    assert torch.equal(images[True], images[False])
    assert torch.equal(images[True], plain_image)


def test_a_chained_component_called_by_a_child_waits_for_that_childs_weights(
    loader_reads: ReadsWith, folder: Path, plain_image: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pipeline calls ``vae.decode``: the VAE's stage starts in the pre-hook of its
    post_quant_conv, which torch then runs without the hooks the stage puts on it. With an order
    file that places post_quant_conv after some blocks, its overlap wait still runs first."""
    from trash_panda.offload import outside as outside_mod

    pipe = trash_panda.diffusers.load_pipeline(
        StableDiffusionPipeline, folder, stream=STREAM, **_every_block_streamed()
    )
    try:
        sd_image(pipe)  # writes the order files
    finally:
        trash_panda.diffusers.release_pipeline(pipe)
    vae_file = folder / "vae" / "diffusion_pytorch_model_order.json"
    kept = vae_file.read_text()
    vae_file.write_text(json.dumps({**json.loads(kept), "outside": {"post_quant_conv": 5}}))
    positions: list[int | None] = []
    real = outside_mod.load_outside

    def load(*args: Any) -> None:
        positions.append(args[4] if len(args) > 4 else None)
        real(*args)

    loader_reads(outside=load)
    pipe = trash_panda.diffusers.load_pipeline(
        StableDiffusionPipeline, folder, stream=STREAM, chain=True, overlap=True, **_some_blocks_resident()
    )
    try:
        assert torch.equal(sd_image(pipe), plain_image)
    finally:
        trash_panda.diffusers.release_pipeline(pipe)
        vae_file.write_text(kept)
    assert 5 in positions, positions


def test_overlap_is_checked(folder: Path) -> None:
    with pytest.raises(trash_panda.ArgumentError, match="overlap: expected True or False, got 'yes'"):
        trash_panda.diffusers.load_pipeline(StableDiffusionPipeline, folder, stream=STREAM, overlap="yes")


def _image_and_order_warnings(pipe: Any) -> tuple[torch.Tensor, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        image = sd_call(pipe)
    return image, [str(w.message) for w in caught if "ran before the order given" in str(w.message)]


def test_a_chain_run_twice_gives_no_order_warning_on_its_second_run(tmp_path: Path) -> None:
    """The VAE only decodes: its first run writes an order that starts with the decoder blocks
    (the encoder's, never run, after them), so the next load of the pipeline stages them in the
    order they run, and warns about none."""
    folder = make_sd(tmp_path / "sd")  # no order files yet
    images = []
    for _ in range(2):
        pipe = trash_panda.diffusers.load_pipeline(
            StableDiffusionPipeline, folder, stream=STREAM, chain=True, **_every_block_streamed()
        )
        try:
            image, said = _image_and_order_warnings(pipe)  # the first run's UNet and VAE warn
            images.append(image)
        finally:
            trash_panda.diffusers.release_pipeline(pipe)
    assert said == []
    assert torch.equal(images[0], images[1])
    vae = json.loads((folder / "vae" / "vae_order.json").read_text())["blocks"]
    assert vae[0].startswith("decoder."), vae
