"""Tiny diffusers models built in the tests (the weights random), with inputs for one call."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["flux", "unet"]


def flux(
    *,
    in_channels: int = 16,
    double: int = 2,
    single: int = 3,
    head_dim: int = 16,
    heads: int = 2,
    text_dim: int = 32,
    pooled_dim: int = 32,
    axes: tuple[int, int, int] = (4, 6, 6),
    side: int = 4,
    text: int = 5,
) -> tuple[Callable[[], nn.Module], Callable[[torch.dtype], dict[str, torch.Tensor]]]:
    """A Flux transformer (by default a tiny one: 2 double blocks, 3 single blocks) and inputs for
    it: a ``side`` x ``side`` latent and ``text`` text tokens."""
    from diffusers import FluxTransformer2DModel

    def build() -> nn.Module:
        return FluxTransformer2DModel(
            patch_size=1,
            in_channels=in_channels,
            num_layers=double,
            num_single_layers=single,
            attention_head_dim=head_dim,
            num_attention_heads=heads,
            joint_attention_dim=text_dim,
            pooled_projection_dim=pooled_dim,
            guidance_embeds=False,
            axes_dims_rope=axes,
        )

    def inputs(dtype: torch.dtype) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(3)
        h, w, txt = side, side, text
        img_ids = torch.zeros(h, w, 3)
        img_ids[..., 1] = torch.arange(h)[:, None]
        img_ids[..., 2] = torch.arange(w)[None, :]
        return {
            "hidden_states": torch.randn(1, h * w, in_channels, generator=g).to(dtype),
            "encoder_hidden_states": torch.randn(1, txt, text_dim, generator=g).to(dtype),
            "pooled_projections": torch.randn(1, pooled_dim, generator=g).to(dtype),
            "timestep": torch.tensor([0.5], dtype=dtype),
            "img_ids": img_ids.reshape(h * w, 3),
            "txt_ids": torch.zeros(txt, 3),
        }

    return build, inputs


def unet() -> tuple[Callable[[], nn.Module], Callable[[torch.dtype], dict[str, torch.Tensor]]]:
    """A tiny Stable Diffusion UNet: its builder and its inputs."""
    from diffusers import UNet2DConditionModel

    def build() -> nn.Module:
        return UNet2DConditionModel(
            block_out_channels=(32, 64),
            layers_per_block=1,
            sample_size=16,
            in_channels=4,
            out_channels=4,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            cross_attention_dim=32,
            norm_num_groups=8,
            attention_head_dim=8,
        )

    def inputs(dtype: torch.dtype) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(3)
        return {
            "sample": torch.randn(1, 4, 16, 16, generator=g).to(dtype),
            "timestep": torch.tensor([10]),
            "encoder_hidden_states": torch.randn(1, 7, 32, generator=g).to(dtype),
        }

    return build, inputs
