"""from_pretrained(): a transformers model folder streamed in one call.

The model is built from its config with parameters on the meta device and real buffers (the
rotary tables and position ids it computes), planned, loaded with stream_load and hooked, so
generate(), pipeline() and the model's device/dtype/config behave as on the plain model.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .checkpoint import Checkpoint
from .errors import ArgumentError, TrashPandaError
from .offload import empty_weights
from .options import WITH_A_PLAN, check_flag, check_order, load_options
from .plan import Plan
from .plan import plan as make_plan

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["build_empty", "checkpoint_of", "from_pretrained", "load_built"]


def checkpoint_of(folder: str | os.PathLike[str], stem: str = "model") -> Path:
    """The weights of a model folder: ``<stem>.safetensors.index.json`` (shards),
    ``<stem>.safetensors``, or the folder itself when it holds other ``.safetensors`` files."""
    root = Path(folder)
    if not root.is_dir():
        raise ArgumentError(f"folder: {root} is not a folder (expected a model folder with a config.json)")
    for candidate in (root / f"{stem}.safetensors.index.json", root / f"{stem}.safetensors"):
        if candidate.is_file():
            return candidate
    if any(root.glob("*.safetensors")):
        return root
    found = sorted(p.name for p in root.iterdir())[:8]
    raise ArgumentError(
        f"folder: {root} has no {stem}.safetensors, {stem}.safetensors.index.json or other .safetensors file "
        f"(it holds: {', '.join(found) or 'nothing'}); only safetensors checkpoints can be streamed"
    )


def from_pretrained(
    cls: Any,
    folder: str | os.PathLike[str],
    *,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device | None = None,
    order: list[str] | None = None,
    plan: Plan | None = None,
    overlap: bool = False,
    gguf_file: str | os.PathLike[str] | None = None,
    beside: Sequence[nn.Module] = (),
    **plan_kwargs: Any,
) -> nn.Module:
    """Builds ``cls`` (a transformers model class or an Auto class such as
    ``AutoModelForCausalLM``) from ``folder``'s config, streams its weights and installs the hooks.

    ``dtype`` is the compute dtype (by default the config's, else the checkpoint's). The other
    keyword arguments go to :func:`trash_panda.plan` (``key_map``, ``skip_prefixes`` and
    ``storage_dtype`` to :func:`stream_load` too), unless ``plan`` gives the plan (a
    :class:`Plan`, for example one written with ``Plan.manual`` or loaded from JSON); ``order``
    goes to :func:`install_offload`. With ``overlap=True`` the call returns once the model is
    planned and hooked, and the resident blocks are read on a worker thread in run order while
    the model starts (a block that runs before its weights arrive waits for them), as
    ``stage(overlap=True)`` does. Without ``order`` it then reads ``stage()``'s order file next
    to the checkpoint when there is one (``<checkpoint name>_order.json``), so the blocks are
    read in the order they ran, and the weights outside the blocks that the file places after
    the first block (a final norm, the head) are read by that thread at their place rather than
    before the call returns; it only reads it, since a model returned here has no end of a run
    to write one at (a ``stage()`` of the same checkpoint writes it). With ``order``, or without
    a usable file, every outside weight is read before the call returns. Free the model with
    ``trash_panda.release(model)``.

    ``gguf_file`` (a file in ``folder``, or a path) loads a GGUF file as transformers'
    ``from_pretrained(..., gguf_file=...)`` does: the config from its metadata and its tensors
    under the model's names, by transformers' tables (the ``gguf`` package is needed, as there).
    Its blocks stay in their GGML form (Q4_K, Q8_0, ...) in every tier and are expanded one block
    at a time; a weight equals transformers' dequantized one, rounded once to the compute dtype
    (bf16 unless ``dtype`` says otherwise).

    ``beside`` are models loaded by trash_panda that stay loaded while this one runs (a draft
    for assisted generation, ``generate(..., assistant_model=draft)``): ``ram=`` and ``vram=``
    are then the budget of them all, and what they hold comes off it before this model is
    planned. Load the model called most often first (the draft: its every byte resident saves a
    read per drafted token), then the others beside it.
    """
    _check_cls(cls)
    plan_kwargs = _beside_budget(beside, plan_kwargs)
    if gguf_file is not None:
        return _from_gguf(cls, Path(folder), gguf_file, dtype, device, order, plan, plan_kwargs, overlap)
    ckpt_path = checkpoint_of(folder)
    if not (Path(folder) / "config.json").is_file():
        raise ArgumentError(f"folder: {folder} has no config.json (expected a transformers model folder)")
    if plan is not None and not isinstance(plan, Plan):
        raise ArgumentError(f"plan: expected a trash_panda.Plan, got {type(plan).__name__}")
    if plan is not None and set(plan_kwargs) - set(WITH_A_PLAN):
        raise ArgumentError(
            f"plan: given with planning options ({', '.join(sorted(set(plan_kwargs) - set(WITH_A_PLAN)))}); "
            "give one or the other"
        )
    check_order(order)
    check_flag("overlap", overlap)
    return _from_pretrained(cls, Path(folder), Checkpoint(ckpt_path), dtype, device, order, plan, plan_kwargs, overlap)


def _beside_budget(beside: Sequence[nn.Module], plan_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``plan_kwargs`` with ``ram`` and ``vram`` less what the models ``beside`` hold (their
    plans' figures, as a pipeline counts a loaded stage); unchanged without a budget given, as
    the memory measured free already lacks what they hold."""
    from torch import nn

    from . import _core
    from .offload.state import get_state

    if isinstance(beside, nn.Module) or not all(isinstance(m, nn.Module) for m in beside):
        raise ArgumentError("beside: expected a list of models loaded by trash_panda")
    held = _core.Holds()
    for m in beside:
        state = get_state(m)
        if state is None:
            raise ArgumentError(
                f"beside: expected models loaded by trash_panda (from_pretrained, stage, stream_load); "
                f"{type(m).__name__} is not loaded by it"
            )
        held = held.plus(state.plan.holds(type(m).__name__))
    out = dict(plan_kwargs)
    ram, vram = (out.get(k) for k in ("ram", "vram"))
    if beside and (ram is not None or vram is not None):
        # The budget less what they hold, as a pipeline's free memory counts a loaded stage.
        left = _core.Free(
            0 if ram is None else _core.parse_size(ram, "ram"), None if vram is None else _core.parse_size(vram, "vram")
        ).less(held)
        if ram is not None:
            out["ram"] = left.ram
        if vram is not None:
            out["vram"] = left.vram
    return out


