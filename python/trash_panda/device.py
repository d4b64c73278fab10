"""The compute device, chosen in one place."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def resolve_device(device: torch.device | str | None = None) -> torch.device:
    """``device`` as a torch device; by default CUDA when torch sees a GPU, else the CPU."""
    import torch

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)
