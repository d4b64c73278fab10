"""How PEFT's tuner layers change a model's tensor names, for the code that matches a model to
its checkpoint: a wrapped layer's weight is ``to_q.base_layer.weight`` where the checkpoint has
``to_q.weight``, and the adapters' own weights are in no checkpoint of the model. Told by what the
modules have, so PEFT need not be imported."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = [
    "MERGES_ATTR",
    "adapter_bytes",
    "adapter_params",
    "adapter_tensors",
    "base_name",
    "held_adapters",
    "is_tuner_layer",
    "merged_layers",
    "merged_module_names",
    "tensor_names",
    "unwrapped",
]


# Where a streamed layer keeps the merges recorded on it (``offload.merges``).
MERGES_ATTR = "_trash_panda_merges"


def is_tuner_layer(module: Any) -> bool:
    """Whether ``module`` is one of PEFT's tuner layers."""
    return hasattr(module, "merged_adapters") and hasattr(module, "get_base_layer")


def unwrapped(module: nn.Module) -> nn.Module:
    """The model's own layer under a tuner layer (the one that stays when the adapters go, and
    that holds the weights), else ``module``."""
    if is_tuner_layer(module):
        base: nn.Module = module.get_base_layer()  # type: ignore[operator]
        return base
    return module


def adapter_tensors(layer: Any, adapter: str | None = None) -> list[torch.Tensor]:
    """The parameters the tuner layer ``layer`` holds for ``adapter`` (for every adapter: None)."""
    from torch import nn

    out: list[torch.Tensor] = []
    for attr in (*layer.adapter_layer_names, *getattr(layer, "other_param_names", ())):
        held = getattr(layer, attr, None)
        if not isinstance(held, nn.Module):
            continue
        by_name: Any = held  # a ModuleDict or ParameterDict, by adapter name
        if adapter is None:
            out.extend(held.parameters())
        elif adapter in by_name:
            found = by_name[adapter]
            out.extend(found.parameters() if isinstance(found, nn.Module) else [found])
    return out


def held_adapters(layer: Any) -> list[str]:
    """The names of the adapters the tuner layer ``layer`` holds weights for, sorted."""
    from torch import nn

    names: set[str] = set()
    for attr in layer.adapter_layer_names:
        held = getattr(layer, attr, None)
        if isinstance(held, nn.Module):
            names.update(name for name, _ in held.named_children())
            names.update(name for name, _ in held.named_parameters(recurse=False))
    return sorted(names)


def adapter_params(model: nn.Module) -> set[int]:
    """The ids of the parameters PEFT's tuner layers hold for their adapters (no checkpoint of
    the model has them: a load leaves them as they are, a release keeps them)."""
    return {id(p) for module in model.modules() if is_tuner_layer(module) for p in adapter_tensors(module)}


def adapter_bytes(model: nn.Module) -> int:
    """Bytes of the parameters PEFT's tuner layers hold for their adapters."""
    held = {id(p): p for m in model.modules() if is_tuner_layer(m) for p in adapter_tensors(m)}
    return sum(p.numel() * p.element_size() for p in held.values())


def base_name(name: str) -> str:
    """A parameter's name with PEFT's wrapping taken out (``to_q.base_layer.weight`` is the
    checkpoint's ``to_q.weight``)."""
    return name.replace(".base_layer.", ".")


def tensor_names(model: nn.Module) -> set[str]:
    """The names of the model's tensors as its checkpoint has them: its state dict's, without
    PEFT's adapters and with the layers they wrap under their own names."""
    adapters = adapter_params(model)
    return {base_name(n) for n, t in model.state_dict(keep_vars=True).items() if id(t) not in adapters}


def merged_layers(module: nn.Module) -> list[Any]:
    """The merges recorded on a streamed layer (``offload.merges.Merge``), in the order they
    were made."""
    found: list[Any] = module.__dict__.get(MERGES_ATTR, [])
    return found


def merged_module_names(model: nn.Module) -> list[str]:
    """The names of the modules of ``model`` with an adapter merged into them: merges recorded
    on a streamed layer, or a PEFT layer that merged into its own weight."""
    return [
        name
        for name, module in model.named_modules()
        if merged_layers(module) or (is_tuner_layer(module) and module.merged_adapters)
    ]
