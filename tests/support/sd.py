"""The tiny Stable Diffusion pipeline the diffusers tests run: its streamed components and an image."""

from __future__ import annotations

import warnings

import torch
from diffusers import StableDiffusionPipeline

STREAM = ["text_encoder", "unet", "vae"]


def sd_call(pipe: StableDiffusionPipeline) -> torch.Tensor:
    """One small image, the same each call (the warnings it raises go to the caller)."""
    with torch.no_grad():
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


def sd_image(pipe: StableDiffusionPipeline) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the UNet runs its middle blocks out of their defined order
        return sd_call(pipe)
