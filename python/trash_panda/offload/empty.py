"""empty_weights(): build a model with parameters on the meta device and real buffers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["empty_weights"]


@contextlib.contextmanager
def empty_weights() -> Iterator[None]:
    """Inside this block, new parameters are made on the meta device (no memory) while buffers
    are made as usual, so values a model computes at construction (rotary tables, position ids)
    survive for stream_load() even when the checkpoint does not have them.
    """
    from torch import nn

    original = nn.Module.register_parameter

    def register_parameter(self: nn.Module, name: str, param: Any) -> None:
        original(self, name, param)
        if param is not None and not param.is_meta:
            self._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = register_parameter  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]
