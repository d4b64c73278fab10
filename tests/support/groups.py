"""Pipelines of stages that run together, for the group tests: two experts of a denoiser that
take turns, a ControlNet-shaped guide called before its denoiser at every step, and a draft
called three times before each call of its target. Plain torch models with random weights,
saved as safetensors; the reference runs each fully loaded."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

import trash_panda as tp

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import pipeline_stages as ps

STEPS = 6
BOUNDARY = 4  # the high-noise expert runs the steps before it, the low-noise one the rest
DRAFTS = 3  # draft calls before each call of the target


class Guide(nn.Module):
    """A ControlNet-shaped model: the guide image's tokens in, a residual for the latents out."""

    def __init__(self, dim: int = 128, layers: int = 3, latent: int = 16) -> None:
        super().__init__()
        self.hint_in = nn.Linear(latent, dim)
        self.controlnet_blocks = nn.ModuleList(ps.Block(dim) for _ in range(layers))
        self.zero_out = nn.Linear(dim, latent)

    def forward(self, hint: torch.Tensor) -> torch.Tensor:
        x = self.hint_in(hint)
        for block in self.controlnet_blocks:
            x = block(x)
        return self.zero_out(x)


SHAPES: dict[str, Callable[[], nn.Module]] = {
    "high": ps.Denoiser,
    "low": ps.Denoiser,
    "controlnet": Guide,
    "unet": ps.Denoiser,
    "draft": lambda: ps.Denoiser(dim=128, layers=2),
    "target": ps.Denoiser,
}


def save_members(folder: Path, names: list[str], shapes: Mapping[str, Callable[[], nn.Module]] = SHAPES) -> Path:
    """One folder per member with its weights (seeded by its place)."""
    for i, name in enumerate(names):
        torch.manual_seed(100 + i)
        model = shapes[name]().eval()
        (folder / name).mkdir(parents=True, exist_ok=True)
        weights = {k: v.contiguous() for k, v in model.state_dict().items()}
        save_file(weights, str(folder / name / "diffusion_pytorch_model.safetensors"))
    return folder


def build(name: str, shapes: Mapping[str, Callable[[], nn.Module]] = SHAPES) -> nn.Module:
    with torch.device("meta"):
        return shapes[name]().eval()


def stages(folder: Path, names: list[str], **options: object) -> list[tp.Stage]:
    return [tp.Stage(n, (lambda n=n: build(n)), folder / n, options={"min_free_ram": 0, **options}) for n in names]


def plain(folder: Path, names: list[str]) -> dict[str, nn.Module]:
    """Each member fully loaded, the reference."""
    out = {}
    for name in names:
        model = SHAPES[name]().eval()
        model.load_state_dict(load_file(str(folder / name / "diffusion_pytorch_model.safetensors")))
        out[name] = model
    return out


def inputs(seed: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 64, 16, generator=g), torch.randn(1, 12, 128, generator=g)


def experts(models: Mapping[str, nn.Module], steps: int = STEPS) -> torch.Tensor:
    """The denoise of two experts: "high" before the boundary step, "low" from it."""
    latents, text = inputs()
    with torch.no_grad():
        for step in range(steps):
            latents = ps.denoise_step(models["high" if step < BOUNDARY else "low"], latents, text, step)
    return latents


def guided(models: Mapping[str, nn.Module]) -> torch.Tensor:
    """The guide, then the denoiser on the guided latents, at every step."""
    latents, text = inputs()
    hint = torch.randn(1, 64, 16, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        for step in range(STEPS):
            residual = models["controlnet"](hint + latents)
            latents = ps.denoise_step(models["unet"], latents + 0.1 * residual, text, step)
    return latents


def assisted(models: Mapping[str, nn.Module], rounds: int = 3) -> torch.Tensor:
    """Per round, ``DRAFTS`` draft steps, then one check by the target."""
    latents, text = inputs()
    t = torch.ones(1)
    with torch.no_grad():
        for _ in range(rounds):
            guess = latents
            for _ in range(DRAFTS):
                guess = guess - 0.1 * models["draft"](guess, text, t)
            latents = 0.5 * (guess + latents - 0.1 * models["target"](latents, text, t))
    return latents
