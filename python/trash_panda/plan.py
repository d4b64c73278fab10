"""plan(), Plan and Tier: which block of a model lives on the GPU, in RAM or on disk."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from . import _core
from .adapter_names import adapter_bytes, merged_module_names, tensor_names
from .blocks import find_blocks
from .checkpoint import Checkpoint
from .checkpoint_names import KeyMap, check_prefixes, model_tensors
from .device import resolve_device
from .errors import ArgumentError
from .settings import setting

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["BlockPlan", "Plan", "Tier", "plan"]

Size = int | str


# The core's classes, as the binding exposes them: a tier crosses as ``Tier`` (a name a user
# gives is parsed once, by the binding), a plan is the binding's ``Plan`` with every method.
Tier = _core.Tier
Plan = _core.Plan
BlockPlan = _core.BlockPlan


def free_vram(device: torch.device) -> int | None:
    """The device's free memory in bytes, as CUDA reports it (None for a device that is not a
    GPU)."""
    import torch

    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return int(free)


def planning_inputs(
    model: nn.Module,
    checkpoint: str | os.PathLike[str] | Checkpoint,
    blocks: list[str] | None,
    key_map: KeyMap,
    skip_prefixes: list[str] | None,
) -> tuple[list[tuple[str, _core.TensorInfo]], list[str]]:
    """The model's tensors (its names and their checkpoint entries: exactly what stream_load
    reads), and the model's block prefixes."""
    ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else Checkpoint(checkpoint)
    expected = tensor_names(model)
    named = model_tensors(ckpt, key_map, skip_prefixes)
    # The scale tensor the core pairs with each weight (what stream_load reads with it);
    # `input_scale` (activations) is neither loaded nor counted.
    scales = {s for name in expected if (s := _core.paired_scale(name, named)) is not None}
    tensors = [(name, info) for name, info in named.items() if name in expected or name in scales]
    skip = check_prefixes(skip_prefixes)
    # Blocks in a skipped part (a vision tower's layers, say) are neither loaded nor counted.
    prefixes = [b.prefix for b in find_blocks(model, blocks) if not (skip and b.prefix.startswith(skip))]
    if not prefixes:
        raise ArgumentError(
            f"found no blocks in {type(model).__name__}: no nn.ModuleList of two or more modules "
            "with weights; name them with blocks=[...]"
        )
    return tensors, prefixes


def plan(
    model: nn.Module,
    checkpoint: str | os.PathLike[str] | Checkpoint,
    *,
    resident_blocks: int | None = None,
    max_vram: Size | None = None,
    min_free_ram: Size = "auto",
    headroom_vram: Size | None = None,
    activation_vram: Size | None = None,
    compute_dtype: str | torch.dtype | None = None,
    storage_dtype: str | torch.dtype | None = None,
    lookahead: int | None = None,
    blocks: list[str] | None = None,
    key_map: KeyMap = None,
    skip_prefixes: list[str] | None = None,
    device: torch.device | str | None = None,
    ram: Size | None = None,
    vram: Size | None = None,
    pinned_buffers: int | None = None,
    staging_pool: _core.StagingPool | None = None,
) -> Plan:
    """Decides, from the checkpoint's sizes and the free memory, where each block of ``model`` lives.

    Sizes are bytes or strings such as ``"9GB"``, ``"500MB"`` or ``"1.5GiB"``. ``compute_dtype``
    defaults to the dtype most of the checkpoint's float weights have (bf16 for fp8 checkpoints).
    ``ram`` and ``vram`` replace the measured available RAM and free VRAM (for tests and for
    planning another machine); on the CPU, ``vram`` sizes the device tier as a GPU with that much
    free memory would get it (the plan's table says the CPU computes). ``pinned_buffers`` is the
    number of staging buffers (pinned on CUDA) when a block streams: by default
    ``TRASH_PANDA_PINNED_BUFFERS``, else one more than the deepest the staging may grow:
    ``lookahead``, or ``TRASH_PANDA_MAX_LOOKAHEAD`` where that is higher. ``headroom_vram`` defaults to the
    planner's (``_core.DEFAULT_HEADROOM_VRAM``, 1.5 GB). ``staging_pool`` (a pipeline's shared
    pool) is counted as the staging buffers where it holds every block (``budgets.shared_staging``).
    Adapters already on the model (PEFT's layers) are counted beside the weights outside the
    blocks (``budgets.adapters``), and blocks with an adapter merged in by their merged images
    (``budgets.merged_memory``, ``merged_files``).
    """

    dev = resolve_device(device)
    tensors, prefixes = planning_inputs(model, checkpoint, blocks, key_map, skip_prefixes)
    free = _core.parse_size(vram, "vram") if vram is not None else free_vram(dev)
    core = _core.make_plan(
        tensors,
        prefixes,
        free,
        dev.type == "cuda",
        ram=None if ram is None else _core.parse_size(ram, "ram"),
        resident_blocks=resident_blocks,
        max_vram=max_vram,
        min_free_ram=min_free_ram,
        headroom_vram=headroom_vram,
        activation_vram=activation_vram,
        compute_dtype=None if compute_dtype is None else dtype_name(compute_dtype),
        storage_dtype=None if storage_dtype is None else dtype_name(storage_dtype),
        lookahead=lookahead if lookahead is not None else setting("lookahead"),
        pinned_buffers=setting("pinned_buffers", pinned_buffers),
        max_lookahead=setting("max_lookahead"),
        ram_in_memory=setting("ram_in_memory"),
        staging_pool=staging_pool,
        # Adapters already on the model (a chained pipeline's LoRAs loaded before its first
        # call): no checkpoint has them, but they take their memory beside the outside weights.
        adapter_bytes=adapter_bytes(model),
        # Merges already made (a LoRA fused before a chained pipeline's first call): their
        # blocks keep a merged image where they live, which the plan counts.
        merged_modules=merged_module_names(model),
    )
    from .log import log_plan

    files = checkpoint.files if isinstance(checkpoint, Checkpoint) else [os.fspath(checkpoint)]
    log_plan(core, files[0] if len(files) == 1 else os.path.dirname(files[0]))
    return core


def dtype_name(dtype: str | torch.dtype) -> str:
    """A dtype as the core reads it: a name is passed as it is, a torch dtype by its name."""
    return dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
