"""The mapping between torch dtypes and the core's dtype names."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from .errors import DtypeError

if TYPE_CHECKING:
    import torch

# Header names of safetensors (what the core reports) -> torch attribute names.
_HEADER_TO_TORCH = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
}


@functools.cache
def is_block(name: str) -> bool:
    """Whether a dtype name is one of GGML's block types, which torch holds as bytes (the core's
    rule, asked once per name: the backends ask it for every expansion); False for a name the core
    does not know."""
    from . import _core

    try:
        return _core.is_block_dtype(name)
    except DtypeError:
        return False


def torch_dtype(header_name: str) -> torch.dtype:
    """The torch dtype of a safetensors header dtype name; uint8 for a GGML block type ("Q4_K"),
    whose blocks torch holds as bytes."""
    import torch

    attr = _HEADER_TO_TORCH.get(header_name)
    if attr is None and is_block(header_name):
        return torch.uint8
    if attr is None or not hasattr(torch, attr):
        raise DtypeError(f"dtype {header_name!r} has no torch equivalent in torch {torch.__version__}")
    dtype: torch.dtype = getattr(torch, attr)
    return dtype


def stored_shape(header_name: str, shape: tuple[int, ...] | list[int], nbytes: int) -> tuple[int, ...]:
    """The shape torch gives a stored tensor: its own, or its bytes for a GGML block type."""
    if is_block(header_name):
        return (nbytes,)
    return tuple(shape)


def core_name(dtype: torch.dtype) -> str:
    """The core's name of a torch dtype (the safetensors header name)."""
    for header, attr in _HEADER_TO_TORCH.items():
        if str(dtype) == f"torch.{attr}":
            return header
    raise DtypeError(f"dtype {dtype} is not supported; expected one of {', '.join(_HEADER_TO_TORCH.values())}")


def needs_expansion(held: torch.dtype | str, compute: torch.dtype | str, scaled: bool) -> bool:
    """Whether a weight held as ``held`` (a torch dtype or the core's name of one) is expanded to
    ``compute`` before its block runs, rather than used as it is: the core's one rule (a float in
    another dtype, or one with a scale to apply)."""
    from . import _core

    return _core.needs_expansion(
        held if isinstance(held, str) else core_name(held),
        compute if isinstance(compute, str) else core_name(compute),
        scaled,
    )


def resolve(dtype: torch.dtype | str) -> torch.dtype:
    """A torch dtype from a torch dtype or a name such as "bf16", "fp8" or "float32"."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if not isinstance(dtype, str):
        raise DtypeError(f"expected a torch.dtype or a dtype name, got {type(dtype).__name__}")
    from . import _core

    return torch_dtype(_core.dtype_header_name(dtype))
