"""Adapter files (LoRA, LoKr, LoHa) read and mapped onto a model's layers by the core's rules
(``_core.map_adapter``): which layer each tensor patches, every shape checked, each layer's
scale. The file is read as a checkpoint is (its header validated); nothing of the model is
touched."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from . import _core
from .checkpoint import Checkpoint
from .errors import ArgumentError, CheckpointError

if TYPE_CHECKING:
    from torch import nn

__all__ = ["read_adapter"]

# The names PEFT and diffusers save an adapter's weights under, in a folder.
ADAPTER_FILES = ("adapter_model.safetensors", "pytorch_lora_weights.safetensors")


def read_adapter(model: nn.Module, path: str | os.PathLike[str], *, component: str | None = None) -> _core.AdapterMap:
    """The adapter file at ``path`` (a ``.safetensors`` file, or a folder holding PEFT's
    ``adapter_model.safetensors`` or diffusers' ``pytorch_lora_weights.safetensors``) mapped onto
    ``model``'s layers. ``component``: the pipeline component ``model`` is (``unet``,
    ``transformer``, ``text_encoder``, ...), whose tensors a pipeline's file holds beside the
    others'; None reads every tensor as the model's. PEFT's ``adapter_config.json`` beside the
    file gives ``lora_alpha`` and ``use_rslora``."""
    from torch import nn

    if not isinstance(model, nn.Module):
        raise ArgumentError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if component is not None and (not isinstance(component, str) or not component):
        raise ArgumentError(f"component: expected a component's name (unet, transformer, ...), got {component!r}")
    return _read_adapter(model, _adapter_file(Path(path)), component)


def _read_adapter(model: nn.Module, file: Path, component: str | None) -> _core.AdapterMap:
    ckpt = Checkpoint(file)
    tensors = [(t.name, list(t.shape)) for t in ckpt.tensors()]
    alphas = {name: _scalar(ckpt, name) for name, _shape in tensors if name.endswith(".alpha")}
    lora_alpha, use_rslora = _config(file.parent / "adapter_config.json")
    return _core.map_adapter(
        tensors, alphas, _layers(model), component=component, lora_alpha=lora_alpha, use_rslora=use_rslora
    )


def _adapter_file(path: Path) -> Path:
    if path.is_file():
        return path
    if path.is_dir():
        for name in ADAPTER_FILES:
            if (path / name).is_file():
                return path / name
        found = sorted(path.glob("*.safetensors"))
        if len(found) == 1:
            return found[0]
        raise ArgumentError(
            f"path: {path} holds {len(found)} .safetensors files and none named {' or '.join(ADAPTER_FILES)}; "
            "pass the adapter's file"
        )
    raise ArgumentError(f"path: {path} is not an adapter file or a folder holding one")


def _scalar(ckpt: Checkpoint, name: str) -> float:
    """An alpha tensor's value: nan where it is not one number (the core says why)."""
    value = ckpt.read(name)
    return float(value.float().reshape(-1)[0]) if value.numel() == 1 else float("nan")


def _config(path: Path) -> tuple[float | None, bool]:
    """PEFT's ``lora_alpha`` and ``use_rslora`` from ``adapter_config.json``, where there is one."""
    if not path.is_file():
        return None, False
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot read the adapter's config: {e}") from e
    alpha = config.get("lora_alpha") if isinstance(config, dict) else None
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float))):
        raise CheckpointError(f"{path}: lora_alpha is {alpha!r}, expected a number")
    rslora = bool(config.get("use_rslora", False)) if isinstance(config, dict) else False
    return (None if alpha is None else float(alpha)), rslora


def _layers(model: nn.Module) -> list[tuple[str, list[int]]]:
    """The layers an adapter may patch: every module with a 2-D or 4-D weight but embeddings
    (a LoRA on an embedding is not supported yet; the core says so for its tensors)."""
    import torch
    from torch import nn

    out = []
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) or not isinstance(weight, torch.Tensor):
            continue
        if weight.dim() in (2, 4):
            out.append((name, list(weight.shape)))
    return out
