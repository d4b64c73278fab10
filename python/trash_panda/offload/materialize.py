"""Reading tensors of a checkpoint into memory: resident weights, buffers, storage conversions,
and putting a model back on the meta device."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _core
from .._dtypes import is_block, needs_expansion, stored_shape, torch_dtype
from ..adapter_names import adapter_params
from ..errors import CheckpointError
from .registry import HOOKS_ATTR
from .state import KEPT_BUFFERS_ATTR, STATE_ATTR, TensorSpec, get_state

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ..checkpoint import Checkpoint


def placeholder(spec: TensorSpec) -> Any:
    import torch
    from torch import nn

    return nn.Parameter(torch.empty(spec.shape, dtype=spec.target, device="meta"), requires_grad=False)


# Where a tensor is read into: (shape, dtype, bytes, offset in its file) -> an uninitialised CPU
# tensor, or None for memory of its own (``_fresh``).
Place = Callable[[tuple[int, ...], "torch.dtype", int, int | None], "torch.Tensor | None"]


def read_many(
    infos: list[_core.TensorInfo],
    threads: int,
    lane: _core.ReadLane | None = None,
    position: int | None = None,
    place: Place | None = None,
) -> list[torch.Tensor]:
    """Tensors of the checkpoint, each read into private CPU memory in its stored dtype, by one
    call of the core for them all (grouped by file, in file order, without the GIL); with a
    ``lane``, the reads wait in its drive queue as the block at ``position`` of its run order
    (``None``: needed now). ``place``: where each is read (a loader's pinned ring), where it
    has room."""
    import torch

    pages = lane.pages if lane is not None else None
    out = []
    for info in infos:
        shape, dtype = stored_shape(info.dtype, info.shape, info.nbytes), torch_dtype(info.dtype)
        t = place(shape, dtype, info.nbytes, info.start) if place is not None else None
        out.append(t if t is not None else _fresh(shape, dtype, info.nbytes, info.start, pages))
    requests = [
        (os.fspath(info.file), info.start, t.reshape(-1).view(torch.uint8))
        for info, t in zip(infos, out, strict=True)
        if info.nbytes
    ]
    if requests:
        _core.read_block(requests, threads=threads, lane=lane, position=position)
    return out


# Tensors from this size on are read into pages of their own (an anonymous map), not the heap.
FRESH_BYTES = 1 << 20
# The alignment of memory and file offsets a direct read needs (a map starts on a page, and
# every system's page is a multiple of it), and where every tensor handed to torch on the CPU
# starts (a kernel may round differently on a weight not aligned like the allocator's blocks).
DIRECT_ALIGN = _core.DIRECT_ALIGN
TENSOR_ALIGN = _core.TENSOR_ALIGN


def _fresh(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    nbytes: int,
    offset: int | None = None,
    pages: _core.PagePool | None = None,
) -> torch.Tensor:
    """An uninitialised CPU tensor; from ``FRESH_BYTES`` on, in new pages of its own, given back
    to the system when it is freed. From the heap it could take pages another stage's
    activations just freed, and a memory meter that reads the process's private memory could
    not tell the read from the activations (offload/meter.py); glibc would also keep its pages
    after a release. Given the tensor's ``offset`` in its file, where that offset is 64-byte
    aligned its first byte lies at the same place in its page as in the file's, so a direct read
    (``ReadLane(direct=True)``) lands in it with no bounce buffer and no copy but for the two
    partial pages at its ends. From ``pages`` (a pipeline's pool), its pages are ones another
    stage's tensors gave back where the pool has them, already faulted: a read into them costs
    the compute beside it a third of one into new pages."""
    import mmap

    import torch

    if nbytes < FRESH_BYTES:
        return torch.empty(shape, dtype=dtype)
    # The tensor holds the map: its pages go back with the tensor's last reference.
    if hasattr(mmap, "MAP_PRIVATE"):
        # Private, not Python's default shared map: shared anonymous pages are shmem, which the
        # meter's private-memory gauge (and RssAnon) does not count, so it saw neither the read
        # nor the release of a block given back (a give-back beside a running stage came out
        # as that stage's activations). No large pages asked for: where the kernel compacts
        # memory to make them at the fault, a read of 2.3 GB took 11 s instead of 6.
        # A tensor whose file offset is 64-byte aligned lies in its page as in the file (a direct
        # read lands in it); any other starts on the page, as torch's own allocations are
        # aligned, and the direct read passes through the core's bounce buffer.
        shift = offset % DIRECT_ALIGN if offset is not None and offset % TENSOR_ALIGN == 0 else 0
        if pages is not None:
            from torch.utils.dlpack import from_dlpack

            # The region's pages go back to the pool with the tensor's last reference.
            return from_dlpack(pages.take(nbytes, shift)).view(dtype).reshape(shape)
        region = mmap.mmap(-1, shift + nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    else:
        # Windows, where an anonymous map is a section the private bytes leave out: its heap
        # gives a block this large a virtual allocation of its own, returned when freed.
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(region, dtype=dtype, count=nbytes // dtype.itemsize, offset=shift).reshape(shape)


def _materialize_group(
    group: list[TensorSpec],
    device: torch.device,
    *,
    storage: str | None,
    threads: int,
    expand: bool,
    lane: _core.ReadLane | None,
) -> None:
    """Reads parameters (and their scales) by one call of the core, then settles each.
    ``expand``: to its compute dtype now (outside weights); otherwise kept stored (resident
    blocks), and expanded by the hooks when it differs from the compute dtype."""
    infos = [s.info for s in group] + [s.scale for s in group if s.scale is not None]
    read = read_many(infos, threads, lane)
    scales = iter(read[len(group) :])
    for spec, stored in zip(group, read[: len(group)], strict=True):
        scale = next(scales) if spec.scale is not None else None
        settle(spec, stored, scale, device, storage=storage, expand=expand)


# Tensors that pass through host memory on their way (converted, expanded, or for another
# device) are read in groups of at most this many bytes, or the largest tensor: a call per group
# keeps the drive's queue full, and host memory holds one group at a time, as the overlap
# loader's groups (offload/overlap.py).
GROUP_BYTES = _core.LOAD_GROUP_BYTES


def stored_bytes(spec: TensorSpec) -> int:
    """The bytes a tensor and its scale are read as."""
    return spec.info.nbytes + (spec.scale.nbytes if spec.scale is not None else 0)


def read_groups(specs: list[TensorSpec]) -> list[list[TensorSpec]]:
    """``specs`` in order, in groups of at most :data:`GROUP_BYTES` (or the largest tensor with
    its scale)."""
    if not specs:
        return []
    bound = max(max(stored_bytes(s) for s in specs), GROUP_BYTES)
    groups: list[list[TensorSpec]] = [[]]
    held = 0
    for spec in specs:
        if groups[-1] and held + stored_bytes(spec) > bound:
            groups.append([])
            held = 0
        groups[-1].append(spec)
        held += stored_bytes(spec)
    return groups


def settle(
    spec: TensorSpec,
    stored: torch.Tensor,
    scale: torch.Tensor | None,
    device: torch.device,
    *,
    storage: str | None,
    expand: bool,
) -> None:
    """Puts a parameter read as stored (and its scale) in the model as :func:`materialize` does:
    converted to the storage dtype, expanded, or kept stored for the hooks."""
    import torch
    from torch import nn

    from .stored import expand_stored

    target = spec.target
    if is_block(spec.info.dtype):
        spec.held_block = spec.info.dtype
    if not expand and storage is not None and scale is None and stored.dtype.is_floating_point:
        stored, scale = _convert_storage(stored, storage, spec)
    held = spec.held_name(stored)
    final: torch.Tensor | None = None
    if not spec.reordered and not needs_expansion(held, target, scale is not None):
        final = stored
    elif expand:
        final = torch.empty(spec.shape, dtype=target)
        kind = spec.scale_kind if scale is not None else "none"
        expand_stored(stored, held, final, scale, kind, spec.info.rows)
    if final is not None:
        spec.put(nn.Parameter(final.to(device), requires_grad=False))
        return
    spec.keep_stored(stored.to(device), None if scale is None else scale.to(device), placeholder(spec))


def _final_as_read(spec: TensorSpec, storage: str | None, expand: bool) -> bool:
    """Whether the tensor as stored in the file is already what the model keeps (no conversion,
    no expansion): such tensors are read straight into their final memory, many at once."""
    if not expand and storage is not None and _core.is_float_dtype(spec.info.dtype):
        return False  # the storage dtype may convert it
    return not spec.reordered and not needs_expansion(spec.info.dtype, spec.target, spec.scale is not None)


def materialize_all(
    specs: list[TensorSpec],
    device: torch.device,
    *,
    storage: str | None,
    threads: int,
    expand: bool,
    lane: _core.ReadLane | None = None,
) -> None:
    """Reads many parameters, every read through ``lane`` as needed now. On the CPU, the ones
    whose stored form is final are read straight into their own tensors by one call, ``threads``
    requests in flight per file (positional reads in file order, no second copy of anything);
    the rest, and every tensor for another device, by one call per group of about
    :data:`GROUP_BYTES`, converted or moved after it."""
    import torch
    from torch import nn

    final: list[tuple[TensorSpec, torch.Tensor]] = []
    rest: list[TensorSpec] = []
    pages = lane.pages if lane is not None else None
    for spec in specs:
        if device.type != "cpu" or not _final_as_read(spec, storage, expand):
            rest.append(spec)
            continue
        info = spec.info
        final.append((spec, _fresh(tuple(info.shape), torch_dtype(info.dtype), info.nbytes, info.start, pages)))
    requests = [
        (os.fspath(spec.info.file), spec.info.start, t.reshape(-1).view(torch.uint8))
        for spec, t in final
        if spec.info.nbytes
    ]
    if requests:
        _core.read_block(requests, threads=threads, lane=lane, position=None)
    for spec, t in final:
        spec.put(nn.Parameter(t, requires_grad=False))
    for group in read_groups(rest):
        _materialize_group(group, device, storage=storage, threads=threads, expand=expand, lane=lane)


def _read_by_rows(spec: TensorSpec) -> bool:
    """Whether the model only looks rows of this tensor up: every module holding it is an
    embedding, under its ``weight``."""
    from torch import nn

    return bool(spec.owners) and all(
        isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and a == "weight" for m, a in spec.owners
    )


def map_lookup_tables(
    specs: list[TensorSpec],
    ckpt: Checkpoint,
    config: _core.EngineConfig,
    device: torch.device,
    *,
    storage: str | None,
    expand: bool,
) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Leaves the embedding tables among ``specs`` in a private map of the checkpoint, where the
    core allows it (``EngineConfig.maps_lookup_table``): a pass brings in the pages of the rows
    it looks up, and the rows no token uses cost no RAM. Returns the other specs and the mapped
    ones; :func:`guard_lookup_tables` then makes each lookup check the file first."""
    from torch import nn

    rest: list[TensorSpec] = []
    mapped: list[TensorSpec] = []
    for spec in specs:
        if not (
            device.type == "cpu"
            and spec.info.nbytes
            and _final_as_read(spec, storage, expand)
            and _read_by_rows(spec)
            and spec.info.source is None  # a part of a file's tensor has no map of its own
            and config.maps_lookup_table(spec.info)
        ):
            rest.append(spec)
            continue
        # Left mapped, not read: its pages come in as lookups touch them, outside any read queue
        # (a read through the queue would bring in the rows no token uses, which is what the
        # map saves).
        spec.put(nn.Parameter(ckpt.map(spec.info.name), requires_grad=False))
        mapped.append(spec)
    return rest, mapped


# The name, in the model's hook registry, of the checks before each lookup in a mapped table.
LOOKUP_GUARDS = "lookup_table_guards"


def guard_lookup_tables(model: nn.Module, tables: list[TensorSpec], ckpt: Checkpoint) -> None:
    """Before each lookup in a table left in the checkpoint's map, checks that its file still
    holds it: a file truncated since the load (saved again over the same path, say) would
    otherwise crash the process when a row past its new end is read. The pre-hooks go in the
    model's registry under :data:`LOOKUP_GUARDS`, which the model's unload removes."""
    from .registry import model_hooks

    hooks = model_hooks(model)
    for spec in tables:
        for module, _attr in spec.owners:
            hooks.on_module_start(LOOKUP_GUARDS, module, _checker(ckpt, spec.info.name))


def _checker(ckpt: Checkpoint, name: str) -> Callable[[], None]:
    def check() -> None:
        ckpt.check_holds(name)

    return check


def _scale_arg(scale: torch.Tensor, spec: TensorSpec) -> torch.Tensor:
    import torch

    s = scale.to(torch.float32)
    return s.reshape(-1, 1) if spec.scale_kind == "row" else s


def _convert_storage(stored: torch.Tensor, storage: str, spec: TensorSpec) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The storage dtype's form of a resident tensor, by the core's rule (the planner counted it
    and the engine converts the RAM tier by the same one)."""
    import torch

    from .. import dtype as kernels

    how = _core.storage_conversion(spec.info.name, spec.info.dtype, list(spec.info.shape), storage)
    if how == "bf16":
        return kernels.cast(stored.float() if stored.dtype == torch.float64 else stored, torch.bfloat16), None
    if how == "fp8":
        q, s = kernels.quantize_fp8(stored, layout="row")
        spec.scale_by_rows()
        return q, s
    if how == "int8":
        q, s = kernels.quantize_int8(stored)
        spec.scale_by_rows()
        return q, s
    if how == "q8_0":
        spec.held_block = "Q8_0"
        return kernels.quantize_q8_0(stored), None
    return stored, None


def load_buffers(
    model: nn.Module,
    named: dict[str, _core.TensorInfo],
    device: torch.device,
    skip: tuple[str, ...] = (),
    lane: _core.ReadLane | None = None,
) -> list[str]:
    """Buffers come from the checkpoint when it has them (all read by one call through
    ``lane``, as needed now); otherwise the values the model made at construction are kept
    (those a release of the same model kept aside, if it was loaded before). Buffers under
    ``skip`` are left as they are. Returns the names of the kept ones."""
    kept = []
    wanted = [
        (module, attr, name)
        for mod_name, module in model.named_modules()
        for attr, b in module._buffers.items()
        if b is not None
        for name in [f"{mod_name}.{attr}" if mod_name else attr]
        if not (skip and name.startswith(skip)) and name in named
    ]
    read = read_many([named[name] for _m, _a, name in wanted], 2, lane)
    from_file = {(id(m), a): t for (m, a, _n), t in zip(wanted, read, strict=True)}
    aside: dict[str, torch.Tensor] = getattr(model, KEPT_BUFFERS_ATTR, None) or {}
    for mod_name, module in model.named_modules():
        for attr, b in module._buffers.items():
            if b is None:
                continue
            name = f"{mod_name}.{attr}" if mod_name else attr
            if skip and name.startswith(skip):
                continue
            if name in named:
                module._buffers[attr] = from_file[(id(module), attr)].to(device=device, dtype=b.dtype)
            elif b.is_meta and name in aside:
                module._buffers[attr] = aside[name].to(device)
                kept.append(name)
            elif b.is_meta:
                raise CheckpointError(
                    f"buffer {name} is not in the checkpoint and was made on the meta device, so it has no "
                    "value; build the model inside trash_panda.empty_weights() (parameters on meta, buffers "
                    "real) or pass a checkpoint that has it"
                )
            else:
                module._buffers[attr] = b.to(device)
                kept.append(name)
    return kept


def unload(model: nn.Module) -> None:
    """Puts every weight back on the meta device and forgets the load (after a failed load)."""
    import torch
    from torch import nn

    state = get_state(model)
    if state is not None and state.report is not None and state.report.kept_buffers:
        # The model's own values (no checkpoint has them): kept aside for a load of it again.
        buffers = dict(model.named_buffers())
        aside = {n: buffers[n].detach().to("cpu", copy=True) for n in state.report.kept_buffers if n in buffers}
        setattr(model, KEPT_BUFFERS_ATTR, aside)
    hooks = getattr(model, HOOKS_ATTR, None)
    if hooks is not None:
        hooks.remove(LOOKUP_GUARDS)
    if state is not None:
        state.drop()
    # One meta parameter for each parameter, so weights tied together stay tied (a model loaded
    # again must look as it was built).
    emptied: dict[int, nn.Parameter] = {}
    adapters = adapter_params(model)  # PEFT's adapters stay: no checkpoint of the model has them
    for module in model.modules():
        for attr, p in list(module._parameters.items()):
            if p is not None and not p.is_meta and id(p) not in adapters:
                empty = emptied.get(id(p))
                if empty is None:
                    empty = emptied[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=False)
                module._parameters[attr] = empty
        for attr, b in list(module._buffers.items()):
            if b is not None and not b.is_meta:
                module._buffers[attr] = torch.empty_like(b, device="meta")
    if hasattr(model, STATE_ATTR):
        delattr(model, STATE_ATTR)
