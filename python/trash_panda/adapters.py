"""Adapters (LoRA, LoKr, LoHa) on any model, streamed or not. A file is read as a checkpoint is
(its header validated) and mapped onto the model's layers by the core's rules
(``_core.map_adapter``: which layer each tensor patches, every shape checked, each layer's
scale) before the model is touched; :func:`load_adapter` then puts it on as PEFT's layers and
returns a handle, and :func:`adapter_report` says how each layer runs its adapters."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from . import _core
from .adapter_names import adapter_tensors, held_adapters, is_tuner_layer
from .checkpoint import Checkpoint
from .errors import ArgumentError, CheckpointError

if TYPE_CHECKING:
    from torch import nn

__all__ = ["AdapterHandle", "adapter_report", "load_adapter", "read_adapter"]

# The names PEFT and diffusers save an adapter's weights under, in a folder.
ADAPTER_FILES = ("adapter_model.safetensors", "pytorch_lora_weights.safetensors")


def read_adapter(model: nn.Module, path: str | os.PathLike[str], *, component: str | None = None) -> _core.AdapterMap:
    """The adapter file at ``path`` (a ``.safetensors`` file, or a folder holding PEFT's
    ``adapter_model.safetensors`` or diffusers' ``pytorch_lora_weights.safetensors``) mapped onto
    ``model``'s layers. ``component``: the pipeline component ``model`` is (``unet``,
    ``transformer``, ``text_encoder``, ...), whose tensors a pipeline's file holds beside the
    others'; None reads every tensor as the model's. PEFT's ``adapter_config.json`` beside the
    file gives ``lora_alpha`` and ``use_rslora``."""
    from torch import nn

    if not isinstance(model, nn.Module):
        raise ArgumentError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if component is not None and (not isinstance(component, str) or not component):
        raise ArgumentError(f"component: expected a component's name (unet, transformer, ...), got {component!r}")
    file = _adapter_file(Path(path))
    return _read_adapter(Checkpoint(file), _layers(model), component, _config(file))


def _read_adapter(
    ckpt: Checkpoint, layers: list[tuple[str, list[int]]], component: str | None, config: tuple[float | None, bool]
) -> _core.AdapterMap:
    """The file ``ckpt`` mapped onto ``layers`` (see :func:`_layers`), with PEFT's config
    (:func:`_config`)."""
    tensors = [(t.name, list(t.shape)) for t in ckpt.tensors()]
    alphas = {name: _scalar(ckpt, name) for name, _shape in tensors if name.endswith(".alpha")}
    lora_alpha, use_rslora = config
    return _core.map_adapter(tensors, alphas, layers, component=component, lora_alpha=lora_alpha, use_rslora=use_rslora)


def _adapter_file(path: Path) -> Path:
    if path.is_file():
        return path
    if path.is_dir():
        for name in ADAPTER_FILES:
            if (path / name).is_file():
                return path / name
        found = sorted(path.glob("*.safetensors"))
        if len(found) == 1:
            return found[0]
        raise ArgumentError(
            f"path: {path} holds {len(found)} .safetensors files and none named {' or '.join(ADAPTER_FILES)}; "
            "pass the adapter's file"
        )
    raise ArgumentError(f"path: {path} is not an adapter file or a folder holding one")


def _scalar(ckpt: Checkpoint, name: str) -> float:
    """An alpha tensor's value: nan where it is not one number (the core says why)."""
    value = ckpt.read(name)
    return float(value.float().reshape(-1)[0]) if value.numel() == 1 else float("nan")


def _config(file: Path) -> tuple[float | None, bool]:
    """PEFT's ``lora_alpha`` and ``use_rslora`` from the ``adapter_config.json`` beside the
    adapter's ``file``, where there is one."""
    path = file.parent / "adapter_config.json"
    if not path.is_file():
        return None, False
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot read the adapter's config: {e}") from e
    alpha = config.get("lora_alpha") if isinstance(config, dict) else None
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float))):
        raise CheckpointError(f"{path}: lora_alpha is {alpha!r}, expected a number")
    rslora = bool(config.get("use_rslora", False)) if isinstance(config, dict) else False
    return (None if alpha is None else float(alpha)), rslora


