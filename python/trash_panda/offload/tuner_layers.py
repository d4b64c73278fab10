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
  on the streamed layer and made by PEFT's own code as the layer runs (:mod:`.merges`: the same
  bits as merging the plain model, kept from run to run where the block lives); an unmerge
  forgets it, which gives back the checkpoint's exact bits.

A chained pipeline's components are built on the meta device and loaded when they first run
(:func:`expect_device` names their device): adapters put on them before that go to that device,
and merges into them are recorded and made each time they run once loaded, on the weights
outside the blocks too. Layers whose weights are real when PEFT merges (resident blocks, the
weights outside the blocks of a loaded model) are merged by PEFT in place; once PEFT unmerged
every adapter from one, its weights get the checkpoint's bytes back (PEFT subtracts what it added,
which is not always the bits they had).

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
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..adapter_names import adapter_tensors
from .merges import Merge, adapters_changed, merged_layers, owner, restore_checkpoint_bits, set_merges
from .state import get_state

if TYPE_CHECKING:
    import torch
    from torch import nn

    from .state import ModelState, TensorSpec

__all__ = ["expect_device", "streams", "watch_peft"]

# PEFT's package (patched once its import is done: every tuner's classes then exist) and where it
# keeps its tuners' base classes.
_PEFT = "peft"
_TUNERS = "peft.tuners.tuners_utils"

_lock = threading.Lock()
_patched = False


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

        adapters_changed(base)
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

        # PEFT merges only the adapters the layer has weights for.
        names = [n for n in check_adapters_to_merge(self, adapter_names) if adapter_tensors(self, n)]
        if not names:
            return None
        record = Merge(self, names, merge, dict(kwargs, safe_merge=safe_merge), dict(self.scaling))
        set_merges(base, [*merged_layers(base), record])
        self.merged_adapters.extend(names)
        return None

    return patched


def _unmerging(unmerge: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(unmerge)
    def patched(self: Any, *args: Any, **kwargs: Any) -> None:
        base = self.get_base_layer()
        if not any(m.layer is self for m in merged_layers(base)):
            unmerge(self, *args, **kwargs)
            if not self.merged_adapters:
                restore_checkpoint_bits(base)
            return None
        set_merges(base, [m for m in merged_layers(base) if m.layer is not self])
        self.merged_adapters.clear()
        return None

    return patched


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


def streams(module: nn.Module) -> bool:
    """Whether ``module``'s weights are streamed (or will be, once its model is loaded): a merge
    into it is recorded and made as it runs, never written into a weight in place."""
    return _placement(module) is not None


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


def _streamed_weight(module: nn.Module) -> tuple[ModelState, TensorSpec] | None:
    """The streamed model and tensor ``module`` holds as its weight, if any: a placeholder
    between runs, the weight brought for the run while it runs (a merge asked then is recorded
    as well, not written into the brought weight)."""
    weight = module._parameters.get("weight") if hasattr(module, "_parameters") else None
    if weight is None:
        return None
    found = owner(module)
    if found is None:
        return None
    state = found[1]
    for spec in state.specs_of(module):
        if spec.placeholder is not None and any(m is module and a == "weight" for m, a in spec.owners):
            return state, spec
    return None
