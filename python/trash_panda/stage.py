"""stage(): the whole life of one model of a pipeline (build, plan, load, hooks, release).

A pipeline is stages in sequence, each released before the next is planned, so each plan sees
the memory the last one gave back.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .checkpoint import Checkpoint
from .errors import ArgumentError
from .options import (
    LOAD_OPTIONS,
    accepted_plan_options,
    check_flag,
    check_order,
    checkpoint_key,
    checkpoint_path,
    remember_activation,
    with_remembered_activation,
)
from .plan import Plan
from .plan import plan as make_plan

if TYPE_CHECKING:
    from torch import nn

    from .offload.handle import OffloadHandle
    from .offload.order import OrderChoice

__all__ = ["stage"]

# What stream_load() takes besides the plan; a stage also gives it the device.
_TO_LOAD = (*LOAD_OPTIONS, "device")


@contextlib.contextmanager
def stage(
    build_fn: Callable[[], nn.Module],
    path: str | os.PathLike[str],
    *,
    key: str | os.PathLike[str] | None = None,
    order: list[str] | None = None,
    order_file_destination: str | os.PathLike[str] | None = None,
    overlap: bool = False,
    **kwargs: Any,
) -> Iterator[tuple[nn.Module, Plan, OffloadHandle]]:
    """Builds a model with ``build_fn()``, plans it, loads it from ``path`` (a file, an index of
    shards, or a folder), installs the hooks, and yields ``(model, plan, handle)``; releases the
    model when the block ends, also when it raises (the exception goes on).

    ``kwargs`` go to :func:`trash_panda.plan`; ``key_map``, ``skip_prefixes`` and ``device`` go
    to :func:`trash_panda.stream_load` too. The peak memory of the block (device memory on CUDA,
    the growth of private memory on the CPU) is remembered under ``key`` (default: the
    checkpoint path) and is the ``activation_vram`` of the next plan of that key in this process,
    unless that plan is given one. Loads and releases of other models while the block runs are
    not counted in it. ``order`` names the blocks that run first (the order file is then
    neither read nor written); without it ``<checkpoint name>_order.json``, next to the
    checkpoint or in ``order_file_destination``, gives the first call's order and is written on
    release when it was missing or wrong, after a block that ended normally (a block that
    raised, Ctrl-C included, leaves the file as it was; one that ran only some blocks is merged
    into the order the file knew). ``overlap=True`` loads the resident blocks on a worker
    thread while the model starts; the bytes it puts on the device while the block runs are
    not counted in the peak, which is remembered as without it.
    """
    if not callable(build_fn):
        raise ArgumentError(f"build_fn: expected a callable that returns the model, got {type(build_fn).__name__}")
    path = checkpoint_path(path)
    check_order(order)
    check_flag("overlap", overlap)
    accepted = accepted_plan_options()
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise ArgumentError(
            f"stage() got {', '.join(unknown)}, which plan() does not take: expected key, order, "
            f"order_file_destination, overlap or plan()'s {', '.join(sorted(accepted))}"
        )
    remember = checkpoint_key(key if key is not None else path)
    with _stage(build_fn, path, remember, order, order_file_destination, overlap, kwargs) as got:
        yield got


@contextlib.contextmanager
def _stage(
    build_fn: Callable[[], nn.Module],
    path: str | os.PathLike[str],
    key: str,
    order: list[str] | None,
    destination: str | os.PathLike[str] | None,
    overlap: bool,
    kwargs: dict[str, Any],
) -> Iterator[tuple[nn.Module, Plan, OffloadHandle]]:
    from torch import nn

    from .device import resolve_device
    from .offload.empty import no_init_on_meta
    from .offload.hooked import load_and_hook
    from .offload.meter import measured

    with no_init_on_meta():
        model = build_fn()
    if not isinstance(model, nn.Module):
        raise ArgumentError(f"build_fn: it returned {type(model).__name__}, not a torch.nn.Module")
    options = with_remembered_activation(kwargs, key)
    shared = {k: options[k] for k in _TO_LOAD if k in options}
    device = resolve_device(shared.get("device"))
    handle: OffloadHandle | None = None
    choice: OrderChoice | None = None
    failure: BaseException | None = None
    try:
        ckpt = Checkpoint(path)
        p = make_plan(model, ckpt, **options)
        # Released at the end of the block: the next stage() of this model reads its files again.
        loaded = load_and_hook(
            model,
            ckpt,
            p,
            path,
            order=order,
            destination=destination,
            overlap=overlap,
            load_kwargs={**shared, "read_again": True},
        )
        handle, choice = loaded.handle, loaded.choice
        # The block's own peak: other stages opened meanwhile (their loads and releases) are
        # not counted in it, nor pages of the checkpoint's map the CPU reads. With overlap the
        # loader's tensors arrive while it is open: each is subtracted from the readings after
        # it arrived (those before the window opened are in its baseline), so the peak is the
        # activations' as without overlap; Meter.moved_in says why not restart it instead.
        with measured(device) as peak:
            yield model, p, handle
        remember_activation(key, peak[0])
    except BaseException as e:
        failure = e
        raise
    finally:
        _end(model, handle, choice, failure)


def _end(
    model: nn.Module, handle: OffloadHandle | None, choice: OrderChoice | None, failure: BaseException | None
) -> None:
    """Writes the order file after a block that ended normally (a stopped run knows only the
    blocks it reached) and releases the model, whatever happens on the way. A failure of the
    block stays the error raised; one of these steps is raised when the block went well."""
    from .offload import release
    from .offload.cleanup import Cleanup
    from .offload.order import write_order

    steps = Cleanup()
    if failure is None and choice is not None and handle is not None:
        steps.run(write_order, choice, handle.ran, handle.outside_ran)
    steps.run(release, model, handle)
    if failure is None:
        steps.done()
    elif steps.error is not None:
        warnings.warn(
            f"releasing the stage's model after the error in its block also failed: {steps.error!r}", stacklevel=4
        )