def _layers(model: nn.Module) -> list[tuple[str, list[int]]]:
    """The layers an adapter may patch: every module with a 2-D or 4-D weight but embeddings
    (a LoRA on an embedding is not supported yet; the core says so for its tensors)."""
    import torch
    from torch import nn

    out = []
    inside: tuple[str, ...] = ()  # PEFT's tuner layers: their own modules are no layers of the model
    for name, module in model.named_modules():
        if inside and name.startswith(inside):
            continue
        if is_tuner_layer(module):
            inside = (*inside, f"{name}.")
        weight = getattr(module, "weight", None)
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) or not isinstance(weight, torch.Tensor):
            continue
        if weight.dim() in (2, 4):
            out.append((name, list(weight.shape)))
    return out


# PEFT's config class and parameter names for each kind of adapter the core maps.
_PEFT_KINDS = {"lora": "LoraConfig", "loha": "LoHaConfig", "lokr": "LoKrConfig"}
_PEFT_PARTS = {"down": "lora_A.weight", "up": "lora_B.weight"}
# How load_adapter may run an adapter (see its docstring).
_MODES = ("auto", "merged", "unmerged")
# Where a model keeps the adapters load_adapter put on it, in the order they were loaded.
_LOADED_ATTR = "_trash_panda_adapters"


class AdapterHandle:
    """An adapter :func:`load_adapter` put on a model: ``scale`` (settable: the user's weight
    on top of the file's alpha / rank), ``merge()`` and ``unmerge()`` (into the layers'
    weights; on a streamed layer the merge is made on each copy it runs with, and an unmerge
    gives back the checkpoint's bits), ``remove()``. ``layers`` names the layers it patches and
    ``nbytes`` what its matrices hold on the device."""

    def __init__(self, model: nn.Module, name: str, kind: str, layers: list[str], scale: float) -> None:
        self.model = model
        self.name = name
        self.kind = kind
        self.layers = layers
        self._scale = scale
        self.removed = False
        # Why each layer runs the adapter the way it was last decided here: see ``modes``.
        self._why: dict[str, str] = {n: "unmerged (as loaded)" for n in layers}

    def __repr__(self) -> str:
        state = "removed" if self.removed else f"{len(self.layers)} layers, scale {self._scale:g}"
        return f"AdapterHandle({self.name!r}, {self.kind}, {state})"

    @property
    def modes(self) -> dict[str, str]:
        """Each layer's way of running the adapter, merged or unmerged, and why (see
        :func:`load_adapter`'s ``mode``). PEFT runs a layer's adapters all merged or all
        unmerged, so loading or merging another adapter there can change it."""
        found: dict[str, str] = {}
        for name, layer in zip(self.layers, self._tuner_layers(), strict=True):
            way = "merged" if self.name in layer.merged_adapters else "unmerged"
            why = self._why[name]
            together = f"{way} (with the layer's other adapters: PEFT runs them all merged or all unmerged)"
            found[name] = why if why.startswith(way) else together
        return found

    def _tuner_layers(self) -> list[Any]:
        if self.removed:
            raise ArgumentError(f"adapter {self.name!r} was removed from the model")
        modules = dict(self.model.named_modules())
        return [modules[n] for n in self.layers]

    @property
    def scale(self) -> float:
        """The user's weight on the adapter (1: the file's alpha / rank alone); setting it
        changes no weight and reads nothing."""
        return self._scale

    @scale.setter
    def scale(self, value: float) -> None:
        from .offload.tuner_layers import streams

        scale = _check_scale(value)
        layers = self._tuner_layers()
        merged = [layer for layer in layers if self.name in layer.merged_adapters]
        if any(not streams(layer.get_base_layer()) for layer in merged):
            raise ArgumentError(f"adapter {self.name!r} is merged: unmerge() it before changing its scale")
        # A streamed layer's merge is made as it runs: dropped here and made again with the new
        # scale on the layer's next run, reading nothing.
        again = [(layer, list(layer.merged_adapters)) for layer in merged]
        for layer in merged:
            layer.unmerge()
        for layer in layers:
            layer.set_scale(self.name, scale)
        for layer, names in again:
            layer.merge(adapter_names=names)
        self._scale = scale

    @property
    def nbytes(self) -> int:
        """Bytes of its matrices (where the model computes)."""
        return sum(_nbytes(adapter_tensors(layer, self.name)) for layer in self._tuner_layers())

    @property
    def merged(self) -> bool:
        """Whether it is merged into a layer's weight."""
        return any(self.name in layer.merged_adapters for layer in self._tuner_layers())

    def merge(self) -> None:
        """Merges it into its layers' weights (PEFT's merge), with the other adapters active
        there and not merged yet: PEFT runs a layer's adapters all merged or all unmerged."""
        for name, layer in zip(self.layers, self._tuner_layers(), strict=True):
            _merge_active(layer)
            self._why[name] = "merged (asked)"

    def unmerge(self) -> None:
        """Takes it out of its layers' weights again (with the other adapters merged there, as
        PEFT's unmerge does: every merge of the layer is undone)."""
        for name, layer in zip(self.layers, self._tuner_layers(), strict=True):
            if self.name in layer.merged_adapters:
                layer.unmerge()
            self._why[name] = "unmerged (asked)"

    def remove(self) -> None:
        """Takes it off the model: a merge is undone first, and a layer left with no adapter is
        the model's own layer again. Calling it again does nothing."""
        if self.removed:
            return
        self.unmerge()
        modules = dict(self.model.named_modules())
        for name in self.layers:
            layer = modules[name]
            layer.delete_adapter(self.name)
            if not held_adapters(layer):
                parent, _, child = name.rpartition(".")
                setattr(modules[parent] if parent else self.model, child, layer.get_base_layer())
        config = getattr(self.model, "peft_config", None)
        if isinstance(config, dict):
            config.pop(self.name, None)
            if not config:
                del self.model.peft_config
        loaded = self.model.__dict__.get(_LOADED_ATTR, [])
        if self.name in loaded:
            loaded.remove(self.name)
        self.removed = True
        from .offload.merges import adapters_changed

        adapters_changed(self.model)  # the memory it took is free for kept merges again


