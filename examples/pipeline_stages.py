"""A pipeline run as chained stages: text encoder, then denoiser, then VAE, each loaded, run and
released before the next is planned, so each plan sees the memory the previous one gave back;
then the same pipeline run twice by ``trash_panda.Pipeline``, which reads each stage while the
one before it computes and keeps what fits for the next run.

The pipeline here is a tiny diffusers-style folder (one subfolder per component with a
config.json and a safetensors file) made of plain torch modules with random weights, so the
example runs anywhere in a few seconds:

    python examples/pipeline_stages.py [--folder DIR] [--device cpu|cuda]

It prints the plan of each stage and checks the image against the same pipeline run without
trash-panda, bit for bit.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

import trash_panda as tp

STEPS = 4


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class TextEncoder(nn.Module):
    def __init__(self, dim: int = 128, layers: int = 4, vocab: int = 1000) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class Denoiser(nn.Module):
    """A transformer-shaped denoiser: latent tokens, conditioned on the text and the step."""

    def __init__(self, dim: int = 256, layers: int = 6, latent: int = 16, text_dim: int = 128) -> None:
        super().__init__()
        self.proj_in = nn.Linear(latent, dim)
        self.context = nn.Linear(text_dim, dim)
        self.time = nn.Linear(1, dim)
        self.transformer_blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.proj_out = nn.Linear(dim, latent)

    def forward(self, latents: torch.Tensor, text: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        x = self.proj_in(latents) + self.context(text.mean(dim=1, keepdim=True)) + self.time(t.view(-1, 1, 1))
        for block in self.transformer_blocks:
            x = block(x)
        return self.proj_out(x)


class Decoder(nn.Module):
    """A VAE-shaped decoder: latent tokens to 4x4 RGB patches."""

    def __init__(self, dim: int = 128, layers: int = 3, latent: int = 16) -> None:
        super().__init__()
        self.conv_in = nn.Linear(latent, dim)
        self.up_blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.conv_out = nn.Linear(dim, 3 * 16)

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        x = self.conv_in(latents)
        for block in self.up_blocks:
            x = block(x)
        b, n, _ = x.shape
        side = int(n**0.5)
        patches = self.conv_out(x).view(b, side, side, 3, 4, 4)
        return patches.permute(0, 3, 1, 4, 2, 5).reshape(b, 3, side * 4, side * 4).clamp(-1, 1)


COMPONENTS: dict[str, type[nn.Module]] = {"text_encoder": TextEncoder, "transformer": Denoiser, "vae": Decoder}


def save_pipeline(folder: Path, seed: int = 0, configs: dict[str, dict[str, int]] | None = None) -> Path:
    """Writes the pipeline folder: model_index.json, and per component a subfolder with its
    config.json (the constructor's arguments) and diffusion_pytorch_model.safetensors."""
    torch.manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    index = {name: ["pipeline_stages", cls.__name__] for name, cls in COMPONENTS.items()}
    (folder / "model_index.json").write_text(json.dumps(index))
    for name, cls in COMPONENTS.items():
        sub = folder / name
        sub.mkdir(exist_ok=True)
        config = (configs or {}).get(name, {})
        model = cls(**config)
        (sub / "config.json").write_text(json.dumps(config))
        weights = {k: v.contiguous() for k, v in model.state_dict().items()}
        save_file(weights, str(sub / "diffusion_pytorch_model.safetensors"))
    return folder


def build(folder: Path, name: str, device: str = "meta") -> nn.Module:
    """A component from its config.json, on the meta device (no weights) by default."""
    config = json.loads((folder / name / "config.json").read_text())
    with torch.device(device):
        return COMPONENTS[name](**config).eval()


def inputs(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 1000, (1, 12), generator=g), torch.randn(1, 64, 16, generator=g)


def denoise_step(denoiser: nn.Module, latents: torch.Tensor, text: torch.Tensor, step: int) -> torch.Tensor:
    t = torch.full((latents.shape[0],), 1.0 - step / STEPS, device=latents.device)
    return latents - 0.25 * denoiser(latents, text, t)


def plain(folder: Path, device: str = "cpu") -> torch.Tensor:
    """The reference: every component fully loaded with load_state_dict on ``device`` (the image
    comes back on the CPU)."""
    from safetensors.torch import load_file

    ids, latents = inputs()
    models = {}
    for name in COMPONENTS:
        m = build(folder, name, device=device)
        m.load_state_dict(load_file(str(folder / name / "diffusion_pytorch_model.safetensors"), device=str(device)))
        models[name] = m
    with torch.no_grad():
        text = models["text_encoder"](ids.to(device))
        latents = latents.to(device)
        for step in range(STEPS):
            latents = denoise_step(models["transformer"], latents, text, step)
        return models["vae"](latents).cpu()


def staged(folder: Path, device: str = "cpu", verbose: bool = False, **denoiser_plan: object) -> torch.Tensor:
    """The same pipeline as three chained stages (``denoiser_plan``: plan() options of the
    denoiser's stage, such as resident_blocks)."""
    ids, latents = inputs()
    with torch.no_grad():
        with tp.stage(lambda: build(folder, "text_encoder"), folder / "text_encoder", device=device) as (encoder, p, _):
            if verbose:
                print(p)
            text = encoder(ids.to(device))
        # The encoder's memory is free again here, before the denoiser is planned.
        transformer = folder / "transformer"
        with tp.stage(lambda: build(folder, "transformer"), transformer, device=device, **denoiser_plan) as (
            denoiser,
            p,
            handle,
        ):
            if verbose:
                print(p)
            latents = latents.to(device)
            for step in range(STEPS - 1):
                latents = denoise_step(denoiser, latents, text, step)
            # The last step frees each block right after it runs.
            with handle.final_pass() as last:
                latents = denoise_step(denoiser, latents, text, STEPS - 1)
            if verbose:
                events = [last.events.get_nowait() for _ in range(last.events.qsize())]
                print(f"final pass freed {len(events)} blocks, {sum(e.bytes for e in events) / 1e6:.1f} MB")
        with tp.stage(lambda: build(folder, "vae"), folder / "vae", device=device) as (vae, p, _):
            if verbose:
                print(p)
            return vae(latents).cpu()


def with_runner(folder: Path, runs: int = 2, device: str = "cpu", verbose: bool = False) -> list[torch.Tensor]:
    """The same pipeline run ``runs`` times by ``tp.Pipeline``: each stage after the first is
    read while the one before it computes, and what fits stays loaded for the next run."""
    stages = [tp.Stage(name, (lambda name=name: build(folder, name)), folder / name) for name in COMPONENTS]
    images = []
    with tp.Pipeline(stages, device=device) as pipe:
        for _ in range(runs):
            ids, latents = inputs()
            with torch.no_grad(), pipe.run() as run:
                with run.stage("text_encoder") as encoder:
                    text = encoder(ids.to(device))
                with run.stage("transformer") as denoiser:
                    latents = latents.to(device)
                    for step in range(STEPS - 1):
                        latents = denoise_step(denoiser, latents, text, step)
                    with run.final_pass():
                        latents = denoise_step(denoiser, latents, text, STEPS - 1)
                with run.stage("vae") as vae:
                    images.append(vae(latents).cpu())
        if verbose:
            print(pipe.report())
    return images


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", type=Path, default=None, help="where to write the pipeline (default: a temp dir)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_pipeline(args.folder or Path(tmp) / "pipeline")
        image = staged(folder, args.device, verbose=True)
        want = plain(folder, args.device)
        chained = torch.equal(image, want)
        print(f"image {tuple(image.shape)}: {'equal to' if chained else 'DIFFERENT from'} the plain pipeline's")
        images = with_runner(folder, device=args.device, verbose=True)
        runner = all(torch.equal(i, want) for i in images)
        print(f"{len(images)} runs of the Pipeline: {'equal to' if runner else 'DIFFERENT from'} the plain pipeline's")
    if not (chained and runner):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
