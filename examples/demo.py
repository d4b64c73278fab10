"""The main job of `make demo`: make a checkpoint, inspect and plan it, read it and expand it.

It writes a small transformer-shaped checkpoint (bf16 blocks and fp8 blocks with per-row scales)
under target/demo, prints what `trash-panda inspect` and `trash-panda plan` say about it, reads
every tensor through the core without copying, and expands the fp8 weights with the core's
kernels, checking each against torch's reference expansion.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

import trash_panda
from trash_panda.dtype import expand

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "target" / "demo"
HIDDEN, LAYERS = 1024, 12


def make_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    tensors: dict[str, torch.Tensor] = {
        "embed_tokens.weight": torch.randn(8000, HIDDEN, generator=g).to(torch.bfloat16),
        "norm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
    }
    for i in range(LAYERS):
        p = f"layers.{i}."
        tensors[p + "input_norm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
        for name, shape in (("attn.qkv", (3 * HIDDEN, HIDDEN)), ("attn.out", (HIDDEN, HIDDEN)),
                            ("mlp.up", (4 * HIDDEN, HIDDEN)), ("mlp.down", (HIDDEN, 4 * HIDDEN))):
            w = torch.randn(shape, generator=g) * 0.02
            if i % 2:  # odd layers are stored as fp8 with one scale per output row
                scale = w.abs().amax(dim=1, keepdim=True) / 448.0
                tensors[p + name + ".weight"] = (w / scale).to(torch.float8_e4m3fn)
                tensors[p + name + ".weight_scale"] = scale
            else:
                tensors[p + name + ".weight"] = w.to(torch.bfloat16)
    save_file(tensors, str(path))
    return tensors


def cli(*args: str) -> None:
    print(f"\n$ trash-panda {' '.join(args)}", flush=True)
    subprocess.run([sys.executable, "-m", "trash_panda.cli", *args], check=True)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "demo-model.safetensors"
    print(f"trash_panda {trash_panda.__version__}: writing {path}")
    tensors = make_checkpoint(path)

    cli("inspect", str(path))
    cli("plan", str(path), "--vram", "0.5GB", "--headroom-vram", "0.3GB", "--ram", "8GB")

    ckpt = trash_panda.Checkpoint(path)
    t0 = time.perf_counter()
    for name, expected in tensors.items():
        got = ckpt.read(name)
        if not torch.equal(got.reshape(-1).view(torch.uint8), expected.reshape(-1).view(torch.uint8)):
            raise SystemExit(f"demo: {name} differs from what was written")
    print(f"\nread {len(tensors)} tensors zero-copy in {time.perf_counter() - t0:.3f}s, all bit-for-bit equal")

    expanded = 0
    t0 = time.perf_counter()
    for name in ckpt.names():
        info = ckpt.info(name)
        if info.dtype != "F8_E4M3":
            continue
        w, scale = ckpt.read(name), ckpt.read(name + "_scale")
        got = expand(w, torch.bfloat16, scale)
        if not torch.equal(got, (w.float() * scale).to(torch.bfloat16)):
            raise SystemExit(f"demo: expansion of {name} differs from torch's reference")
        expanded += got.numel() * 2
    dt = time.perf_counter() - t0
    print(f"expanded fp8 -> bf16 with per-row scales: {expanded / 1e6:.0f} MB written, "
          f"equal to torch's (w.float() * scale).to(bf16) ({dt:.2f}s including the torch reference)")


if __name__ == "__main__":
    main()