def _peft_config(
    kind: str,
    targets: list[str],
    ranks: dict[str, int],
    alphas: dict[str, float],
    use_rslora: bool,
    decompose_both: bool,
) -> Any:
    """PEFT's config for the layers ``targets``, each with its rank and alpha."""
    import peft

    # PEFT types alpha as an int; a file's alpha may be any number, which PEFT divides as well.
    r, alpha = next(iter(ranks.values())), cast(Any, next(iter(alphas.values())))
    common: dict[str, Any] = {"r": r, "target_modules": targets, "rank_pattern": ranks, "alpha_pattern": alphas}
    if kind == "lora":
        return peft.LoraConfig(**common, lora_alpha=alpha, use_rslora=use_rslora, init_lora_weights=False)
    if kind == "loha":
        return peft.LoHaConfig(**common, alpha=alpha, init_weights=False)
    return peft.LoKrConfig(**common, alpha=alpha, decompose_both=decompose_both, init_weights=False)


def _is_adapter_key(key: str, name: str) -> bool:
    """Whether ``key`` (a model's state dict key) is a weight of the adapter ``name``
    (``...lora_A.<name>.weight``, ``...hada_w1_a.<name>``)."""
    parts = key.split(".")
    return any(p.startswith(("lora_", "hada_", "lokr_")) and nxt == name for p, nxt in itertools.pairwise(parts))


def _undo(model: nn.Module, name: str, layers: list[str]) -> None:
    """Takes a half-loaded adapter off again."""
    AdapterHandle(model, name, "", layers, 1.0).remove()


