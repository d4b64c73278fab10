"""A GGUF file's tensors under a transformers model's names, by transformers' own tables: the
names (``get_gguf_hf_weights_map``, built on gguf-py's name map) and what its tensor processor of
the file's architecture does to each tensor on load. A processor that only reorders rows (the
Llama family's attention projections, stored permuted for llama.cpp's rotary layout) becomes a
row order the core applies as it expands; one that changes values any other way cannot be
streamed from the compact form, and is refused by name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .checkpoint_names import TensorMap, TensorView
from .errors import CheckpointError

if TYPE_CHECKING:
    from torch import nn

    from .checkpoint import Checkpoint


def _processor(architecture: str, config: dict[str, Any]) -> Any:
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    made: Any = TENSOR_PROCESSORS.get(architecture, TensorProcessor)
    return made(config=config)


def _row_order(processor: Any, name: str, rows: int, key_map: dict[str, str]) -> list[int] | None:
    """What the processor does to tensor ``name`` of ``rows`` rows, found by giving it the row
    numbers as the weights: None when it leaves them alone, the order when it only reorders
    them; otherwise the tensor cannot be streamed."""
    import numpy as np

    probe = np.arange(rows, dtype=np.float64).reshape(rows, 1)
    result = processor.process(weights=probe, name=name, tensor_key_mapping=key_map, parsed_parameters={})
    out = np.asarray(result.weights)
    if result.name != name or out.shape != probe.shape:
        raise CheckpointError(
            f"tensor {name!r}: transformers renames or reshapes it on load, which streaming does not do yet"
        )
    order = out.reshape(-1)
    if np.array_equal(order, probe.reshape(-1)):
        return None
    if not np.array_equal(np.sort(order), probe.reshape(-1)):
        raise CheckpointError(
            f"tensor {name!r}: transformers changes its values on load (not only the order of its rows), "
            "which streaming the compact form cannot do yet"
        )
    return [int(r) for r in order]


def gguf_tensor_map(model: nn.Module, ckpt: Checkpoint) -> TensorMap:
    """For a model built from a GGUF file's config: each of the file's tensors under the model's
    name, with the row order of those the model takes reordered."""
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    meta = ckpt.gguf_metadata() or {}
    architecture = str(meta.get("general.architecture", ""))
    config: dict[str, Any] = model.config.to_dict()  # type: ignore[union-attr,operator]
    processor = _processor(architecture, config)
    names: dict[str, str] = get_gguf_hf_weights_map(model, processor)
    views: dict[str, list[TensorView]] = {}
    for info in ckpt.tensors():
        if info.name not in names:
            continue
        order = None
        if len(info.shape) >= 2:
            order = _row_order(processor, info.name, int(info.shape[0]), names)
        views[info.name] = [TensorView(names[info.name], order=None if order is None else tuple(order))]
    return TensorMap(views)
