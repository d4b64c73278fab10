"""What stream_load leaves on a model for the hooks: every tensor's source, tier and target."""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

    from .. import _core
    from ..checkpoint import Checkpoint
    from ..plan import Plan, Tier
    from .overlap import ResidentLoader

STATE_ATTR = "_trash_panda_state"
# The name, in the model's hook registry, of the pre-hook that refuses to run a released model
# until it is loaded again.
RELEASED = "released"
# Buffers the model made itself (none in the checkpoint), kept on the CPU by a release so that
# loading the same model again has their values.
KEPT_BUFFERS_ATTR = "_trash_panda_kept_buffers"


@dataclass
class TensorSpec:
    """One parameter of a block and where its weights come from."""

    name: str  # the model's name, e.g. "blocks.3.up.weight"
    module: nn.Module
    attr: str
    info: _core.TensorInfo  # the checkpoint's entry
    scale: _core.TensorInfo | None
    scale_kind: str  # "none", "tensor", "row" or "block" (the core's classification)
    target: torch.dtype  # what the block computes with
    shape: tuple[int, ...]
    staged_index: int | None = None  # position in the engine's layout of the block
    scale_index: int | None = None
    resident: torch.Tensor | None = None  # stored form on the device, for resident blocks
    resident_scale: torch.Tensor | None = None
    placeholder: Any = None  # the meta parameter the module holds between runs
    # The core's name of what its stored form holds where torch cannot say (GGML blocks held as
    # bytes): the file's dtype, or the storage dtype's.
    held_block: str | None = None
    owners: list[tuple[nn.Module, str]] = field(default_factory=list)  # every (module, attr) it is under

    def put(self, param: Any) -> None:
        """Puts ``param`` under every (module, attr) the parameter is under (weights tied
        together stay tied)."""
        for module, attr in self.owners:
            module._parameters[attr] = param

    def held(self) -> Any:
        """The parameter its modules hold now (None when there is none)."""
        module, attr = self.owners[0]
        return module._parameters.get(attr)

    def keep_stored(self, stored: torch.Tensor, scale: torch.Tensor | None, placeholder: Any) -> None:
        """Keeps the weights in their stored form (``stored``, ``scale``, on the device) for the
        hooks to expand before each run; the module holds ``placeholder`` between runs."""
        self.resident, self.resident_scale, self.placeholder = stored, scale, placeholder

    def stream_at(self, staged_index: int, scale_index: int | None, placeholder: Any) -> None:
        """Its place in the engine's layout of its block (and its scale's): the engine stages
        it, and the module holds ``placeholder`` between runs."""
        self.staged_index, self.scale_index, self.placeholder = staged_index, scale_index, placeholder

    def held_name(self, stored: torch.Tensor) -> str:
        """The core's name of the dtype ``stored`` (this tensor's stored form) holds."""
        from .._dtypes import core_name

        return self.held_block if self.held_block is not None else core_name(stored.dtype)

    @property
    def reordered(self) -> bool:
        """The model takes its rows in another order than the stored one."""
        return self.info.rows is not None

    def scale_by_rows(self) -> None:
        """Its stored form was quantized with one scale per row (the storage dtype's rule)."""
        self.scale_kind = "row"

    def drop_stored(self) -> None:
        """Gives back the stored form kept for the hooks (a final pass freed the block)."""
        self.resident = self.resident_scale = None

    def forget(self) -> None:
        """Drops everything it holds (its model was unloaded)."""
        self.resident = self.resident_scale = self.placeholder = None

    @property
    def needs_work(self) -> bool:
        """Filled by the hooks before each run (streamed, or resident and expanded each run)."""
        return self.placeholder is not None

    @property
    def rows_cols(self) -> tuple[int, int]:
        from .. import _core

        return _core.rows_cols(list(self.shape))


@dataclass
class BlockState:
    index: int
    prefix: str
    module: nn.Module
    tier: Tier
    tensors: list[TensorSpec] = field(default_factory=list)
    engine_index: int | None = None  # for streamed blocks

    @functools.cached_property
    def work(self) -> list[TensorSpec]:
        """The tensors the hooks fill before each run; fixed once the block is loaded (the hooks
        ask for it on every run)."""
        return [t for t in self.tensors if t.needs_work]

    def add(self, spec: TensorSpec) -> None:
        """One more of its parameters (while the load matches the model to the checkpoint)."""
        self.tensors.append(spec)
        self.__dict__.pop("work", None)

    def stream_as(self, engine_index: int) -> None:
        """The block is streamed: the engine knows it as ``engine_index``."""
        self.engine_index = engine_index

    def mark_loaded(self) -> None:
        """Its weights were loaded after the hooks were installed (stage(overlap=True)'s
        loader): :attr:`work` is computed again on its next use."""
        self.__dict__.pop("work", None)


