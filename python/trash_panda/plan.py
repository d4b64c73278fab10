"""plan(), Plan and Tier: which block of a model lives on the GPU, in RAM or on disk."""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from . import _core
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


class Tier(str, Enum):
    """Where a block's weights live between uses (the core's canonical names; :func:`_tier`
    reads any name the core accepts)."""

    DEVICE = "device"
    GPU = "device"  # alias: the device is the GPU when there is one
    RAM = "ram"
    DISK = "disk"


def _tier(tier: Tier | str) -> Tier:
    """The tier named ``tier``, parsed by the core: "device", "ram", "disk" and the aliases it
    accepts ("gpu", "cuda", "vram", "cpu", "memory"); a PlanError naming them otherwise."""
    if not isinstance(tier, str):
        raise ArgumentError(f'tier: expected a Tier or a tier name such as "ram", got {type(tier).__name__}')
    return Tier(_core.tier_name(tier))


@dataclass(frozen=True)
class BlockPlan:
    name: str
    tier: Tier
    stored_bytes: int
    expanded_bytes: int
    tensors: int
    staged_bytes: int = 0  # staging-buffer bytes it needs in its tier (0 when resident)
    expansion_bytes: int = 0  # expansion-buffer bytes it needs in its tier


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
        return cls(_core.Plan.manual(list(resident), list(streamed), _tier(streamed_tier).value))

    @classmethod
    def from_json(cls, text: str) -> Plan:
        """A plan from its JSON form (docs/plan-format.md); a bad document is a :class:`PlanError`."""
        return cls(_core.Plan.from_json(text))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Plan:
        """A plan from a JSON file written by :meth:`save` or ``trash-panda plan --json``."""
        with open(path, encoding="utf-8") as f:
            return cls.from_json(f.read())

    def to_json(self) -> str:
        """The plan as JSON (docs/plan-format.md), for :meth:`from_json` or the command line."""
        return self._core.to_json()

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes :meth:`to_json` to ``path``."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json())

    def assign(self, tier: Tier | str, indices: list[int] | None = None, prefixes: list[str] | None = None) -> Plan:
        """Moves blocks, named by position or by prefix, to ``tier``; returns the plan itself.

        An index out of range, a prefix that matches no block, or a block named twice is a
        :class:`PlanError` and leaves the plan as it was.
        """
        self._core.assign(
            _tier(tier).value,
            indices=None if indices is None else [int(i) for i in indices],
            prefixes=None if prefixes is None else list(prefixes),
        )
        return self

    @property
    def blocks(self) -> list[BlockPlan]:
        """Every block in model order, with its tier and sizes."""
        return [
            BlockPlan(
                b.name, Tier(b.tier), b.stored_bytes, b.expanded_bytes, b.tensors, b.staged_bytes, b.expansion_bytes
            )
            for b in self._core.blocks
        ]

    @property
    def warnings(self) -> list[str]:
        """What the planner found wrong with the plan, one sentence each (printed with it too)."""
        return self._core.warnings

    @property
    def budgets(self) -> _core.Budgets | None:
        """Every figure of the plan in bytes (see docs/plan-format.md); None until resolved."""
        return self._core.budgets

    @property
    def resolved(self) -> bool:
        """Whether the plan has been sized against a model and a machine (a manual plan is not yet)."""
        return self._core.resolved

    @property
    def compute_dtype(self) -> str:
        """The dtype the blocks compute in, as a header name ("BF16", "F16", "F32")."""
        return self._core.compute_dtype

    @property
    def storage_dtype(self) -> str | None:
        """The dtype waiting weights are converted to on load, or None to keep them as stored."""
        return self._core.storage_dtype

    @property
    def lookahead(self) -> int:
        """Streamed blocks staged ahead of the one that runs."""
        return self._core.lookahead

    def tier_of(self, block: str) -> Tier | None:
        """The tier of the block named ``block`` (its prefix), or None if the plan has no such block."""
        return next((b.tier for b in self.blocks if b.name == block), None)

    def blocks_in(self, tier: Tier | str) -> list[str]:
        """The names of the blocks in ``tier``, in model order."""
        t = _tier(tier)
        return [b.name for b in self.blocks if b.tier == t]

    def resolved_for(
        self,
        tensors: list[tuple[str, _core.TensorInfo]],
        prefixes: list[str],
        free: int | None,
        has_gpu: bool,
        **options: Any,
    ) -> Plan:
        """This plan resolved for a model's tensors and blocks (see :func:`planning_inputs`) and
        the device's free memory (``free``, bytes; None off a GPU): a new plan. ``options`` are
        the core's (``compute_dtype``, ``storage_dtype``, ``lookahead``, ``pinned_buffers``,
        ``max_lookahead``)."""
        return Plan(self._core.resolve(tensors, prefixes, free, has_gpu, **options))

    def shared_staging(self) -> tuple[int, int]:
        """(buffers, bytes of each) of a shared staging pool that holds this plan's blocks in
        whichever tiers they are put."""
        return self._core.shared_staging()

    def engine_config(self) -> _core.EngineConfig:
        """Every figure the runtime holds, from this (resolved) plan."""
        return _core.EngineConfig(self._core)

    def holds(self, stage: str = "model") -> _core.Holds:
        """What a model loaded by this (resolved) plan holds under the current settings, and
        its release gives back: the figures a pipeline moves between stages (``stage`` names
        it in errors)."""
        return _core.Holds.of(stage, self._core)

    def needs(self, stage: str = "model") -> _core.Holds:
        """What a model loaded by this plan needs free at its start: what it holds, and the free
        memory the plan leaves alone (free-RAM floor, activation reserve, CUDA context)."""
        return _core.Holds.needed(stage, self._core)

    def at_once(self, stage: str = "model") -> _core.Holds:
        """What a model loaded by this plan takes as its load is set up, before any read a
        stage read ahead puts behind its allowance: its own staging buffers and, on a GPU, its
        device slots and expansion buffers."""
        return _core.Holds.at_once(stage, self._core)

    def load_reads(self, files: int) -> _core.LoadReads:
        """How a model loaded by this (resolved) plan on its own reads its files of ``files``
        bytes: past the page cache unless they stay cached beside what the plan holds in RAM
        (``TRASH_PANDA_DISK_MODE`` other than ``auto`` wins)."""
        return _core.plan_reads(self._core, files)

    def __str__(self) -> str:
        return str(self._core)

    def __repr__(self) -> str:
        return repr(self._core)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Plan) and self._core == other._core

    __hash__ = None  # type: ignore[assignment]


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
    expected = set(model.state_dict(keep_vars=True).keys())
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
        staging_pool=staging_pool,
    )
    result = Plan(core)
    from .log import log_plan

    files = checkpoint.files if isinstance(checkpoint, Checkpoint) else [os.fspath(checkpoint)]
    log_plan(result, files[0] if len(files) == 1 else os.path.dirname(files[0]))
    return result


def dtype_name(dtype: str | torch.dtype) -> str:
    """A dtype as the core reads it: a name is passed as it is, a torch dtype by its name."""
    return dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
