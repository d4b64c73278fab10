"""Merges of PEFT's adapters into streamed layers: recorded when PEFT is asked to merge (the
layer holds a placeholder then), made by PEFT's own code the first time the layer runs, on the
weight it is brought with, and kept from one run to the next: written into the block's image
where the block lives (:mod:`.patches`), so later runs are staged merged and merge nothing, or,
where the block can keep no image, beside the model where the plan leaves RAM free
(:class:`MergedCopies`); with neither, made again on each run.

A layer stored in fp8 keeps its merge in the same form (:mod:`.requant`): quantized again in
its scale layout, and expanded on each run as the stored block is.

A merge is recorded with the scales of that moment (a merged weight keeps them, as the plain
model's does, when the scales change later) and outlives its tuner layer
(``unload_lora_weights()`` after ``fuse_lora()``). An unmerge forgets the record and the kept
copy, which gives back the checkpoint's exact bits. The hooks are module hooks on the layers
with merges recorded, named :data:`MERGE_HOOK` and the layer's id, put again whenever the
layer's records change or the model is loaded.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import _core
from ..adapter_names import MERGES_ATTR, merged_layers
from .patches import Patched, adopt, block_of, take_back
from .patches import write as write_patch
from .registry import HookRegistry, model_hooks
from .requant import expand_back, fp8_layout, kept_bytes, requantize
from .state import get_state, live_models

if TYPE_CHECKING:
    import torch
    from torch import nn

    from .state import ModelState, TensorSpec

__all__ = [
    "MERGE_HOOK",
    "Kept",
    "Merge",
    "MergedCopies",
    "attach_merges",
    "kept_size",
    "merged_copies",
    "merged_layers",
    "owner",
    "restore_checkpoint_bits",
    "set_merges",
    "adapters_changed",
]

# The module hooks that merge recorded adapters into a layer's weights as it runs (each
# layer's named by this and the layer's id).
MERGE_HOOK = "adapter_merge"
# The hook of a final pass, which frees each block after its run.
FINAL_PASS = "final_pass"


@dataclass
class Merge:
    """One merge of a tuner layer into a streamed layer, as PEFT was asked for it."""

    layer: nn.Module  # the tuner layer (kept: a merge outlives the layer's unload)
    adapters: list[str]
    merge: Callable[..., None]  # PEFT's own merge of the layer's class
    kwargs: dict[str, Any] = field(default_factory=dict)
    # The layer's scales when it was merged: a merged weight keeps them, as the plain model's
    # does, when the scales change later (set_adapters after fuse_lora).
    scaling: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[Any, ...]:
        """What the merged weight depends on besides the base weight."""
        return (id(self.layer), tuple(self.adapters), tuple(sorted(self.scaling.items())))


@dataclass
class Kept:
    """A merged tensor as it is kept: the weight itself, or (for a layer stored in fp8) its
    codes and scales in the stored layout, expanded on each run."""

    key: tuple[Any, ...]
    tensor: torch.Tensor  # the weight, or its e4m3 codes
    scale: torch.Tensor | None = None
    layout: str | None = None  # the fp8 scale layout; None: ``tensor`` is the weight

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.tensor, self.scale) if t is not None)

    def weight(self, target: torch.dtype) -> torch.Tensor:
        """The weight the layer runs on."""
        if self.layout is None:
            return self.tensor
        return expand_back(self.tensor, self.scale, self.layout, target)


class MergedCopies:
    """The model's kept merges: those written into their blocks' images (``patched``, with the
    blocks' images and what memory images take beyond the plan), and merged weights kept beside
    the model where a block can keep no image, within ``limit`` bytes: on the CPU the RAM the plan
    leaves unassigned (its RAM budget less what the RAM tier takes), and only while the machine
    keeps the plan's ``min_free_ram`` available; none beside a GPU's model, nor in a pipeline's
    stage. A layer with no room either way is merged again on each run."""

    def __init__(self, limit: int, min_free: int = 0) -> None:
        self.spare = limit  # the plan's free RAM for them
        # Adapters the model took after it was planned, which take that free RAM first:
        # counted again when they change.
        self.unplanned = 0
        self.dirty = True
        # What the machine must keep available: a copy that would go below it is not kept
        # (other models planned from the same free RAM may have taken some since).
        self.min_free = min_free
        self.held = 0
        self.made = 0  # merges computed
        self.reused = 0  # runs that found their merged copy kept
        # Layers (by id) whose merge a change of adapters or scales made stale, until their
        # next run makes it again; and how often each was made again so.
        self.stale: set[int] = set()
        self.rebuilt: dict[int, int] = {}
        self._copies: dict[tuple[int, str], Kept] = {}  # by slot
        # Merges written into their blocks' images in the engine (:mod:`.patches`), by slot;
        # the blocks with an image, where it is kept and what it takes beyond the plan's count.
        self.patched: dict[tuple[int, str], Patched] = {}
        self.images: dict[int, str] = {}
        self.image_extra: dict[int, int] = {}
        # The overlay folder of the model's disk-tier images: None until asked, "" if unusable.
        self.overlay_dir: str | None = None
        self.overlay_limit = 0
        # Whether an image was refused (said once).
        self.refused = False
        # The text that names a layer's merges in overlay files, by their keys (made once).
        self.content_keys: dict[tuple[Any, ...], str] = {}

    @property
    def limit(self) -> int:
        """What kept merges may take: the plan's free RAM less the adapters it did not count."""
        return max(0, self.spare - self.unplanned)

    def get(self, slot: tuple[int, str], key: tuple[Any, ...]) -> Kept | None:
        found = self._copies.get(slot)
        return found if found is not None and found.key == key else None

    def put(self, slot: tuple[int, str], kept: Kept) -> bool:
        self.drop(slot)
        if self.held + kept.nbytes > self.limit or _core.available_ram() - kept.nbytes < self.min_free:
            return False
        self._copies[slot] = kept
        self.held += kept.nbytes
        return True

    def drop(self, slot: tuple[int, str]) -> None:
        found = self._copies.pop(slot, None)
        if found is not None:
            self.held -= found.nbytes

    def holds(self, module: nn.Module) -> bool:
        """Whether a merge of ``module`` is kept (beside the model or in its block)."""
        return any(slot[0] == id(module) for slot in (*self._copies, *self.patched))

    def where(self, module: nn.Module) -> str | None:
        """Where the merge of ``module`` is kept: "memory" or "file" (its block's image),
        "beside" (a copy beside the model), or None."""
        for slot, found in self.patched.items():
            if slot[0] == id(module):
                return found.place
        return "beside" if any(slot[0] == id(module) for slot in self._copies) else None

    @property
    def kept(self) -> int:
        """How many merged tensors are kept (a layer's weight and bias each count)."""
        return len(self._copies) + len(self.patched)


def set_merges(module: nn.Module, merges: list[Merge]) -> None:
    had = bool(merged_layers(module))
    if merges:
        module.__dict__[MERGES_ATTR] = merges
    else:
        module.__dict__.pop(MERGES_ATTR, None)
    found = owner(module, outside=True)
    if found is not None:
        copies = merged_copies(found[1], found[0])
        if had:
            copies.stale.add(id(module))
        for slot in _slots(found[1], module):
            copies.drop(slot.key)
            take_back(found[1], slot.key, copies)
        _hook(found[0], found[1], module)
        # With every merge of its block recorded, an image of them may be in the overlay folder.
        for block in {b for spec in found[1].specs_of(module) if (b := block_of(found[1], spec)) is not None}:
            adopt(found[1], block, copies)


def merged_copies(state: ModelState, model: nn.Module | None = None) -> MergedCopies:
    """The model's kept merged weights (made on first use, with the plan's spare RAM); given
    the ``model``, the adapters its plan did not count are counted again if they changed."""
    if state.merged is None:
        budgets = state.plan.budgets
        spare = min_free = 0
        # A pipeline's stage keeps none: the runner hands the memory its plan leaves free to the
        # next stages' reads.
        if budgets is not None and state.device.type == "cpu" and not budgets.shared_staging:
            spare, min_free = max(0, budgets.ram_budget - budgets.ram_used), budgets.min_free_ram
        state.merged = MergedCopies(spare, min_free)
    copies: MergedCopies = state.merged
    if copies.dirty and model is not None:
        copies.dirty = False
        copies.unplanned = _unplanned_adapters(model, state)
    return copies


def _unplanned_adapters(model: nn.Module, state: ModelState) -> int:
    """Bytes of the adapters on ``model`` beyond those its plan counted (loaded after it was
    planned)."""
    from ..adapter_names import adapter_bytes

    budgets = state.plan.budgets
    return max(0, adapter_bytes(model) - (budgets.adapters if budgets is not None else 0))


def restore_checkpoint_bits(module: nn.Module) -> None:
    """After PEFT unmerged every adapter from ``module``'s own weights (held in memory, merged in
    place), a streamed model's layer gets its checkpoint's bytes back, where the checkpoint has
    them as the layer holds them (a tensor the load did not rescale), in the dtype it computes
    in. Weights being trained (``requires_grad``) are left as PEFT left them."""
    import torch

    from ..adapter_names import base_name
    from ..errors import TrashPandaError

    found = owner(module, outside=True)
    if found is None:
        return
    model, state = found
    specs = {spec.owners[0][1]: spec for spec in state.specs_of(module)}
    name = next((n for n, m in model.named_modules() if m is module), None)
    for attr, param in module._parameters.items():
        if param is None or param.is_meta or param.requires_grad:
            continue
        spec = specs.get(attr)
        if spec is not None and (spec.needs_work or spec.scale is not None):
            continue  # streamed (its merge is recorded), or expanded with a scale at load
        wanted = spec.info.name if spec is not None else base_name(f"{name}.{attr}")
        try:
            if wanted not in state.checkpoint:
                continue
            stored = state.checkpoint.read(wanted)
        except TrashPandaError:  # the model was released: its checkpoint is closed
            return
        if tuple(stored.shape) != tuple(param.shape):
            continue
        with torch.no_grad():
            param.copy_(stored.to(param.dtype))


def adapters_changed(module: nn.Module) -> None:
    """PEFT put adapters on ``module`` or took them off: its streamed model counts them again
    (on the next merge kept, or report)."""
    found = owner(module, outside=True)
    if found is not None and found[1].merged is not None:
        found[1].merged.dirty = True


def kept_size(state: ModelState, module: nn.Module) -> int:
    """Bytes a merge of ``module`` takes once kept (:func:`.requant.kept_bytes` for a streamed
    tensor; a weight of the layer's own as it is)."""
    total = 0
    for slot in _slots(state, module):
        param = slot.held()
        if slot.spec is not None:
            total += kept_bytes(slot.spec)
        elif param is not None:
            total += param.numel() * param.element_size()
    return total


def attach_merges(model: nn.Module) -> None:
    """After ``model`` is loaded: the merges recorded on its layers before (or in an earlier
    load) take effect."""
    state = get_state(model)
    if state is not None:
        blocks: set[int] = set()
        for module in model.modules():
            if merged_layers(module):
                _hook(model, state, module)
                blocks.update(b for spec in state.specs_of(module) if (b := block_of(state, spec)) is not None)
        for block in blocks:
            adopt(state, block, merged_copies(state, model))


def owner(module: nn.Module, outside: bool = False) -> tuple[nn.Module, ModelState] | None:
    """The loaded model whose blocks hold ``module`` (``outside``: or that holds it anywhere),
    and its state."""
    for model in live_models():
        state = get_state(model)
        if state is None:
            continue
        if state.specs_of(module) or (outside and any(m is module for m in model.modules())):
            return model, state
    return None


def _hook(model: nn.Module, state: ModelState, module: nn.Module) -> None:
    """Puts the merge hooks on ``module`` if it has merges recorded, and takes off any it had
    (from an earlier load, or before its last merge was undone): each layer's hooks go by a name
    of their own, so a merge of one layer touches no other's."""
    hooks = model_hooks(model)
    name = f"{MERGE_HOOK} {id(module)}"
    hooks.remove(name)
    if merged_layers(module):
        held: list[tuple[_Slot, torch.Tensor]] = []
        start = functools.partial(_merge_in, weakref.ref(module), state, hooks, held)
        hooks.on_module_start(name, module, start)
        hooks.on_module_end(name, module, functools.partial(_give_back, held))


@dataclass
class _Slot:
    """Where a merged layer keeps one of its tensors: a streamed tensor (put under every name
    it goes by), or a parameter of the layer's own (a weight held in memory: a merge recorded
    before the model was loaded, on a layer that then stayed outside the blocks)."""

    module: nn.Module
    attr: str
    spec: TensorSpec | None

    @property
    def key(self) -> tuple[int, str]:
        return (id(self.module), self.attr)

    def held(self) -> torch.Tensor | None:
        param: torch.Tensor | None = self.module._parameters.get(self.attr)
        return param

    def put(self, param: torch.Tensor) -> None:
        if self.spec is not None:
            self.spec.put(param)
        else:
            self.module._parameters[self.attr] = param  # type: ignore[assignment]


def _slots(state: ModelState, module: nn.Module) -> list[_Slot]:
    specs = state.specs_of(module)
    if specs:
        return [_Slot(spec.owners[0][0], spec.owners[0][1], spec) for spec in specs]
    return [_Slot(module, attr, None) for attr, p in module._parameters.items() if p is not None]


def _merge_in(
    ref: weakref.ref[nn.Module],
    state: ModelState,
    hooks: HookRegistry,
    held: list[tuple[_Slot, torch.Tensor]],
) -> None:
    """Before the layer runs: its weights become copies with PEFT's merges applied, kept for
    the next runs where there is room (a block a final pass frees keeps none)."""
    from torch import nn

    module = ref()
    if module is None:
        return
    merges = merged_layers(module)
    if not merges:
        return
    brought = [(slot, p) for slot in _slots(state, module) if (p := slot.held()) is not None and not p.is_meta]
    held.extend(brought)
    copies = merged_copies(state)
    key = tuple(m.key for m in merges)
    final = FINAL_PASS in hooks
    if brought and _staged_merged(brought, key, copies):
        # Staged from its block's image, merged (a final pass drops the image with the block).
        copies.reused += 1
        return
    found = [copies.get(slot.key, key) for slot, _ in brought]
    kept = [k for k in found if k is not None]
    if len(kept) == len(brought):
        for (slot, param), k in zip(brought, kept, strict=True):
            slot.put(nn.Parameter(k.weight(param.dtype), requires_grad=False))
            if final:
                copies.drop(slot.key)
        copies.reused += 1
        return
    for slot, param in brought:
        slot.put(nn.Parameter(param.detach().clone(), requires_grad=False))
    for m in merges:
        layer: Any = m.layer
        merged, scaling = list(layer.merged_adapters), layer.scaling
        layer.merged_adapters, layer.scaling = [], dict(m.scaling)
        try:
            m.merge(layer, adapter_names=m.adapters, **m.kwargs)
        finally:
            layer.merged_adapters, layer.scaling = merged, scaling
    copies.made += 1
    if id(module) in copies.stale:
        copies.stale.discard(id(module))
        copies.rebuilt[id(module)] = copies.rebuilt.get(id(module), 0) + 1
    for slot, param in brought:
        now = slot.held()
        if now is None:
            continue
        made = Kept(key, now.detach())
        layout = fp8_layout(slot.spec)
        if layout is not None:
            # Stored in fp8: the merge too, and the layer runs on its expansion.
            q, scale = requantize(made.tensor, layout)
            made = Kept(key, q, scale, layout)
            ran_on = made.weight(param.dtype)
            slot.put(nn.Parameter(ran_on, requires_grad=False))
        else:
            ran_on = made.tensor
        if final:
            continue
        # Where its block lives, if its staged form can hold it; else beside the model.
        if slot.spec is None or not write_patch(state, slot.spec, merges, made, ran_on, copies, param):
            copies.put(slot.key, made)


def _staged_merged(brought: list[tuple[_Slot, torch.Tensor]], key: tuple[Any, ...], copies: MergedCopies) -> bool:
    """Whether every tensor the layer was brought with was staged merged with ``key``: written
    into its block's image, and brought by a staging made after that (the run that wrote it
    still holds the weight staged before, which it merged itself)."""
    for slot, param in brought:
        found = copies.patched.get(slot.key)
        if found is None or found.key != key or found.written_over(param):
            return False
    return True


def _give_back(held: list[tuple[_Slot, torch.Tensor]]) -> None:
    """After the layer ran: its own weights go back under it (staging gives the brought ones
    back)."""
    while held:
        slot, param = held.pop()
        slot.put(param)