def _check_cls(cls: Any) -> None:
    if not isinstance(cls, type) or not (hasattr(cls, "_from_config") or hasattr(cls, "from_config")):
        raise ArgumentError(
            f"cls: expected a transformers model class or Auto class (e.g. AutoModelForCausalLM), got {cls!r}"
        )


def _from_gguf(
    cls: Any,
    folder: Path,
    gguf_file: str | os.PathLike[str],
    dtype: str | torch.dtype | None,
    device: str | torch.device | None,
    order: list[str] | None,
    given: Plan | None,
    plan_kwargs: dict[str, Any],
    overlap: bool,
) -> nn.Module:
    from transformers import AutoConfig

    from ._dtypes import resolve
    from .gguf_names import gguf_tensor_map

    if not isinstance(gguf_file, (str, os.PathLike)):
        raise ArgumentError(f"gguf_file: expected a file name or path, got {type(gguf_file).__name__}")
    path = Path(gguf_file) if Path(gguf_file).is_absolute() else folder / gguf_file
    if not path.is_file():
        raise ArgumentError(f"gguf_file: expected a file, and {path} is not one")
    if "key_map" in plan_kwargs:
        raise ArgumentError("key_map: expected none with gguf_file (transformers' tables map a GGUF file's names)")
    if given is not None and not isinstance(given, Plan):
        raise ArgumentError(f"plan: expected a trash_panda.Plan, got {type(given).__name__}")
    check_order(order)
    check_flag("overlap", overlap)
    ckpt = Checkpoint(path)
    # The folder gives the config's name for transformers' cache; the file gives the config.
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    concrete = _concrete_class(cls, config)
    compute = resolve(dtype) if dtype is not None else checkpoint_dtype(ckpt)
    with empty_weights():
        model = concrete._from_config(config, dtype=compute).eval()
    plan_kwargs = {**plan_kwargs, "key_map": gguf_tensor_map(model, ckpt)}
    plan_kwargs.setdefault("compute_dtype", compute)
    load_built(model, ckpt, device, order, given, plan_kwargs, overlap, path)
    built: nn.Module = model
    return built


def _from_pretrained(
    cls: Any,
    folder: Path,
    ckpt: Checkpoint,
    dtype: str | torch.dtype | None,
    device: str | torch.device | None,
    order: list[str] | None,
    given: Plan | None,
    plan_kwargs: dict[str, Any],
    overlap: bool,
) -> nn.Module:
    model, compute = build_empty(cls, folder, ckpt, dtype)
    plan_kwargs.setdefault("compute_dtype", compute)
    load_built(model, ckpt, device, order, given, plan_kwargs, overlap, checkpoint_of(folder))
    return model


