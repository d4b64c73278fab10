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

STATE_ATTR = "_trash_panda_state"
# The forward pre-hook that refuses to run a released model, until it is loaded again.
RELEASED_ATTR = "_trash_panda_released"
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
    owners: list[tuple[nn.Module, str]] = field(default_factory=list)  # every (module, attr) it is under

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

    def refresh_work(self) -> None:
        """Computes :attr:`work` again on its next use: the block's weights were loaded after
        the hooks were installed (stage(overlap=True)'s loader)."""
        self.__dict__.pop("work", None)

    @property
    def needs_hooks(self) -> bool:
        """Streamed blocks, and resident blocks with weights to expand each run."""
        return bool(self.work)


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
    guards: list[Any] = field(default_factory=list)  # hooks that check mapped tables' files

    def remove_guards(self) -> None:
        for h in self.guards:
            h.remove()
        self.guards = []


_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


def register_model(model: nn.Module) -> None:
    """Remembers a loaded model (weakly), so offload_blocks() can find the model of a block."""
    _LIVE.add(model)


def live_models() -> list[nn.Module]:
    return list(_LIVE)


def get_state(model: nn.Module) -> ModelState | None:
    state: ModelState | None = getattr(model, STATE_ATTR, None)
    return state


def _refuse_released(module: nn.Module, _args: Any) -> None:
    from ..errors import TrashPandaError

    raise TrashPandaError(
        f"{type(module).__name__} was released by trash_panda.release() and cannot run; "
        "load it again with stream_load()"
    )


def mark_released(model: nn.Module) -> None:
    """Makes the model refuse to run (its weights are gone) until :func:`clear_released`."""
    if getattr(model, RELEASED_ATTR, None) is None:
        setattr(model, RELEASED_ATTR, model.register_forward_pre_hook(_refuse_released))


def clear_released(model: nn.Module) -> None:
    """Lets a model released before run again: it was loaded again."""
    mark = getattr(model, RELEASED_ATTR, None)
    if mark is not None:
        mark.remove()
        delattr(model, RELEASED_ATTR)
