"""PEFT's tuner layers (LoRA, LoHa, LoKr, ... as diffusers' ``load_lora_weights`` and
``PeftModel`` put them) on a streamed model.

Between two runs a streamed layer holds a meta placeholder, not its weight, and PEFT reads the
base weight where that matters:

- a new adapter is moved to its base weight's device and dtype (by the layer, then again by the
  model-level tuner that put it in): on a placeholder that is the meta device, which drops the
  adapter's values (the model then computes NaNs). Here an adapter goes to the device the
  streamed model computes on, in the dtype the layer computes in;
- a merge (``fuse_lora()``, ``merge_adapter()``) adds ``ΔW`` to the weight in place: on a
  placeholder, nothing, and the layer then runs without its adapter. Here the merge is recorded
  on the streamed layer (with the scales of that moment), and the first time the layer runs its
  weight is a copy of the brought one with PEFT's own merge applied (the same code, so the same
  bits as merging the plain model); the merged copy is kept for the next runs within the RAM the
  plan leaves free (:class:`MergedCopies`), else made again on each run. An unmerge forgets the
  record and the kept copy, which gives back the checkpoint's exact bits. A merge that outlives
  its tuner layer (``unload_lora_weights()`` after ``fuse_lora()``, as on the plain model)
  stays.

A chained pipeline's components are built on the meta device and loaded when they first run
(:func:`expect_device` names their device): adapters put on them before that go to that device,
and merges into them are recorded and made each time they run once loaded, on the weights
outside the blocks too. Layers whose weights are real when PEFT merges (resident blocks, the
weights outside the blocks of a loaded model) are left to PEFT.

The patch is put on PEFT's classes once, when PEFT is imported after a model was streamed or a
model is streamed after PEFT was imported, and does nothing for a model that is not streamed.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .. import _core
from .registry import HookRegistry, model_hooks
from .state import get_state, live_models

if TYPE_CHECKING:
    import torch
    from torch import nn

    from .state import ModelState, TensorSpec

__all__ = [
    "MERGE_HOOK",
    "MergedCopies",
    "attach_merges",
    "expect_device",
    "merged_copies",
    "merged_layers",
    "watch_peft",
]

# The module hooks that merge recorded adapters into a streamed layer's brought weights.
MERGE_HOOK = "adapter_merge"
# PEFT's package (patched once its import is done: every tuner's classes then exist) and where it
# keeps its tuners' base classes.
_PEFT = "peft"
_TUNERS = "peft.tuners.tuners_utils"
# The hook of a final pass, which frees each block after its run.
FINAL_PASS = "final_pass"
# Where a streamed layer keeps the merges recorded on it.
_MERGES_ATTR = "_trash_panda_merges"

_lock = threading.Lock()
_patched = False


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


class MergedCopies:
    """Merged weights of streamed layers kept from one run to the next, so a merge is computed
    once, not on each run, within ``limit`` bytes: on the CPU the RAM the plan leaves
    unassigned (its RAM budget less what the RAM tier takes), and only while the machine keeps
    the plan's ``min_free_ram`` available; none on a GPU yet, nor in a pipeline's stage. A layer
    with no room is merged again on each run."""

    def __init__(self, limit: int, min_free: int = 0) -> None:
        self.limit = limit
        # What the machine must keep available: a copy that would go below it is not kept
        # (other models planned from the same free RAM may have taken some since).
        self.min_free = min_free
        self.held = 0
        self.made = 0  # merges computed
        self.reused = 0  # runs that found their merged copy kept
        self._copies: dict[tuple[int, str], tuple[tuple[Any, ...], torch.Tensor]] = {}  # slot -> (key, copy)

    def get(self, slot: tuple[int, str], key: tuple[Any, ...]) -> torch.Tensor | None:
        found = self._copies.get(slot)
        return found[1] if found is not None and found[0] == key else None

    def put(self, slot: tuple[int, str], key: tuple[Any, ...], copy: torch.Tensor) -> bool:
        self.drop(slot)
        nbytes = copy.numel() * copy.element_size()
        if self.held + nbytes > self.limit or _core.available_ram() - nbytes < self.min_free:
            return False
        self._copies[slot] = (key, copy)
        self.held += nbytes
        return True

    def drop(self, slot: tuple[int, str]) -> None:
        found = self._copies.pop(slot, None)
        if found is not None:
            self.held -= found[1].numel() * found[1].element_size()

    @property
    def kept(self) -> int:
        """How many merged tensors are kept (a layer's weight and bias each count)."""
        return len(self._copies)

    def clear(self) -> None:
        self._copies.clear()
        self.held = 0


def watch_peft() -> None:
    """Puts the patch on PEFT's tuner layers now if PEFT is imported, else as soon as it is."""
    global _patched
    with _lock:
        if _patched:
            return
        module = sys.modules.get(_TUNERS)
        if module is None or _PEFT not in sys.modules:
            if not any(isinstance(f, _PeftFinder) for f in sys.meta_path):
                sys.meta_path.insert(0, _PeftFinder())
            return
        _patch(module)
        _patched = True


class _PeftFinder(importlib.abc.MetaPathFinder):
    """Patches PEFT's tuner layers right after PEFT's package is imported."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname != _PEFT:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... as the loader's
        return getattr(self.loader, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        global _patched
        self.loader.exec_module(module)
        with _lock:
            tuners = sys.modules.get(_TUNERS)
            if not _patched and tuners is not None:
                _patch(tuners)
                _patched = True
            sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _PeftFinder)]


def _patch(tuners: ModuleType) -> None:
    try:
        _patch_classes(tuners)
    except AttributeError as e:  # a PEFT whose classes we do not know
        warnings.warn(
            f"trash_panda: PEFT's tuner layers are not what this version knows ({e}): adapters "
            "added to a streamed model may not work",
            stacklevel=2,
        )


def _patch_classes(tuners: ModuleType) -> None:
    base = tuners.BaseTunerLayer
    find = base._get_base_layer_device_and_dtype

    @functools.wraps(find)
    def device_and_dtype(self: Any, base_layer: nn.Module) -> tuple[Any, Any]:
        found = _placement(base_layer)
        if found is None:
            device, dtype = find(self, base_layer)
            return device, dtype
        return found

    base._get_base_layer_device_and_dtype = device_and_dtype
    # A model-level tuner moves each new layer to its base's weight's device.
    for cls in [tuners.BaseTuner, *_subclasses(tuners.BaseTuner)]:
        if "_replace_module" in cls.__dict__:
            cls._replace_module = _replacing(cls.__dict__["_replace_module"])
    # Every layer class with a merge of its own (the tuners PEFT imports with its base class).
    for cls in _subclasses(base):
        if "merge" in cls.__dict__:
            setattr(cls, "merge", _merging(cls.__dict__["merge"]))  # noqa: B010
        if "unmerge" in cls.__dict__:
            setattr(cls, "unmerge", _unmerging(cls.__dict__["unmerge"]))  # noqa: B010


def _subclasses(cls: type) -> list[type]:
    out: list[type] = []
    todo = [cls]
    while todo:
        subs: list[type] = todo.pop().__subclasses__()
        for sub in subs:
            if sub not in out:
                out.append(sub)
                todo.append(sub)
    return out


def _replacing(replace: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(replace)
    def patched(self: Any, parent: nn.Module, child_name: str, new_module: nn.Module, child: nn.Module) -> None:
        base = getattr(child, "base_layer", child)
        found = _placement(base)
        if found is None:
            return replace(self, parent, child_name, new_module, child)
        import torch
        from torch import nn

        # It reads the device off the weight: an empty one on the model's device stands in for
        # the placeholder while it runs.
        placeholder = base._parameters["weight"]
        base._parameters["weight"] = nn.Parameter(torch.empty(0, device=found[0], dtype=found[1]), requires_grad=False)
        try:
            return replace(self, parent, child_name, new_module, child)
        finally:
            base._parameters["weight"] = placeholder

    return patched


def _merging(merge: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(merge)
    def patched(self: Any, safe_merge: bool = False, adapter_names: list[str] | None = None, **kwargs: Any) -> None:
        base = self.get_base_layer()
        if _placement(base) is None:
            return merge(self, safe_merge=safe_merge, adapter_names=adapter_names, **kwargs)
        from peft.tuners.tuners_utils import check_adapters_to_merge

        names = [n for n in check_adapters_to_merge(self, adapter_names) if _holds(self, n)]
        if not names:
            return None
        record = Merge(self, names, merge, dict(kwargs, safe_merge=safe_merge), dict(self.scaling))
        _set_merges(base, [*merged_layers(base), record])
        self.merged_adapters.extend(names)
        return None

    return patched


def _unmerging(unmerge: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(unmerge)
    def patched(self: Any, *args: Any, **kwargs: Any) -> None:
        base = self.get_base_layer()
        if not any(m.layer is self for m in merged_layers(base)):
            return unmerge(self, *args, **kwargs)
        _set_merges(base, [m for m in merged_layers(base) if m.layer is not self])
        self.merged_adapters.clear()
        return None

    return patched


def _holds(layer: Any, adapter: str) -> bool:
    """Whether the tuner layer has weights for ``adapter`` (PEFT merges only those)."""
    for name in layer.adapter_layer_names:
        held = getattr(layer, name, None)
        if held is not None and adapter in held:
            return True
    return False


def merged_layers(module: nn.Module) -> list[Merge]:
    """The merges recorded on a streamed layer, in the order they were made."""
    found: list[Merge] = module.__dict__.get(_MERGES_ATTR, [])
    return found


def _set_merges(module: nn.Module, merges: list[Merge]) -> None:
    if merges:
        module.__dict__[_MERGES_ATTR] = merges
    else:
        module.__dict__.pop(_MERGES_ATTR, None)
    found = _owner(module, outside=True)
    if found is not None:
        copies = merged_copies(found[1])
        for slot in _slots(found[1], module):
            copies.drop(slot.key)
        _hook_merges(*found)


def merged_copies(state: ModelState) -> MergedCopies:
    """The model's kept merged weights (made on first use, with the plan's spare RAM)."""
    if state.merged is None:
        budgets = state.plan.budgets
        spare = min_free = 0
        # A pipeline's stage keeps none: the runner hands the memory its plan leaves free to the
        # next stages' reads.
        if budgets is not None and state.device.type == "cpu" and not budgets.shared_staging:
            spare, min_free = max(0, budgets.ram_budget - budgets.ram_used), budgets.min_free_ram
        state.merged = MergedCopies(spare, min_free)
    copies: MergedCopies = state.merged
    return copies


def expect_device(model: nn.Module, device: torch.device) -> None:
    """``model``, built on the meta device, will be loaded to compute on ``device`` in its
    parameters' dtype (a chained pipeline's component before its first call): adapters put on
    it now go there, and merges into it are recorded for when it is loaded."""
    _pending[model] = (device, frozenset(id(m) for m in model.modules()))
    if hasattr(model, "_load_pretrained_model") and not hasattr(model, "hf_device_map"):
        # transformers' load_adapter reads the adapter's weights onto the model's device map,
        # else onto the device of its first parameter (here the meta device).
        setattr(model, "hf_device_map", {"": str(device)})  # noqa: B010


# Models built on meta that will stream once loaded, with their device and their modules.
_pending: weakref.WeakKeyDictionary[nn.Module, tuple[torch.device, frozenset[int]]] = weakref.WeakKeyDictionary()


def _placement(module: nn.Module) -> tuple[torch.device, torch.dtype] | None:
    """Where a managed layer (streamed, or of a model still to be loaded) computes, in what dtype;
    None for a layer whose weight is real or of no model of ours."""
    found = _streamed_weight(module)
    if found is not None:
        return found[0].device, found[1].target
    weight = module._parameters.get("weight") if hasattr(module, "_parameters") else None
    if weight is None or not weight.is_meta:
        return None
    for model, (device, modules) in list(_pending.items()):
        if id(module) in modules and get_state(model) is None:
            return device, weight.dtype
    return None


def attach_merges(model: nn.Module) -> None:
    """After ``model`` is loaded: the merges recorded on its layers before (or in an earlier
    load) take effect."""
    state = get_state(model)
    if state is not None and any(merged_layers(m) for m in model.modules()):
        _hook_merges(model, state)


def _streamed_weight(module: nn.Module) -> tuple[ModelState, TensorSpec] | None:
    """The streamed model and tensor whose placeholder ``module`` holds as its weight, if any."""
    weight = module._parameters.get("weight") if hasattr(module, "_parameters") else None
    if weight is None or not weight.is_meta:
        return None
    found = _owner(module)
    if found is None:
        return None
    state = found[1]
    for spec in state.specs_of(module):
        if spec.placeholder is weight:
            return state, spec
    return None


def _owner(module: nn.Module, outside: bool = False) -> tuple[nn.Module, ModelState] | None:
    """The loaded model whose blocks hold ``module`` (``outside``: or that holds it anywhere),
    and its state."""
    for model in live_models():
        state = get_state(model)
        if state is None:
            continue
        if state.specs_of(module) or (outside and any(m is module for m in model.modules())):
            return model, state
    return None


def _hook_merges(model: nn.Module, state: ModelState) -> None:
    """Puts the merge hooks on the model's layers that have merges recorded (and on no other)."""
    hooks = model_hooks(model)
    hooks.remove(MERGE_HOOK)
    for module in model.modules():
        if merged_layers(module):
            held: list[tuple[_Slot, torch.Tensor]] = []
            ref = weakref.ref(module)
            hooks.on_module_start(MERGE_HOOK, module, functools.partial(_merge_in, ref, state, hooks, held))
            hooks.on_module_end(MERGE_HOOK, module, functools.partial(_give_back, held))


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
    found = [copies.get(slot.key, key) for slot, _ in brought]
    kept = [copy for copy in found if copy is not None]
    final = FINAL_PASS in hooks
    if len(kept) == len(brought):
        for (slot, _), copy in zip(brought, kept, strict=True):
            slot.put(nn.Parameter(copy, requires_grad=False))
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
    if not final:
        for slot, _ in brought:
            now = slot.held()
            if now is not None:
                copies.put(slot.key, key, now.detach())


def _give_back(held: list[tuple[_Slot, torch.Tensor]]) -> None:
    """After the layer ran: its own weights go back under it (staging gives the brought ones
    back)."""
    while held:
        slot, param = held.pop()
        slot.put(param)
