"""The main job of `make demo`: stream a model from its checkpoint and check it against the plain one.

It writes a small transformer-shaped checkpoint (bf16 blocks, and fp8 blocks with one scale per
output row) under target/demo, shows what `trash-panda inspect` and `trash-panda plan` say about
it, loads the model with blocks on every tier (device, RAM, disk), runs it with the blocks
streamed, checks the output bit for bit against the same model loaded whole, prints the profile,
and releases it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

import trash_panda as tp
from trash_panda.offload.profile import build as build_profile

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "target" / "demo"
HIDDEN, LAYERS, VOCAB = 1024, 12, 8000


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_norm = nn.RMSNorm(HIDDEN)
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN, bias=False)
        self.out = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.up = nn.Linear(HIDDEN, 4 * HIDDEN, bias=False)
        self.down = nn.Linear(4 * HIDDEN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.input_norm(x)).chunk(3, dim=-1)
        x = x + self.out(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
        return x + self.down(torch.nn.functional.silu(self.up(x)))


class DemoModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.norm = nn.RMSNorm(HIDDEN)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x) @ self.embed_tokens.weight.T


def make_checkpoint(path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    model = DemoModel().to(torch.bfloat16)
    tensors: dict[str, torch.Tensor] = {}
    for name, p in model.state_dict().items():
        w = torch.randn(p.shape, generator=g) * 0.02 if p.dim() == 2 else torch.ones(p.shape)
        layer = int(name.split(".")[1]) if name.startswith("layers.") else 0
        if p.dim() == 2 and layer % 2:  # odd layers: fp8 with one scale per output row
            scale = w.abs().amax(dim=1, keepdim=True) / 448.0
            tensors[name] = (w / scale).to(torch.float8_e4m3fn)
            tensors[name[: -len(".weight")] + ".weight_scale"] = scale
        else:
            tensors[name] = w.to(torch.bfloat16)
    save_file(tensors, str(path))


def plain_model(path: Path) -> DemoModel:
    """The model loaded whole, fp8 weights expanded the reference way: (w.float() * s).to(bf16)."""
    raw = load_file(str(path))
    state = {}
    for name, t in raw.items():
        if name.endswith("_scale"):
            continue
        scale = raw.get(name + "_scale")
        state[name] = t.to(torch.bfloat16) if scale is None else (t.float() * scale).to(torch.bfloat16)
    model = DemoModel().to(torch.bfloat16).eval()
    model.load_state_dict(state)
    return model


def cli(*args: str) -> None:
    print(f"\n$ trash-panda {' '.join(args)}", flush=True)
    subprocess.run([sys.executable, "-m", "trash_panda.cli", *args], check=True)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "demo-model.safetensors"
    print(f"trash_panda {tp.__version__}: writing {path}")
    make_checkpoint(path)

    cli("inspect", str(path))
    cli("plan", str(path), "--vram", "0.5GB", "--headroom-vram", "0.3GB", "--ram", "8GB")

    with torch.device("meta"):
        model = DemoModel().eval()
    plan = tp.Plan.manual(
        resident=[f"layers.{i}." for i in range(4)], streamed=[f"layers.{i}." for i in range(4, LAYERS)]
    )
    plan.assign(tp.Tier.DISK, indices=list(range(8, LAYERS)))
    rss_before = tp._core.current_rss()
    print()
    print(tp.stream_load(model, path, plan=plan))
    print(plan if plan.resolved else "", end="")
    handle = tp.install_offload(model)

    ids = torch.randint(0, VOCAB, (2, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        t0 = time.perf_counter()
        got = model(ids)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        model(ids)
        second = time.perf_counter() - t0
        want = plain_model(path)(ids)
    if not torch.equal(got, want):
        raise SystemExit("demo: the streamed model's output differs from the plain model's")
    print(
        f"\nstreamed forward: {first:.3f} s cold, {second:.3f} s warm; "
        "output equal bit for bit to the model loaded whole (fp8 layers: the reference expansion)"
    )
    print("\nprofile:\n" + build_profile(handle)[0])
    tp.release(model, handle)
    print(f"RSS {rss_before / 1e6:.0f} MB before the load, {tp._core.current_rss() / 1e6:.0f} MB after release()")


if __name__ == "__main__":
    main()
