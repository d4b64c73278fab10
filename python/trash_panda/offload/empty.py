"""empty_weights(): build a model with parameters on the meta device and real buffers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["empty_weights", "no_init_on_meta"]


@contextlib.contextmanager
def empty_weights() -> Iterator[None]:
    """Inside this block, new parameters are made on the meta device (no memory) while buffers
    are made as usual, so values a model computes at construction (rotary tables, position ids)
    survive for stream_load() even when the checkpoint does not have them. Initializers on the
    meta parameters are skipped (see :func:`no_init_on_meta`).
    """
    from torch import nn

    original = nn.Module.register_parameter

    def register_parameter(self: nn.Module, name: str, param: Any) -> None:
        original(self, name, param)
        if param is not None and not param.is_meta:
            self._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = register_parameter  # type: ignore[method-assign]
    try:
        with no_init_on_meta():
            yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


@contextlib.contextmanager
def no_init_on_meta() -> Iterator[None]:
    """Inside this block, initializing a tensor on the meta device does nothing.

    A meta tensor has no values to set, yet torch runs several initializers on it (``normal_``,
    and the truncated normal's ``erfinv_`` and ``clamp_``) through Python references whose first
    call imports ``torch._dynamo``: 1.5 s and 150 MB of RSS, once per process, in the first build
    of any model with an embedding. Initializers on real tensors (buffers a model computes) run
    as usual.
    """
    import torch
    from torch.overrides import TorchFunctionMode

    skipped = _initializers()

    class Skip(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func in skipped:
                # torch.nn.init passes its tensor by keyword; the methods, first.
                target = args[0] if args else kwargs.get("tensor")
                if isinstance(target, torch.Tensor) and target.is_meta:
                    return target
            return func(*args, **kwargs)

    with Skip():
        yield


def _initializers() -> frozenset[Any]:
    """The initializers a model's construction runs on its parameters: the ``torch.nn.init``
    functions (a mode sees them before the tensor methods they call) and the in-place random
    fills and clamps they use. Each returns the tensor it was given, so skipping one on a meta
    tensor leaves it as the call would have."""
    import torch
    from torch.nn import init

    names = [
        "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
        "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_",
    ]  # fmt: skip
    methods = [
        "normal_", "uniform_", "erfinv_", "clamp_", "clamp_min_", "clamp_max_", "exponential_",
        "log_normal_", "cauchy_", "geometric_", "random_", "bernoulli_",
    ]  # fmt: skip
    found = [getattr(init, n) for n in names if hasattr(init, n)]
    found += [getattr(torch.Tensor, n) for n in methods if hasattr(torch.Tensor, n)]
    return frozenset(found)