def build_empty(cls: Any, folder: Path, ckpt: Checkpoint, dtype: str | torch.dtype | None) -> tuple[nn.Module, Any]:
    """The model of ``folder``'s config with parameters on meta and real buffers, in eval mode,
    and its compute dtype (``dtype``, else the config's, else the checkpoint's)."""
    from transformers import AutoConfig, GenerationConfig

    from ._dtypes import resolve

    config = AutoConfig.from_pretrained(folder)
    concrete = _concrete_class(cls, config)
    compute = resolve(dtype) if dtype is not None else _config_dtype(config) or checkpoint_dtype(ckpt)
    with empty_weights():
        model = concrete._from_config(config, dtype=compute).eval()
    if (folder / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(folder)
    return model, compute


def load_built(
    model: nn.Module,
    ckpt: Checkpoint,
    device: str | torch.device | None,
    order: list[str] | None,
    given: Plan | None,
    plan_kwargs: dict[str, Any],
    overlap: bool = False,
    where: str | os.PathLike[str] | None = None,
) -> None:
    """Plans (unless ``given``), loads and hooks a model built by :func:`build_empty`; ``.to()``
    is guarded. With ``overlap`` the resident blocks are read by a worker thread after this
    returns, in the order of ``order`` or else of the order file named after ``where`` (the
    checkpoint's path), which is read, never written. On an error the model is left unloaded."""
    from .offload.hooked import load_and_hook

    p = given if given is not None else make_plan(model, ckpt, device=device, **plan_kwargs)
    shared = load_options(plan_kwargs, p)
    # There is no end of a run here to write an order file at; one that a stage() of the same
    # checkpoint wrote still says where the outside weights are first needed.
    reads = overlap and where is not None
    load_and_hook(
        model,
        ckpt,
        p,
        where if where is not None else ckpt.files[0],
        order=order,
        order_file="read" if reads else "none",
        overlap=overlap,
        load_kwargs={"device": device, **shared},
    )
    guard_to(model)


def _concrete_class(cls: Any, config: Any) -> Any:
    """The model class an Auto class picks for ``config`` (``cls`` itself otherwise)."""
    mapping = getattr(cls, "_model_mapping", None)
    if mapping is None:
        return cls
    try:
        return mapping[type(config)]
    except KeyError:
        raise ArgumentError(
            f"cls: {cls.__name__} has no model class for config {type(config).__name__} "
            f"(model_type {getattr(config, 'model_type', '?')!r})"
        ) from None


def _config_dtype(config: Any) -> torch.dtype | None:
    import torch

    value = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(value, str):
        value = getattr(torch, value, None)
    return value if isinstance(value, torch.dtype) and value.is_floating_point else None


def checkpoint_dtype(ckpt: Checkpoint) -> torch.dtype:
    """The dtype the checkpoint's weights compute in, by the core's rule (the planner's)."""
    from . import _core
    from ._dtypes import torch_dtype

    return torch_dtype(_core.infer_compute_dtype(ckpt.tensors()))


def guard_to(model: nn.Module) -> None:
    """``model.to(...)``, ``.cuda()``, ``.cpu()``, ``.half()`` ... that would move or cast the
    weights stream_load placed: a no-op when they already match, a clear error otherwise (the
    streamed blocks live in the engine, not in the module, so moving the module cannot move them)."""
    import torch

    def check(*args: Any, **kwargs: Any) -> nn.Module:
        device, dtype, _non_blocking, _fmt = torch._C._nn._parse_to(*args, **kwargs)
        here = model.device if hasattr(model, "device") else next(model.parameters()).device
        same_device = device is None or (
            torch.device(device).type == here.type and (torch.device(device).index in (None, here.index))
        )
        same_dtype = dtype is None or dtype == getattr(model, "dtype", dtype)
        if same_device and same_dtype:
            return model
        raise TrashPandaError(
            f"{type(model).__name__} is streamed by trash_panda on {here} in {getattr(model, 'dtype', '?')}; "
            f"it cannot be moved to {device or here} / {dtype or getattr(model, 'dtype', '?')}: "
            "release() it and load it again with from_pretrained(..., device=..., dtype=...)"
        )

    def to_device(kind: str) -> Any:
        return lambda device=None, **_kw: check(torch.device(kind if device is None else device))

    def to_dtype(dt: torch.dtype) -> Any:
        return lambda: check(dt)

    # Instance attributes shadow the class's methods for this model only.
    object.__setattr__(model, "to", check)
    object.__setattr__(model, "cuda", to_device("cuda"))
    object.__setattr__(model, "cpu", lambda: check(torch.device("cpu")))
    for name, dt in (("half", torch.float16), ("float", torch.float32), ("bfloat16", torch.bfloat16)):
        object.__setattr__(model, name, to_dtype(dt))
