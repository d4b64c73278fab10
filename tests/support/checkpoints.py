"""Small models and checkpoints the stream tests share: a reference model, a plan over every tier,
input ids, an fp8 checkpoint with its reference expansion."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from support.models import Tiny
from trash_panda import Plan, Tier


def every_tier(layers: int = 6) -> Plan:
    p = Plan.manual(resident=["blocks.0.", "blocks.1."], streamed=[f"blocks.{i}." for i in range(2, layers)])
    return p.assign(Tier.DISK, prefixes=[f"blocks.{i}." for i in range(layers - 2, layers)])


def reference(dtype: torch.dtype, seed: int = 0, **kw: int) -> Tiny:
    torch.manual_seed(seed)
    return Tiny(**kw).to(dtype).eval()


def ids() -> torch.Tensor:
    return torch.randint(0, 100, (3, 11), generator=torch.Generator().manual_seed(5))


def fp8_checkpoint(ref: Tiny, path: Path) -> Tiny:
    """Saves ``ref`` with fp8 block weights and three scale layouts; returns the bf16 reference
    model whose weights are the reference expansion ``(w.float() * scale).to(bf16)``."""
    tensors: dict[str, torch.Tensor] = {}
    expected = Tiny().to(torch.bfloat16).eval()
    state = {k: v.clone() for k, v in ref.state_dict().items()}
    for name, w in state.items():
        if name.startswith("blocks.") and name.endswith(".weight") and w.dim() == 2:
            layer = int(name.split(".")[1]) % 3
            if layer == 0:  # one scale per output row
                scale = w.abs().amax(dim=1, keepdim=True) / 448
                q = (w / scale).to(torch.float8_e4m3fn)
                tensors[name[:-7] + ".weight_scale"] = scale
                full = scale
            elif layer == 1:  # one scale for the tensor, as scaled-fp8 UI checkpoints store it
                scale = w.abs().amax() / 448
                q = (w / scale).to(torch.float8_e4m3fn)
                tensors[name[:-7] + ".scale_weight"] = scale.reshape(())
                full = scale
            else:  # one scale per 128x128 block
                r, c = w.shape
                scale = torch.rand(math.ceil(r / 128), math.ceil(c / 128)) * 0.01 + 0.001
                full = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[:r, :c]
                q = (w / full).to(torch.float8_e4m3fn)
                tensors[name[:-7] + ".weight_scale_inv"] = scale
            tensors[name] = q
            state[name] = (q.float() * full).to(torch.bfloat16)
        else:
            tensors[name] = w.to(torch.bfloat16)
            state[name] = tensors[name]
    save_file(tensors, str(path))
    expected.load_state_dict(state)
    return expected