@dataclass
class ModelState:
    checkpoint: Checkpoint
    plan: Plan
    config: _core.EngineConfig  # every figure the runtime holds, from the plan
    device: torch.device
    compute_dtype: torch.dtype
    blocks: list[BlockState]
    engine: _core.Engine | None
    report: Any = None
    handle: Any = None  # the OffloadHandle while hooks are installed
    # The modules outside the blocks that hold weights, by name (offload/outside.py): the order
    # hook records where each is first needed.
    outside_modules: dict[str, nn.Module] = field(default_factory=dict)
    # The model's lane of its drive's read queue: every read of the model (the engine's, the
    # loader's, the resident and outside weights', buffers') waits there, ranked by its run order.
    lane: _core.ReadLane | None = None
    # The model's run order as its lane counts positions in it (block indices), once given.
    run_order: list[int] | None = None
    # The pipeline's shared staging pool the engine stages into (None: buffers of its own),
    # registered as pinned once by the pipeline, not by the model's backend.
    staging_pool: _core.StagingPool | None = None
    # stage(overlap=True)'s loader of the resident blocks, while its hook is on: what a GPU
    # release waits for and the profile reports.
    loader: ResidentLoader | None = None
    # Merged weights of streamed layers kept between runs (tuner_layers.MergedCopies), once an
    # adapter is merged into one.
    merged: Any = None

    def share_reads(self, run_order: list[int]) -> None:
        """The model's run order is ``run_order`` (block indices): the lane counts positions in
        it, and the engine's reads rank by their blocks' places in it."""
        if self.lane is None:
            return
        self.run_order = list(run_order)
        self.lane.blocks = len(run_order)
        if self.engine is not None and not self.engine.closed:
            at = {index: pos for pos, index in enumerate(run_order)}
            streamed = sorted((b.engine_index, at[b.index]) for b in self.blocks if b.engine_index is not None)
            self.engine.share_reads(self.lane, [pos for _, pos in streamed])

    def specs_of(self, module: nn.Module) -> list[TensorSpec]:
        """The tensors of the blocks that ``module`` holds (none for a module outside them)."""
        return self._by_module().get(id(module), [])

    def _by_module(self) -> dict[int, list[TensorSpec]]:
        # The blocks are fixed once loaded (a drop replaces the list): made once per list.
        cached = self.__dict__.get("_specs_by_module")
        if cached is None or cached[0] is not self.blocks:
            by: dict[int, list[TensorSpec]] = {}
            for block in self.blocks:
                for spec in block.tensors:
                    for module, _attr in spec.owners:
                        by.setdefault(id(module), []).append(spec)
            cached = (self.blocks, by)
            self.__dict__["_specs_by_module"] = cached
        return cached[1]

    def installed(self, handle: Any) -> None:
        """The offload hooks are installed: ``handle`` is the live one."""
        self.handle = handle

    def uninstalled(self) -> None:
        """The live handle's hooks were removed."""
        self.handle = None

    def drop(self) -> None:
        """Forgets the load: closes the engine and the checkpoint, and drops every weight the
        blocks hold (a handle the caller still holds points at this state: the memory goes now,
        not when the handle does)."""
        if self.engine is not None:
            self.engine.close()
        self.checkpoint.close()
        for block in self.blocks:
            for spec in block.tensors:
                spec.forget()
        self.blocks = []
        self.engine = None
        self.merged = None
        self.lane = None  # its slot in the drive's queue goes with the last handle


_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


def register_model(model: nn.Module) -> None:
    """Remembers a loaded model (weakly), so offload_blocks() can find the model of a block."""
    _LIVE.add(model)


def live_models() -> list[nn.Module]:
    return list(_LIVE)


def get_state(model: nn.Module) -> ModelState | None:
    state: ModelState | None = getattr(model, STATE_ATTR, None)
    return state


def mark_released(model: nn.Module) -> None:
    """Makes the model refuse to run (its weights are gone) until :func:`clear_released`: a
    pre-hook named :data:`RELEASED` in the model's registry, which outlives its offload hooks."""
    from .registry import model_hooks

    hooks = model_hooks(model)
    if RELEASED in hooks:
        return
    name = type(model).__name__

    def refuse() -> None:
        from ..errors import TrashPandaError

        if RELEASED not in hooks:
            # Lifted after torch took the module's pre-hooks for this call: a hook before
            # this one (a chained pipeline's, which starts the component's stage) loaded it.
            return
        raise TrashPandaError(
            f"{name} was released by trash_panda.release() and cannot run; load it again with stream_load()"
        )

    hooks.on_module_start(RELEASED, model, refuse)


def clear_released(model: nn.Module) -> None:
    """Lets a model released before run again: it was loaded again."""
    from .registry import HOOKS_ATTR

    hooks = getattr(model, HOOKS_ATTR, None)
    if hooks is not None:
        hooks.remove(RELEASED)
