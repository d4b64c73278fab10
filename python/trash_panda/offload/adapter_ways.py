"""The way a streamed layer with no room to keep a merge runs its adapter, chosen at its first
call by the core's cost model: merged again on each run, or beside the weight. Which is cheaper
depends on how many tokens the layer is called with (a merge touches the whole weight once a
run, an unmerged LoRA costs per token), which only the first call tells.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _core
from .merges import FINAL_PASS, owner
from .registry import HookRegistry, model_hooks

if TYPE_CHECKING:
    from torch import nn

__all__ = ["CHOICE_HOOK", "choose_at_first_call"]

# The module hook that makes the choice (each layer's named by this and the layer's id).
CHOICE_HOOK = "adapter_choice"


def choose_at_first_call(
    layer: nn.Module, kind: str, merge: Callable[[Any], None], decided: Callable[[str], None]
) -> bool:
    """On ``layer``'s (a PEFT tuner layer on a streamed weight) first call: the core chooses
    from the call's tokens; ``merge(layer)`` merges its adapters if merging on each run is the
    cheaper, and ``decided(why)`` hears the reason. False where the layer is not streamed."""
    base = layer.get_base_layer()  # type: ignore[operator]
    found = owner(base)
    if found is None:
        return False
    hooks = model_hooks(found[0])
    name = f"{CHOICE_HOOK} {id(layer)}"
    hooks.remove(name)
    choose = functools.partial(_choose, weakref.ref(layer), kind, hooks, name, merge, decided)
    hooks.on_module_start(name, layer, choose)
    return True


def _choose(
    ref: weakref.ref[nn.Module],
    kind: str,
    hooks: HookRegistry,
    name: str,
    merge: Callable[[Any], None],
    decided: Callable[[str], None],
) -> None:
    layer: Any = ref()
    if layer is None:
        return
    inputs = hooks.call_inputs(layer)
    hooks.remove(name)
    x = inputs[0] if inputs else None
    features = _features(layer.get_base_layer())
    if x is None or not hasattr(x, "numel") or features is None:
        return
    in_features, out_features, per_token = features
    adapters = [a for a in layer.active_adapters if a not in layer.merged_adapters]
    rank = max((layer.r.get(a, 0) for a in adapters), default=0)
    choice = _core.choose_adapter_way(
        kind,
        rank,
        in_features,
        out_features,
        max(1, x.numel() // per_token),
        can_keep=False,
        runs_left=1 if FINAL_PASS in hooks else None,
    )
    if choice.way == "merged_each_run":
        merge(layer)
    decided(choice.why)


def _features(base: Any) -> tuple[int, int, int] | None:
    """(in, out, input values per token) of a linear layer or a convolution (a token is one
    position of the input; a convolution's input features are its kernel's elements)."""
    weight = base._parameters.get("weight") if hasattr(base, "_parameters") else None
    if weight is None or weight.dim() < 2:
        return None
    out_features, fan_in = weight.shape[0], math.prod(weight.shape[1:])
    channels = weight.shape[1] * getattr(base, "groups", 1)
    return fan_in, out_features, channels if weight.dim() > 2 else weight.shape[1]
