"""Matching a model's parameters to a checkpoint's tensors: names, shapes, scale tensors, blocks."""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any

from .. import _core
from .._dtypes import is_block, torch_dtype
from ..adapter_names import adapter_params, base_name, unwrapped
from ..errors import ArgumentError, CheckpointError, DtypeError
from ..plan import Plan
from .state import BlockState, TensorSpec

if TYPE_CHECKING:
    import torch
    from torch import nn


def _scale_kind(weight: tuple[int, ...], scale: list[int], name: str) -> str:
    """How a scale tensor of shape ``scale`` applies to a weight of shape ``weight`` (the core's
    classification)."""
    try:
        return _core.scale_layout(name, list(weight), scale)
    except DtypeError as e:
        raise CheckpointError(str(e)) from None


def _near(name: str, names: list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    return f" (near names in the checkpoint: {', '.join(close)})" if close else ""


def match(
    model: nn.Module,
    named: dict[str, _core.TensorInfo],
    plan: Plan,
    compute: torch.dtype,
    where: str,
    skip: tuple[str, ...] = (),
) -> tuple[list[BlockState], list[TensorSpec], list[str]]:
    """Every parameter of ``model`` paired with its checkpoint tensor (and scale), sorted into the
    plan's blocks or the weights outside them. Returns (blocks, outside, unexpected tensor names).
    ``where`` names the checkpoint in errors. Parameters whose every name starts with one of
    ``skip`` are not loaded: they stay as the model was built."""
    # Every parameter once (tied ones share an entry), with the names it goes by.
    # Names as the checkpoint has them: PEFT's adapters (none in the checkpoint) are left as
    # they are, and the layers they wrap go by their own names.
    adapters = adapter_params(model)
    params: dict[int, tuple[list[tuple[nn.Module, str, str]], Any]] = {}
    for mod_name, module in model.named_modules(remove_duplicate=False):
        for attr, p in module._parameters.items():
            if p is not None and id(p) not in adapters:
                entry = params.setdefault(id(p), ([], p))
                entry[0].append((module, attr, base_name(f"{mod_name}.{attr}" if mod_name else attr)))

    block_tiers = {b.name: b.tier for b in plan.blocks}
    prefixes = sorted(block_tiers, key=len, reverse=True)
    blocks: dict[str, BlockState] = {}
    for i, b in enumerate(plan.blocks):
        try:
            module = unwrapped(model.get_submodule(b.name.rstrip(".")))
        except AttributeError:
            raise ArgumentError(f"plan block {b.name!r} names no module of {type(model).__name__}") from None
        blocks[b.name] = BlockState(index=i, prefix=b.name, module=module, tier=b.tier)

    missing: list[str] = []
    outside: list[TensorSpec] = []
    used: set[str] = set()
    for owners, p in params.values():
        if skip and all(n.startswith(skip) for _m, _a, n in owners):
            continue
        found = next((n for _m, _a, n in owners if n in named), None)
        if found is None:
            missing.append(owners[0][2])
            continue
        info = named[found]
        shape = tuple(int(d) for d in p.shape)
        if tuple(info.shape) != shape:
            raise CheckpointError(
                f"{where}: tensor {info.name!r} has shape "
                f"{list(info.shape)} but the model's {found} has shape {list(shape)}"
            )
        # GGML blocks hold float weights.
        if (_core.is_float_dtype(info.dtype) or is_block(info.dtype)) != p.dtype.is_floating_point:
            raise CheckpointError(f"{where}: tensor {info.name!r} is {info.dtype} but the model's {found} is {p.dtype}")
        scale, kind = None, "none"
        scale_name = _core.paired_scale(found, named)  # input_scale is never applied to a weight
        if scale_name is not None:
            scale = named[scale_name]
            used.add(scale_name)
            kind = _scale_kind(shape, list(scale.shape), scale_name)
        target = compute if p.dtype.is_floating_point else torch_dtype(info.dtype)
        module, attr, _ = owners[0]
        spec = TensorSpec(
            name=found,
            module=module,
            attr=attr,
            info=info,
            scale=scale,
            scale_kind=kind,
            target=target,
            shape=shape,
            owners=[(m, a) for m, a, _ in owners],
        )
        used.add(found)
        prefix = next((q for q in prefixes if found.startswith(q)), None)
        if prefix is None:
            outside.append(spec)
        else:
            others = [n for _m, _a, n in owners if not n.startswith(prefix)]
            if others:
                raise ArgumentError(
                    f"{found} is tied to {others[0]}, outside its block {prefix}: "
                    "tied weights must live outside the blocks"
                )
            blocks[prefix].add(spec)
    if missing:
        listed = "; ".join(m + _near(m, list(named)) for m in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise CheckpointError(f"{len(missing)} parameter(s) of the model are not in the checkpoint: {listed}{more}")
    buffers = {name for name, _b in model.named_buffers()}
    unexpected = sorted(n for n in named if n not in used and n not in buffers and _core.weight_of_scale(n) not in used)
    return list(blocks.values()), outside, unexpected
