"""A single-file checkpoint's tensors (a GGUF file of a Flux, SD3 or Wan transformer, say) under a
diffusers model's names, by diffusers' own converter for the model's class (the one its
``from_single_file`` runs). The converter is run once on stand-ins of the file's tensors, one
value per row that says which tensor and which row it is: what each of the model's tensors holds
then names the file's tensor and its rows (a rename, a split of a fused projection, halves
swapped), which the core reads and reorders without the converter ever seeing the weights. A
converter that computes new values cannot be followed, and is refused by name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .checkpoint_names import TensorMap, TensorView
from .errors import CheckpointError

if TYPE_CHECKING:
    from torch import nn

    from .checkpoint import Checkpoint

# A stand-in's value is its tensor's number times this, plus its row: exact in float64 for
# files of up to a million tensors with rows of up to 2^32.
_ROWS = float(1 << 32)


def _converter(model: nn.Module) -> Any:
    from diffusers.loaders.single_file_model import SINGLE_FILE_LOADABLE_CLASSES

    entry: Any = SINGLE_FILE_LOADABLE_CLASSES.get(type(model).__name__)
    return None if entry is None else entry["checkpoint_mapping_fn"]


def diffusers_tensor_map(model: nn.Module, ckpt: Checkpoint) -> TensorMap:
    """Each of the file's tensors as (parts of) the model's, by diffusers' converter for the
    model's class; the names as they are when the file already has the model's."""
    import torch

    infos = ckpt.tensors()
    wanted = set(model.state_dict())
    names = [t.name for t in infos]
    if wanted <= set(names):
        return TensorMap({n: [TensorView(n)] for n in names if n in wanted})
    convert = _converter(model)
    if convert is None:
        missing = sorted(wanted - set(names))[:3]
        raise CheckpointError(
            f"{ckpt.files[0]}: the file's names are not {type(model).__name__}'s (it lacks {', '.join(missing)}) "
            "and diffusers has no converter for that class"
        )
    probes: dict[str, Any] = {}
    for i, info in enumerate(infos):
        rows = int(info.shape[0]) if info.shape else 1
        probe = torch.arange(rows, dtype=torch.float64) + i * _ROWS
        probes[info.name] = probe.reshape(rows, *([1] * max(len(info.shape) - 1, 0)))
    try:
        converted = convert(checkpoint=probes, config=dict(getattr(model, "config", {})))
    except Exception as e:  # the converter's own error, on stand-ins it does not expect
        raise CheckpointError(
            f"{ckpt.files[0]}: diffusers' converter for {type(model).__name__} does more than rename and "
            f"split the file's tensors ({type(e).__name__}: {e}), which streaming does not follow yet"
        ) from None
    views: dict[str, list[TensorView]] = {}
    for target, value in converted.items():
        found = _view(target, value, infos)
        if found is None:
            raise CheckpointError(
                f"{ckpt.files[0]}: diffusers' converter makes {target!r} from the file's tensors by more than "
                "taking rows of one of them, which streaming does not follow yet"
            )
        views.setdefault(found[0], []).append(found[1])
    return TensorMap(views)


def _view(target: str, value: Any, infos: list[Any]) -> tuple[str, TensorView] | None:
    """Which file tensor and rows the converter put under ``target``; None when it is not rows
    of one tensor."""
    import torch

    if (
        not isinstance(value, torch.Tensor)
        or value.dtype != torch.float64
        or value.numel() != (value.shape[0] if value.dim() else 1)
    ):
        return None
    flat = value.reshape(-1)
    which = torch.div(flat, _ROWS, rounding_mode="floor")
    if flat.numel() == 0 or not bool((which == which[0]).all()):
        return None
    index = int(which[0])
    rows = flat - index * _ROWS
    if not bool((rows == rows.round()).all()) or not 0 <= index < len(infos):
        return None
    info = infos[index]
    order = [int(r) for r in rows]
    first, count = min(order), len(order)
    if sorted(order) != list(range(first, first + count)):
        return None
    local = tuple(r - first for r in order)
    whole = first == 0 and count == (int(info.shape[0]) if info.shape else 1)
    view = TensorView(
        target,
        first=0 if whole else first,
        count=None if whole else count,
        order=None if local == tuple(range(count)) else local,
    )
    return info.name, view
