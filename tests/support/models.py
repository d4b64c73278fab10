"""Tiny models of plain torch blocks, used by several tests."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Tiny(nn.Module):
    """Embedding, a list of blocks, a head: the shape of a language model."""

    def __init__(self, dim: int = 64, layers: int = 6, vocab: int = 100) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x))


class TwoLists(nn.Module):
    """A diffusion-style model: double blocks, single blocks, and weights outside both."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.img_in = nn.Linear(dim, dim)
        self.double_blocks = nn.ModuleList(Block(dim) for _ in range(3))
        self.single_blocks = nn.ModuleList(Block(dim) for _ in range(4))
        self.final = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.img_in(x)
        for b in [*self.double_blocks, *self.single_blocks]:
            x = b(x)
        return self.final(x)


def assert_writes_are_caught(model: Tiny, block: int, x: torch.Tensor, want: torch.Tensor | None) -> None:
    """A module that writes to its streamed weight in place (a buggy in-place update) makes the
    pass raise an error naming the weight; the next pass, without the write, gives ``want``
    again (the spoiled copy was dropped). ``want`` None: only the error is checked."""
    import pytest

    import trash_panda as tp

    def write(m: nn.Module, _args: object) -> None:
        m.weight.mul_(2)

    hook = model.blocks[block].up.register_forward_pre_hook(write)
    with pytest.raises(tp.StreamError, match=rf"blocks\.{block}\.up\.weight.*modified in place"):
        model(x)
    hook.remove()
    if want is not None:
        assert torch.equal(model(x), want)


def save(model: nn.Module, path: Path, dtype: torch.dtype = torch.float32) -> Path:
    save_file({k: v.to(dtype).contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def on_meta(cls: type[nn.Module], **kwargs: int) -> nn.Module:
    with torch.device("meta"):
        return cls(**kwargs)
