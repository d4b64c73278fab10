"""plan(), Plan and Tier: which block of a model lives on the GPU, in RAM or on disk."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from . import _core
from .blocks import find_blocks
from .checkpoint import Checkpoint
from .errors import ArgumentError
from .names import KeyMap, is_scale, model_tensors, weight_of_scale

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["BlockPlan", "Plan", "Tier", "plan"]

Size = int | str


class Tier(str, Enum):
    """Where a block's weights live between uses."""

    DEVICE = "device"
    GPU = "device"  # alias: the device is the GPU when there is one
    RAM = "ram"
    DISK = "disk"


@dataclass(frozen=True)
class BlockPlan:
    name: str
    tier: Tier
    stored_bytes: int
    expanded_bytes: int
    tensors: int


class Plan:
    """A plan: every block's tier, the budgets it was made with, and its warnings.

    Print it for a table. Edit it with :meth:`assign`, write one by hand with :meth:`manual`,
    save and load it with :meth:`to_json` / :meth:`from_json`.
    """

    def __init__(self, core: _core.Plan) -> None:
        self._core = core

    @classmethod
    def manual(cls, resident: list[str], streamed: list[str], streamed_tier: Tier | str = Tier.RAM) -> Plan:
        """A plan written by hand from block prefixes; every block must be named once."""
        return cls(_core.Plan.manual(list(resident), list(streamed), Tier(streamed_tier).value))

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return cls(_core.Plan.from_json(text))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Plan:
        with open(path, encoding="utf-8") as f:
            return cls.from_json(f.read())

    def to_json(self) -> str:
        return self._core.to_json()

    def save(self, path: str | os.PathLike[str]) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json())

    def assign(self, tier: Tier | str, indices: list[int] | None = None, prefixes: list[str] | None = None) -> Plan:
        """Moves blocks, named by position or by prefix, to ``tier``; returns the plan itself.

        An index out of range, a prefix that matches no block, or a block named twice is a
        :class:`PlanError` and leaves the plan as it was.
        """
        self._core.assign(
            Tier(tier).value,
            indices=None if indices is None else [int(i) for i in indices],
            prefixes=None if prefixes is None else list(prefixes),
        )
        return self

    @property
    def _data(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self._core.to_json())
        return data

    @property
    def blocks(self) -> list[BlockPlan]:
        return [
            BlockPlan(b["name"], Tier(b["tier"]), b["stored_bytes"], b["expanded_bytes"], b["tensors"])
            for b in self._data["blocks"]
        ]

    @property
    def warnings(self) -> list[str]:
        return [w["message"] for w in self._data["warnings"]]

    @property
    def budgets(self) -> dict[str, int] | None:
        budgets: dict[str, int] | None = self._data["budgets"]
        return budgets

    @property
    def resolved(self) -> bool:
        return bool(self._data["resolved"])

    def tier_of(self, block: str) -> Tier | None:
        return next((b.tier for b in self.blocks if b.name == block), None)

    def blocks_in(self, tier: Tier | str) -> list[str]:
        t = Tier(tier)
        return [b.name for b in self.blocks if b.tier == t]

    def __str__(self) -> str:
        return str(self._core)

    def __repr__(self) -> str:
        return repr(self._core)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Plan) and self._data == other._data


def _free_vram(device: torch.device) -> int | None:
    import torch

    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return int(free)


def _device(device: torch.device | str | None) -> torch.device:
    import torch

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def planning_inputs(
    model: nn.Module,
    checkpoint: str | os.PathLike[str] | Checkpoint,
    blocks: list[str] | None,
    key_map: KeyMap,
    skip_prefixes: list[str] | None,
) -> tuple[list[tuple[str, str, list[int]]], list[str]]:
    """The model's tensors as the checkpoint stores them, and the model's block prefixes."""
    ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else Checkpoint(checkpoint)
    expected = set(model.state_dict(keep_vars=True).keys())
    tensors = [
        (name, info.dtype, list(info.shape))
        for name, info in model_tensors(ckpt, key_map, skip_prefixes).items()
        if name in expected or (is_scale(name) and weight_of_scale(name) in expected)
    ]
    prefixes = [b.prefix for b in find_blocks(model, blocks)]
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
    headroom_vram: Size = "1.5GB",
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
) -> Plan:
    """Decides, from the checkpoint's sizes and the free memory, where each block of ``model`` lives.

    Sizes are bytes or strings such as ``"9GB"``, ``"500MB"`` or ``"1.5GiB"``. ``compute_dtype``
    defaults to the dtype most of the checkpoint's float weights have (bf16 for fp8 checkpoints). ``ram`` and ``vram``
    replace the measured available RAM and free VRAM (for tests and for planning another machine).
    """
    from .offload.config import setting

    dev = _device(device)
    tensors, prefixes = planning_inputs(model, checkpoint, blocks, key_map, skip_prefixes)
    has_gpu = dev.type == "cuda" or vram is not None
    free = _core.parse_size(vram, "vram") if vram is not None else _free_vram(dev)
    core = _core.make_plan(
        tensors,
        prefixes,
        free,
        has_gpu,
        ram=None if ram is None else _core.parse_size(ram, "ram"),
        resident_blocks=resident_blocks,
        max_vram=max_vram,
        min_free_ram=min_free_ram,
        headroom_vram=headroom_vram,
        activation_vram=activation_vram,
        compute_dtype=infer_compute_dtype(tensors) if compute_dtype is None else _dtype_name(compute_dtype),
        storage_dtype=None if storage_dtype is None else _dtype_name(storage_dtype),
        lookahead=lookahead if lookahead is not None else setting("lookahead"),
    )
    return Plan(core)


def _dtype_name(dtype: str | torch.dtype) -> str:
    return dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")


def infer_compute_dtype(tensors: list[tuple[str, str, list[int]]]) -> str:
    """The float dtype holding most of the weights; fp8 checkpoints compute in bf16."""
    weight: dict[str, int] = {}
    for _name, dtype, shape in tensors:
        if dtype in ("F32", "F16", "BF16", "F64"):
            n = 1
            for d in shape:
                n *= d
            weight[dtype] = weight.get(dtype, 0) + n
    if not weight:
        return "BF16"
    return max(sorted(weight), key=lambda d: weight[d])