def _nbytes(tensors: list[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _check_scale(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ArgumentError(f"scale: expected a number, got {value!r}")
    return float(value)


def load_adapter(
    model: nn.Module,
    path: str | os.PathLike[str],
    *,
    scale: float = 1.0,
    name: str | None = None,
    component: str | None = None,
    mode: str = "auto",
) -> AdapterHandle:
    """Puts the adapter at ``path`` (LoRA, LoHa or LoKr, in PEFT's, diffusers', kohya's or
    LyCORIS' naming: see :func:`read_adapter`) on ``model``, streamed or not, as PEFT's layers
    (the calls of PEFT and diffusers then see it), active beside the adapters loaded before it.
    ``scale`` multiplies the file's alpha / rank; ``name`` is its name among the model's
    adapters (by default the file's stem); ``component`` as for :func:`read_adapter`.

    ``mode`` says how each layer runs it: ``"unmerged"`` (``W x + s·B(A x)`` on each call),
    ``"merged"`` (merged into every layer's weight), or ``"auto"``: merged into each streamed
    layer whose merged weight fits in the RAM the plan leaves free (made on its first run, then
    kept: later steps cost what they cost without the adapter); on a streamed layer with no
    room, chosen at its first call by the core's cost model (merging again on each run touches
    the whole weight, running the adapter beside it costs per token: many tokens a call make
    merging the cheaper); unmerged on a weight held in memory (a merge would change it in
    place). ``handle.modes`` says which, and why, per layer.
    Nothing of the model's weights is read again. Needs PEFT."""
    from torch import nn

    if not isinstance(model, nn.Module):
        raise ArgumentError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    scale = _check_scale(scale)
    if component is not None and (not isinstance(component, str) or not component):
        raise ArgumentError(f"component: expected a component's name (unet, transformer, ...), got {component!r}")
    if mode not in _MODES:
        raise ArgumentError(f"mode: expected one of {', '.join(_MODES)}, got {mode!r}")
    file = _adapter_file(Path(path))
    if name is None:
        name = file.parent.name if file.name in ADAPTER_FILES else file.stem
    if not isinstance(name, str) or not name or "." in name:
        raise ArgumentError(f"name: expected a name without dots, got {name!r}")
    loaded = model.__dict__.setdefault(_LOADED_ATTR, [])
    config = getattr(model, "peft_config", None)
    if name in loaded or (isinstance(config, dict) and name in config):
        raise ArgumentError(f"name: the model already has an adapter named {name!r}; pass another name")
    try:
        import peft  # noqa: F401
    except ImportError as e:
        raise ArgumentError("load_adapter needs PEFT: pip install peft") from e
    return _load_adapter(model, file, scale, name, component, mode)


def _load_adapter(
    model: nn.Module, file: Path, scale: float, name: str, component: str | None, mode: str
) -> AdapterHandle:
    import re

    from peft import inject_adapter_in_model, set_peft_model_state_dict

    from .offload.tuner_layers import watch_peft

    watch_peft()
    ckpt, layers, config = Checkpoint(file), _layers(model), _config(file)
    mapped = _read_adapter(ckpt, layers, component, config)
    kinds = sorted({layer.kind for layer in mapped.layers})
    if not kinds:
        raise CheckpointError(f"{file}: holds no adapter for this model (every tensor is another component's)")
    if len(kinds) > 1:
        raise CheckpointError(f"{file}: mixes kinds of adapters ({', '.join(kinds)}); one kind per file is supported")
    kind = kinds[0]
    shapes = dict(layers)
    ranks: dict[str, int] = {}
    alphas: dict[str, float] = {}
    state: dict[str, Any] = {}
    for layer in mapped.layers:
        key = re.escape(layer.layer)
        if layer.rank:
            ranks[key], alphas[key] = layer.rank, layer.alpha
        else:
            # A LoKr of whole factors: PEFT keeps a factor whole where the rank is at least half
            # its size, and scales by alpha / rank (here 1).
            ranks[key] = max(shapes[layer.layer])
            alphas[key] = float(ranks[key])
        for part, tensor in layer.parts.items():
            if part == "alpha":
                continue
            value = ckpt.read(tensor)
            if kind == "lora" and len(shapes[layer.layer]) == 2 and value.dim() == 4:
                value = value.reshape(value.shape[0], value.shape[1])  # a linear layer's LoRA saved as 1x1
            state[f"{layer.layer}.{_PEFT_PARTS.get(part, part)}"] = value
    use_rslora = config[1]
    # PEFT takes the first pattern that matches the end of a layer's name: the longest first.
    order = sorted(ranks, key=len, reverse=True)
    config = _peft_config(
        kind,
        [layer.layer for layer in mapped.layers],
        {k: ranks[k] for k in order},
        {k: alphas[k] for k in order},
        use_rslora,
        decompose_both=any("lokr_w1_a" in layer.parts for layer in mapped.layers),
    )
    inject_adapter_in_model(config, model, adapter_name=name)
    result = set_peft_model_state_dict(model, state, adapter_name=name)
    missing = [k for k in getattr(result, "missing_keys", []) if _is_adapter_key(k, name)]
    if missing:
        _undo(model, name, [layer.layer for layer in mapped.layers])
        raise CheckpointError(f"{file}: the adapter's weights do not fit its layers: {missing[:3]} were not filled")
    loaded = model.__dict__.setdefault(_LOADED_ATTR, [])
    loaded.append(name)
    handle = AdapterHandle(model, name, kind, [layer.layer for layer in mapped.layers], 1.0)
    modules = dict(model.named_modules())
    for layer_name in handle.layers:
        layer = modules[layer_name]
        layer.set_adapter([n for n in loaded if n in held_adapters(layer)], inference_mode=True)
    _check_room(model)
    if scale != 1.0:
        handle.scale = scale
    if mode == "merged":
        handle.merge()
    elif mode == "auto":
        _merge_where_kept(model, handle)
    return handle


def _check_room(model: nn.Module) -> None:
    """After adapters were put on a streamed model: warns where those its plan did not count
    take more than the plan left free (on a GPU its unassigned device memory, where they live;
    on the CPU its free RAM, which kept merges then no longer get)."""
    import warnings

    from .offload.merges import adapters_changed, merged_copies
    from .offload.state import get_state

    state = get_state(model)
    budgets = state.plan.budgets if state is not None else None
    if state is None or budgets is None:
        return
    adapters_changed(model)
    extra = merged_copies(state, model).unplanned
    free = budgets.device_budget - budgets.device_used if budgets.gpu else max(0, budgets.ram_budget - budgets.ram_used)
    if extra > free:
        where = "device memory" if budgets.gpu else "RAM"
        warnings.warn(
            f"{type(model).__name__}: its adapters take {extra / 1e6:.1f} MB of {where} its plan did not count, "
            f"more than the {free / 1e6:.1f} MB it left free: plan the model with the adapters on it "
            "(a chained pipeline's components are), or with fewer resident blocks (resident_blocks=)",
            stacklevel=4,
        )


def _merge_active(layer: Any) -> None:
    """Merges the adapters active on ``layer`` and not merged yet (a merged PEFT layer runs no
    unmerged adapter)."""
    names = [n for n in layer.active_adapters if n not in layer.merged_adapters]
    if names:
        layer.merge(adapter_names=names)


def _merge_where_kept(model: nn.Module, handle: AdapterHandle) -> None:
    """``mode="auto"``: merges the adapter into the streamed layers whose merged weights fit in
    the room the model's kept merges have left, in the model's order; on the other streamed
    layers the core's cost model chooses at their first call between merging on each run and
    running the adapter unmerged; layers held in memory run it unmerged."""
    from .offload.adapter_ways import choose_at_first_call
    from .offload.merges import kept_size, merged_copies
    from .offload.patches import images_for
    from .offload.state import get_state
    from .offload.tuner_layers import streams

    state = get_state(model)
    room = 0
    if state is not None:
        copies = merged_copies(state, model)
        room = copies.limit - copies.held
    for name, layer in zip(handle.layers, handle._tuner_layers(), strict=True):
        base = layer.get_base_layer()
        if not streams(base):
            handle._why[name] = "unmerged (its weight is held in memory: a merge would change it in place)"
            continue
        place = images_for(state, base, merged_copies(state, model)) if state is not None else None
        if place is not None:
            _merge_active(layer)
            where = "an overlay file" if place == "file" else "memory"
            handle._why[name] = f"merged (kept in its block's image in {where} after its first run: staged merged)"
            continue
        nbytes = kept_size(state, base) if state is not None else 0
        if state is None or nbytes > room:

            def decided(why: str, name: str = name) -> None:
                handle._why[name] = why

            if choose_at_first_call(layer, handle.kind, _merge_active, decided):
                handle._why[name] = "unmerged (no room to keep its merge: chosen at its first call)"
            else:
                handle._why[name] = "unmerged (its model is not loaded yet: merge() it to merge)"
            continue
        room -= nbytes
        _merge_active(layer)
        handle._why[name] = "merged (kept in the RAM the plan leaves free after its first run)"


def _layer_kind(layer: Any) -> str:
    """How the tuner layer ``layer`` runs its adapters: "streamed" (merged into a streamed
    weight), "in_place" (merged by PEFT into a weight held in memory), "unmerged" or "none"
    (no adapter active). A merged PEFT layer runs none of its adapters unmerged."""
    from .offload.merges import merged_layers

    if merged_layers(layer.get_base_layer()):
        return "streamed"
    if layer.merged_adapters:
        return "in_place"
    return "unmerged" if layer.active_adapters else "none"


def _layer_way(model: nn.Module, layer: Any) -> str:
    """How the tuner layer ``layer`` runs its active adapters, and why."""
    from .offload.merges import merged_copies, merged_layers
    from .offload.state import get_state
    from .offload.tuner_layers import streams

    base = layer.get_base_layer()
    kind = _layer_kind(layer)
    if kind == "streamed":
        state = get_state(model)
        merged = ", ".join(a for m in merged_layers(base) for a in m.adapters)
        kept = merged_copies(state, model).where(base) if state is not None else None
        if kept == "memory":
            return f"{merged} merged into the streamed weight, kept in its block's image in memory (staged merged)"
        if kept == "file":
            return f"{merged} merged into the streamed weight, kept in its block's overlay file (staged merged)"
        if kept == "beside":
            return f"{merged} merged into the streamed weight, kept beside the model (later runs cost nothing more)"
        return f"{merged} merged into the streamed weight as it runs (not kept: no room, or not run yet)"
    if kind == "in_place":
        return f"{', '.join(layer.merged_adapters)} merged in place by PEFT (its weight is held in memory)"
    if kind == "none":
        return "no adapter active"
    active = ", ".join(layer.active_adapters)
    if streams(base):
        return f"{active} unmerged beside the streamed weight (W x + s·B(A x) on each call)"
    return f"{active} unmerged (its weight is held in memory: a merge would change it in place)"


def _listed(names: list[str], most: int = 6) -> str:
    shown = ", ".join(names[:most]) + (f", ... ({len(names) - most} more)" if len(names) > most else "")
    return f"({shown})" if names else ""


def adapter_report(model: nn.Module, per_layer: bool = False) -> str:
    """What the adapters on ``model`` are and how each layer runs them: unmerged (beside the
    weight, on each call), merged into a streamed layer (kept merged in the RAM the plan leaves
    free, or merged again on each run where there is none), or merged in place by PEFT (a
    weight held in memory). Every PEFT layer counts, whoever put it there; ``per_layer`` adds
    a line for each, with its adapters, its way and why."""
    from torch import nn

    if not isinstance(model, nn.Module):
        raise ArgumentError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(per_layer, bool):
        raise ArgumentError(f"per_layer: expected True or False, got {per_layer!r}")
    return _adapter_report(model, per_layer)


def _adapter_report(model: nn.Module, per_layer: bool) -> str:
    from .offload.merges import merged_copies, merged_layers
    from .offload.state import get_state

    state = get_state(model)
    layers: list[Any] = [m for m in model.modules() if is_tuner_layer(m)]
    if not layers:
        return f"{type(model).__name__}: no adapters"
    adapters: dict[str, list[int]] = {}  # name -> [layers, bytes]
    kinds = {"streamed": 0, "in_place": 0, "unmerged": 0, "none": 0}
    for layer in layers:
        for adapter in held_adapters(layer):
            entry = adapters.setdefault(adapter, [0, 0])
            entry[0] += 1
            entry[1] += _nbytes(adapter_tensors(layer, adapter))
        kinds[_layer_kind(layer)] += 1
    streamed, unmerged, in_place = kinds["streamed"], kinds["unmerged"], kinds["in_place"]
    where = f"streamed on {state.device}" if state is not None else "not streamed"
    lines = [f"{type(model).__name__} ({where}): {len(adapters)} adapter(s) on {len(layers)} layers"]
    for adapter, (count, nbytes) in adapters.items():
        lines.append(f"  {adapter}: {count} layers, {nbytes / 1e6:.1f} MB")
    lines.append(f"  with an adapter unmerged (W x + s·B(A x) on each call): {unmerged} layers")
    lines.append(f"  merged in place by PEFT (weights held in memory): {in_place} layers")
    if state is not None:
        copies = merged_copies(state, model)
        beside = copies.kept - len(copies.patched)
        lines.append(
            f"  merged into streamed layers: {streamed} layers; {copies.made} merges made, "
            f"{copies.reused} runs on kept ones"
        )
        if copies.patched and state.engine is not None and not state.engine.closed:
            images = state.engine.overlay_bytes()
            folder = f" in {copies.overlay_dir}" if images.file else ""
            lines.append(
                f"  kept merged where their blocks live (staged merged): {len(copies.patched)} tensors of "
                f"{images.blocks} blocks, {images.memory / 1e9:.3f} GB of memory images and "
                f"{images.file / 1e9:.3f} GB of overlay files{folder}"
            )
        lines.append(
            f"  kept merged beside the model: {beside} tensors; of the {copies.limit / 1e9:.2f} GB the plan "
            f"leaves free they and the memory images beyond the plan take {copies.held / 1e9:.3f} GB"
        )
        if copies.unplanned:
            lines.append(
                f"  adapters its plan did not count (loaded after it was planned): {copies.unplanned / 1e6:.1f} MB, "
                "taken from the memory the plan left free"
            )
        unkept = [m for m in layers if _layer_kind(m) == "streamed" and not copies.holds(m.get_base_layer())]
        if unkept:
            lines.append(
                f"  merged again on each run (no room to keep the merge, or not run yet): {len(unkept)} layers"
            )
        modules = {id(m): (n.removesuffix(".base_layer"), m) for n, m in model.named_modules()}
        rebuilt = sorted(modules[i][0] for i in copies.rebuilt if i in modules)
        waiting = sorted(modules[i][0] for i in copies.stale if i in modules and merged_layers(modules[i][1]))
        if rebuilt or waiting:
            lines.append(
                f"  merges made again after a change of adapters or scales: {len(rebuilt)} layers "
                f"{_listed(rebuilt)}, {sum(copies.rebuilt.values())} times; the weights were "
                "streamed as on any run, nothing else read"
            )
        if waiting:
            lines.append(f"  to be made again on their next run: {len(waiting)} layers {_listed(waiting)}")
    if per_layer:
        lines.append("  per layer:")
        for name, module in model.named_modules():
            if is_tuner_layer(module):
                lines.append(f"    {name} [{', '.join(held_adapters(module))}]: {_layer_way(model, module)}")
    return "\n".join(lines)
