"""trace_order(): a model's run order, recorded without a real run.

The model's forward runs once on torch's fake tensors (the meta device: shapes and dtypes, no
data, nothing allocated) with small inputs the caller gives, and a pre-hook on each block records
its first entry, as the order hook of a real run does. The order is what ``stage(order=...)`` and
``install_offload(order=...)`` take, and ``write_to=`` writes the order file a real run would
write on release (the core's rules: :mod:`.offload.order`). Parameters and buffers, real or
meta, are swapped for fake ones for the call and put back after it, so no weight is copied and
the model is left as it was.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .errors import ArgumentError, TraceError

if TYPE_CHECKING:
    from torch import nn

__all__ = ["trace_order"]

# The device the fake tensors claim: the model computes as on the CPU, without data.
_FAKE_DEVICE = "cpu"


def trace_order(
    model: nn.Module,
    *args: Any,
    blocks: list[str] | None = None,
    skip_prefixes: list[str] | None = None,
    write_to: str | os.PathLike[str] | None = None,
    order_file_destination: str | os.PathLike[str] | None = None,
    **kwargs: Any,
) -> list[str]:
    """The blocks of ``model`` in the order ``model(*args, **kwargs)`` first runs them, found
    without a real run: the call runs on the meta device (torch's fake tensors), so small
    inputs do (tensors anywhere; they are used for their shapes and dtypes only).

    Use it before a model's first run when its forward runs blocks in another order than it
    defines them (a Flux-style model whose text blocks run first, a UNet's mid block): pass
    the result as ``stage(order=...)``, or give ``write_to`` (the checkpoint path ``stage()``
    gets, and ``order_file_destination`` as there) to write the order file its release would
    write, so the first run prefetches as well as the tenth.

    ``model`` may hold real weights or meta ones (built under :func:`empty_weights`); nothing
    is copied, and its parameters, buffers, attributes, hooks and training mode are as before
    once this returns or raises. It must not have offload hooks on. ``blocks`` and
    ``skip_prefixes`` are ``plan()``'s: the blocks are found as a plan finds them. Returns the
    blocks that ran, as the model's blocks are named (``"blocks.3."``), in the order of their
    first run; a block that never ran is not in it, as in a real run's order.

    A forward that needs tensor values (``.item()``, ``if x.any():``, a shape that depends on
    the data) cannot run without data: that raises :class:`TraceError`, naming the operation.
    Such a model is run once for real instead: its release writes the order file.
    """
    from torch import nn

    from .blocks import find_blocks
    from .checkpoint_names import check_prefixes
    from .offload.registry import HOOKS_ATTR, HookRegistry

    if not isinstance(model, nn.Module):
        raise ArgumentError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if blocks is not None and (isinstance(blocks, str) or not all(isinstance(b, str) for b in blocks)):
        raise ArgumentError("blocks: expected a list of block prefixes")
    skip = check_prefixes(skip_prefixes)
    if write_to is not None and not isinstance(write_to, str | os.PathLike):
        raise ArgumentError(f"write_to: expected a checkpoint path, got {type(write_to).__name__}")
    if order_file_destination is not None:
        if not isinstance(order_file_destination, str | os.PathLike):
            raise ArgumentError(
                f"order_file_destination: expected a folder, got {type(order_file_destination).__name__}"
            )
        if write_to is None:
            raise ArgumentError("order_file_destination: give write_to too, the checkpoint the file is for")
    registry = getattr(model, HOOKS_ATTR, None)
    if isinstance(registry, HookRegistry) and registry.names:
        raise ArgumentError(
            f"{type(model).__name__} has offload hooks on: trace its order before install_offload() or "
            "stage(), on the model built (under empty_weights() or not) but not loaded"
        )
    found = [b for b in find_blocks(model, blocks) if not (skip and b.prefix.startswith(skip))]
    if not found:
        raise ArgumentError(
            f"found no blocks in {type(model).__name__}: no nn.ModuleList of two or more modules "
            "with weights; name them with blocks=[...]"
        )
    from .offload.outside import outside_modules

    prefixes = [b.prefix for b in found]
    outside = outside_modules(model, prefixes, skip)
    ran, outside_ran = _trace(model, [(b.prefix, b.module) for b in found], outside, args, kwargs)
    if write_to is not None:
        from .offload.order import write_traced_order

        write_traced_order(write_to, prefixes, ran, order_file_destination, outside_ran)
    return ran


def _trace(
    model: nn.Module,
    blocks: list[tuple[str, nn.Module]],
    outside: dict[str, nn.Module],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> tuple[list[str], dict[str, int]]:
    """Runs ``model(*args, **kwargs)`` on fake tensors; returns the blocks in the order of their
    first pre-forward, and for each ``outside`` module that ran how many blocks had started
    before its first pre-forward (what a real run's order hook records)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    ran: list[str] = []
    seen: set[str] = set()
    outside_ran: dict[str, int] = {}

    def outside_recorder(name: str) -> Callable[[nn.Module, Any], None]:
        def record(_module: nn.Module, _args: Any) -> None:
            outside_ran.setdefault(name, len(ran))

        return record

    def recorder(prefix: str) -> Callable[[nn.Module, Any], None]:
        def record(_module: nn.Module, _args: Any) -> None:
            if prefix not in seen:
                seen.add(prefix)
                ran.append(prefix)

        return record

    ops = _FailedOps()
    with _restored(model):
        handles = []
        try:
            for prefix, module in blocks:
                handles.append(module.register_forward_pre_hook(recorder(prefix)))
            for name, module in outside.items():
                handles.append(module.register_forward_pre_hook(outside_recorder(name)))
            # Real tensors the forward meets outside its arguments and weights (an attribute)
            # are made fake on the way.
            with FakeTensorMode(allow_non_fake_inputs=True):
                _fake_weights(model)
                fake_args, fake_kwargs = _fake(args), _fake(kwargs)
                try:
                    with torch.no_grad(), ops:
                        model(*fake_args, **fake_kwargs)
                except Exception as e:
                    if _needs_values(e):
                        raise _no_values(model, ops.op_of(e), e) from e
                    raise
        finally:
            for h in handles:
                h.remove()
    return ran, outside_ran


@contextmanager
def _restored(model: nn.Module) -> Iterator[None]:
    """Puts back every module's attributes, parameters, buffers and submodules (the same
    objects) when the block ends, also when it raises: the trace swaps the weights, and a
    forward may keep what it computed (a cache) on a module."""
    saved = [(m, dict(m.__dict__), dict(m._parameters), dict(m._buffers), dict(m._modules)) for m in model.modules()]
    try:
        yield
    finally:
        for m, attrs, params, buffers, modules in saved:
            _refill(m._parameters, params)
            _refill(m._buffers, buffers)
            _refill(m._modules, modules)
            for name in [n for n in m.__dict__ if n not in attrs]:
                del m.__dict__[name]
            m.__dict__.update(attrs)


def _refill(d: dict[str, Any], content: dict[str, Any]) -> None:
    d.clear()
    d.update(content)


def _fake_weights(model: nn.Module) -> None:
    """Swaps every parameter and buffer for a fake tensor of its shape and dtype (one for each
    tensor, so tied weights stay tied). Called inside the fake mode."""
    import torch
    from torch import nn

    fakes: dict[int, torch.Tensor] = {}
    for m in model.modules():
        for d in (m._parameters, m._buffers):
            for name, t in d.items():
                if t is None:
                    continue
                fake = fakes.get(id(t))
                if fake is None:
                    fake = torch.empty(t.shape, dtype=t.dtype, device=_FAKE_DEVICE)
                    if isinstance(t, nn.Parameter):
                        fake = nn.Parameter(fake, requires_grad=t.requires_grad)
                    fakes[id(t)] = fake
                d[name] = fake  # type: ignore[assignment]


def _fake(value: Any) -> Any:
    """``value`` with every tensor in it (in lists, tuples and dicts too) made a fake one of its
    shape and dtype. Called inside the fake mode."""
    import torch

    if isinstance(value, torch.Tensor):
        return torch.empty(value.shape, dtype=value.dtype, device=_FAKE_DEVICE)
    if isinstance(value, dict):
        return {k: _fake(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(_fake(v) for v in value))
    if isinstance(value, list | tuple):
        return type(value)(_fake(v) for v in value)
    return value


class _FailedOps:
    """A torch function mode, entered for the call, that remembers which operation raised each
    exception (the innermost one), so the error can name it."""

    def __init__(self) -> None:
        self._mode: Any = None
        self._failed: dict[int, tuple[BaseException, str]] = {}

    def __enter__(self) -> None:
        from torch.overrides import TorchFunctionMode

        failed = self._failed

        class Mode(TorchFunctionMode):
            def __torch_function__(
                self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
            ) -> Any:
                try:
                    return func(*args, **(kwargs or {}))
                except Exception as e:
                    failed.setdefault(id(e), (e, _op_name(func)))
                    raise

        self._mode = Mode()
        self._mode.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)

    def op_of(self, error: BaseException) -> str | None:
        """The operation that raised ``error``, or one in its chain of causes."""
        seen: set[int] = set()
        e: BaseException | None = error
        while e is not None and id(e) not in seen:
            seen.add(id(e))
            got = self._failed.get(id(e))
            if got is not None and got[0] is e:
                return got[1]
            e = e.__cause__ or e.__context__
        return None


def _op_name(func: Any) -> str:
    """``Tensor.item``, ``torch.nonzero``, ``torch.nn.functional.linear``."""
    name = str(getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or func)
    owner, _, short = name.rpartition(".")
    if owner in ("TensorBase", "Tensor"):
        return f"Tensor.{short}"
    if owner == "_VariableFunctionsClass":
        return f"torch.{short}"
    if "<locals>" in name:
        return str(getattr(func, "__name__", short))
    module = getattr(func, "__module__", None)
    return f"{module}.{name}" if module else name


def _needs_values(e: Exception) -> bool:
    """Whether ``e`` says the call needed data a fake tensor does not have (torch's fake tensors
    raise their own kinds, or name themselves, the meta device or a tensor subclass)."""
    if type(e).__module__.startswith("torch._subclasses") or isinstance(e, NotImplementedError):
        return True
    text = str(e).lower()
    return any(word in text for word in ("meta", "fake", "tensor subclass"))


def _no_values(model: nn.Module, op: str | None, e: Exception) -> TraceError:
    where = f" at {op}" if op is not None else ""
    said = (str(e).strip().splitlines() or [""])[0]
    return TraceError(
        f"trace_order: {type(model).__name__}'s forward needs tensor values{where}, which the meta "
        f"device does not have ({type(e).__name__}: {said}); run it once for real instead: stage() "
        "writes the order file when it is released, and the runs after it start in that order"
    )
