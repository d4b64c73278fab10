"""stream_load: fill a model built on the meta device straight from its checkpoint, tier by tier."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import _core
from .._dtypes import torch_dtype
from ..blocks import find_blocks
from ..checkpoint import Checkpoint
from ..checkpoint_names import KeyMap, check_prefixes, model_tensors
from ..device import resolve_device
from ..errors import ArgumentError
from ..log import log_report
from ..plan import Plan, Tier, dtype_name, free_vram, planning_inputs
from ..plan import plan as make_plan
from ..progress import Progress
from ..settings import setting
from .matching import match
from .materialize import guard_lookup_tables, load_buffers, map_lookup_tables, materialize_all, placeholder, unload
from .merges import attach_merges
from .meter import paused
from .outside import outside_modules
from .state import STATE_ATTR, BlockState, ModelState, TensorSpec, clear_released, get_state, register_model
from .tuner_layers import watch_peft

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["stream_load"]


@dataclass(frozen=True)
class LoadRequest:
    """What stream_load was asked for, checked."""

    plan: Plan | None
    offload_prefixes: list[str] | None
    resident_prefixes: list[str] | None
    compute_dtype: str | torch.dtype | None
    storage_dtype: str | torch.dtype | None
    key_map: KeyMap
    skip_prefixes: list[str] | None
    device: torch.device
    # Reads past the page cache: a pipeline's rule for its stages, else (None) the plan's.
    direct: bool | None = None
    # A later load in this process reads the files again (stage() releases the model at its
    # end): the plan's rule keeps them in the page cache where they fit.
    read_again: bool = False
    # Where its tensors are read into: a pipeline's pool of pages, else memory of their own.
    pages: _core.PagePool | None = None


def stream_load(
    model: nn.Module,
    checkpoint: str | os.PathLike[str] | Checkpoint,
    plan: Plan | None = None,
    *,
    offload_prefixes: list[str] | None = None,
    resident_prefixes: list[str] | None = None,
    compute_dtype: str | torch.dtype | None = None,
    storage_dtype: str | torch.dtype | None = None,
    key_map: KeyMap = None,
    skip_prefixes: list[str] | None = None,
    device: str | torch.device | None = None,
) -> _core.LoadReport:
    """Loads ``model`` (built on the meta device) from ``checkpoint`` into the tiers of ``plan``.

    The weights outside the blocks and the resident blocks go to the device; blocks in RAM stay in
    a map of the file (or private memory with ``TRASH_PANDA_RAM_IN_MEMORY=1``); blocks on disk
    stay in the file. :func:`install_offload` then streams them during forward.

    Without ``plan``, a plan is made with :func:`trash_panda.plan`. The low-level form names the
    streamed blocks with ``offload_prefixes`` (and those to keep with ``resident_prefixes``).
    On any error the model is left unloaded (every weight on the meta device), never half-loaded.
    """
    return load_now(
        model,
        checkpoint,
        plan,
        offload_prefixes=offload_prefixes,
        resident_prefixes=resident_prefixes,
        compute_dtype=compute_dtype,
        storage_dtype=storage_dtype,
        key_map=key_map,
        skip_prefixes=skip_prefixes,
        device=device,
    )


def load_now(
    model: nn.Module,
    checkpoint: str | os.PathLike[str] | Checkpoint,
    plan: Plan | None = None,
    *,
    offload_prefixes: list[str] | None = None,
    resident_prefixes: list[str] | None = None,
    compute_dtype: str | torch.dtype | None = None,
    storage_dtype: str | torch.dtype | None = None,
    key_map: KeyMap = None,
    skip_prefixes: list[str] | None = None,
    device: str | torch.device | None = None,
    read_again: bool = False,
) -> _core.LoadReport:
    """:func:`stream_load`, told whether a later load in this process reads the files again
    (``read_again``: :func:`trash_panda.stage` releases the model at its end), which the plan's
    rule for reading through the page cache weighs."""
    from torch import nn

    if not isinstance(model, nn.Module):
        raise ArgumentError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if get_state(model) is not None:
        raise ArgumentError("model: it is already loaded by stream_load; release() it first")
    if plan is not None and not isinstance(plan, Plan):
        raise ArgumentError(f"plan: expected a trash_panda.Plan, got {type(plan).__name__}")
    if plan is not None and offload_prefixes is not None:
        raise ArgumentError("give plan= or offload_prefixes=, not both")
    if resident_prefixes is not None and offload_prefixes is None:
        raise ArgumentError("resident_prefixes= goes with offload_prefixes=")
    ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else Checkpoint(checkpoint)
    request = LoadRequest(
        plan,
        offload_prefixes,
        resident_prefixes,
        compute_dtype,
        storage_dtype,
        key_map,
        skip_prefixes,
        resolve_device(device),
        read_again=read_again,
    )
    try:
        with paused():  # another model's load is not an open measurement's activation memory
            report = _stream_load(model, ckpt, request)
    except BaseException:
        unload(model)
        raise
    clear_released(model)
    return report


def load_deferred(
    model: nn.Module,
    checkpoint: str | os.PathLike[str] | Checkpoint,
    plan: Plan,
    *,
    compute_dtype: str | torch.dtype | None = None,
    storage_dtype: str | torch.dtype | None = None,
    key_map: KeyMap = None,
    skip_prefixes: list[str] | None = None,
    device: str | torch.device | None = None,
    outside: list[TensorSpec] | None = None,
    ahead: bool = False,
    staging_pool: _core.StagingPool | None = None,
    holder: str = "model",
    direct: bool | None = None,
    read_again: bool = False,
    pages: _core.PagePool | None = None,
) -> tuple[_core.LoadReport, list[BlockState]]:
    """stream_load() that leaves the resident blocks unread (on the meta device) and returns
    them, for a loader that fills them while the model runs (``overlap=True``). Given a list
    as ``outside``, the weights outside the blocks that are read as they are (not lookup
    tables left mapped) are left unread too and put in it, for the caller to read before the
    first call or on the loader (offload/outside.py). ``ahead`` (a pipeline's stage loaded
    while another runs) reads through a lane that gives way to the running model's, and leaves
    a RAM tier held in memory unread, for the loader. ``staging_pool`` (a pipeline's) is the
    engine's staging buffers, under the name ``holder``, where the plan counted it. ``direct``:
    whether the model's reads go past the page cache (a pipeline's ``_core.load_reads``); None
    leaves it to the plan (:func:`_plan_reads`). ``pages``: the pool its tensors are read into
    (a pipeline's), which its released tensors go back to."""
    from torch import nn

    if not isinstance(model, nn.Module):
        raise ArgumentError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if get_state(model) is not None:
        raise ArgumentError("model: it is already loaded by stream_load; release() it first")
    ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else Checkpoint(checkpoint)
    request = LoadRequest(
        plan,
        None,
        None,
        compute_dtype,
        storage_dtype,
        key_map,
        skip_prefixes,
        resolve_device(device),
        direct,
        read_again,
        pages,
    )
    deferred: list[BlockState] = []
    try:
        with paused():
            report = _stream_load(model, ckpt, request, deferred, outside, ahead, (staging_pool, holder))
    except BaseException:
        unload(model)
        raise
    clear_released(model)
    return report, deferred


def _plan_reads(plan: Plan, files: list[str], read_again: bool) -> _core.LoadReads | None:
    """How a model loaded on its own reads: through the page cache only when a later load
    reads its files again and they stay cached beside what its plan holds in RAM
    (``_core.plan_reads``). None for a plan without budgets (the low-level form's), which reads
    through the cache."""
    if plan.budgets is None:
        return None
    return plan.load_reads(sum(os.path.getsize(f) for f in files), read_again=read_again)


def _resolve_plan(model: nn.Module, ckpt: Checkpoint, req: LoadRequest) -> Plan:
    plan, compute_dtype, storage_dtype = req.plan, req.compute_dtype, req.storage_dtype
    if plan is None and req.offload_prefixes is None:
        return make_plan(
            model,
            ckpt,
            compute_dtype=compute_dtype,
            storage_dtype=storage_dtype,
            key_map=req.key_map,
            skip_prefixes=req.skip_prefixes,
            device=req.device,
        )
    if req.offload_prefixes is not None:
        prefixes = [b.prefix for b in find_blocks(model, req.offload_prefixes)]
        keep = tuple(req.resident_prefixes or ())
        resident = [p for p in prefixes if keep and p.startswith(keep)]
        plan = Plan.manual(resident=resident, streamed=[p for p in prefixes if p not in resident])
    assert plan is not None
    if plan.resolved and compute_dtype is None and storage_dtype is None:
        return plan
    blocks = _block_prefixes(model, plan, check_prefixes(req.skip_prefixes))
    tensors, prefixes = planning_inputs(model, ckpt, blocks, req.key_map, req.skip_prefixes)
    # A resolved plan keeps its options; a manual one takes the settings' lookahead, and the core
    # infers the compute dtype when none is given.
    options: dict[str, Any] = {
        "lookahead": None if plan.resolved else setting("lookahead"),
        "pinned_buffers": None if plan.resolved else setting("pinned_buffers"),
        "max_lookahead": None if plan.resolved else setting("max_lookahead"),
        # How the RAM tier is held decides whether its blocks stage: always today's setting.
        "ram_in_memory": setting("ram_in_memory"),
    }
    if compute_dtype is not None:
        options["compute_dtype"] = dtype_name(compute_dtype)
    if storage_dtype is not None:
        options["storage_dtype"] = dtype_name(storage_dtype)
    return plan.resolve(tensors, prefixes, free_vram(req.device), req.device.type == "cuda", **options)


def _block_prefixes(model: nn.Module, plan: Plan, skip: tuple[str, ...] = ()) -> list[str]:
    """The model's blocks a plan is matched against: the ones block discovery finds (outside
    the skipped parts), plus any module the plan names that discovery does not reach. A plan
    entry naming a whole list ("single_blocks.") then covers each block of that list."""
    found = [b.prefix for b in find_blocks(model) if not (skip and b.prefix.startswith(skip))]
    for entry in (b.name for b in plan.blocks):
        if not any(f.startswith(entry) or entry.startswith(f) for f in found):
            found += [b.prefix for b in find_blocks(model, [entry])]
    return found


# Resident blocks are read this many bytes at a time: one call keeps the drive's queue full from
# its first request to its last, and a call per block would let it drain between blocks (2 GB of
# 67 MB blocks, cold: 1.23 GB/s block by block, 1.58 GB/s in batches, 1.63 GB/s for one bare read
# of the same tensors); the progress bar still moves between calls.
READ_BATCH_BYTES = 512 << 20


def _batches(blocks: list[BlockState]) -> list[list[BlockState]]:
    """Consecutive blocks grouped into reads of about READ_BATCH_BYTES."""
    out: list[list[BlockState]] = []
    size = READ_BATCH_BYTES
    for block in blocks:
        if size >= READ_BATCH_BYTES:
            out.append([])
            size = 0
        out[-1].append(block)
        size += sum(spec.info.nbytes for spec in block.tensors)
    return out


def _stream_load(
    model: nn.Module,
    ckpt: Checkpoint,
    req: LoadRequest,
    deferred: list[BlockState] | None = None,
    outside_later: list[TensorSpec] | None = None,
    ahead: bool = False,
    pooled: tuple[_core.StagingPool | None, str] = (None, "model"),
) -> _core.LoadReport:
    t_start = time.perf_counter()
    device = req.device
    plan = _resolve_plan(model, ckpt, req)
    config = plan.engine_config()
    compute = torch_dtype(config.compute_dtype)
    storage = config.storage_dtype
    named = model_tensors(ckpt, req.key_map, req.skip_prefixes)
    files = ckpt.files
    where = files[0] if len(files) == 1 else os.path.dirname(files[0])
    report = _core.LoadReport(where, str(device), str(compute).removeprefix("torch."))
    skip = check_prefixes(req.skip_prefixes)
    blocks, outside, unexpected = match(model, named, plan, compute, where, skip)
    report.unexpected = unexpected

    # The model's lane of its drive's queue, ranked in definition order until an order is given
    # (install_offload's order=, the overlap loader's): every read below goes through it.
    direct = req.direct
    if direct is None:
        reads = _plan_reads(plan, files, req.read_again)
        direct = reads is not None and reads.direct
        report.reads = "" if reads is None else reads.reason
    priority = _core.Priority.AHEAD if ahead else _core.Priority.RUN
    lane = _core.ReadLane(files, len(blocks), priority, direct=direct, pages=req.pages)
    threads = max(1, int(setting("ram_threads")))
    here = [b for b in blocks if b.tier == Tier.DEVICE and deferred is None]  # the resident blocks read here
    to_read = sum(s.info.nbytes for s in outside) + sum(s.info.nbytes for b in here for s in b.tensors)
    bar = Progress(f"loading {os.path.basename(where)}", to_read)
    # Outside weights: read, expanded to the compute dtype once, kept on the device (embedding
    # tables on the CPU: left in the checkpoint's map).
    t0 = time.perf_counter()
    outside_read, tables = map_lookup_tables(outside, ckpt, config, device, storage=None, expand=True)
    if outside_later is not None:  # read by the caller (offload/outside.py)
        outside_later.extend(outside_read)
        outside_read = []
    materialize_all(outside_read, device, storage=None, threads=threads, expand=True, lane=lane)
    outside_bytes = sum(spec.info.nbytes for spec in outside)
    bar.advance(outside_bytes)
    report.outside = _core.TierLoad(tensors=len(outside), bytes=outside_bytes, seconds=time.perf_counter() - t0)

    # Resident blocks: read to the device in their stored form (or the storage dtype).
    t0 = time.perf_counter()
    streamed = [b for b in blocks if b.tier != Tier.DEVICE]
    now = [b for b in blocks if b.tier == Tier.DEVICE]
    if deferred is not None:  # read later by the caller's loader
        deferred.extend(now)
        now = []
    device_bytes = 0
    for batch in _batches(now):
        specs = [spec for block in batch for spec in block.tensors]
        unmapped, mapped = map_lookup_tables(specs, ckpt, config, device, storage=storage, expand=False)
        tables += mapped
        materialize_all(unmapped, device, storage=storage, threads=threads, expand=False, lane=lane)
        done = sum(spec.info.nbytes for spec in specs)
        device_bytes += done
        bar.advance(done)
    bar.close()
    report.device_tier = _core.TierLoad(blocks=len(now), bytes=device_bytes, seconds=time.perf_counter() - t0)

    # Streamed blocks: described to the engine, which stages them ahead of each run.
    # The shared pool only where the plan counted it (it holds every block), else buffers of its own.
    budgets = plan.budgets
    pool = pooled[0] if budgets is not None and budgets.shared_staging else None
    engine = None
    if streamed:
        engine = _engine_for(streamed, files, config, report, lane, load_ram=not ahead, pool=(pool, pooled[1]))

    # Parameters: real tensors where they are final, placeholders where hooks will fill them.
    for spec in [*outside, *(s for b in blocks for s in b.tensors)]:
        spec.put(spec.placeholder if spec.placeholder is not None else spec.module._parameters[spec.attr])

    report.kept_buffers = load_buffers(model, named, device, skip, lane)
    report.mapped_bytes = sum(spec.info.nbytes for spec in tables)
    state = ModelState(
        checkpoint=ckpt,
        plan=plan,
        config=config,
        device=device,
        compute_dtype=compute,
        blocks=blocks,
        engine=engine,
        report=report,
        outside_modules=outside_modules(model, [b.prefix for b in blocks], skip),
        lane=lane,
        staging_pool=pool if engine is not None else None,
    )
    guard_lookup_tables(model, tables, ckpt)
    setattr(model, STATE_ATTR, state)
    register_model(model)
    watch_peft()  # PEFT's adapters on it go to its device and merge into what it brings
    attach_merges(model)  # merges recorded before it was loaded
    report.seconds = time.perf_counter() - t_start
    log_report(report)
    return report


def _engine_for(
    streamed: list[BlockState],
    files: list[str],
    config: _core.EngineConfig,
    report: _core.LoadReport,
    lane: _core.ReadLane,
    load_ram: bool = True,
    pool: tuple[_core.StagingPool | None, str] = (None, "model"),
) -> _core.Engine:
    """The prefetch engine of the streamed blocks, sized by the plan's configuration, reading
    through the model's ``lane`` (positions in definition order); fills in
    their staging indices, their placeholders and the report's RAM and disk lines."""
    file_index = {f: i for i, f in enumerate(files)}
    described = []
    loads = {Tier.RAM: [0, 0], Tier.DISK: [0, 0]}  # blocks, bytes
    for e, sb in enumerate(streamed):
        sb.stream_as(e)
        entries: list[_core.StreamTensor] = []
        for spec in sb.tensors:
            staged = len(entries)
            entries.append(_entry(spec.info, file_index))
            scale = None
            if spec.scale is not None:
                scale = len(entries)
                entries.append(_entry(spec.scale, file_index))
            spec.stream_at(staged, scale, placeholder(spec))
        described.append(_core.StreamBlock(sb.prefix, sb.tier, entries))
        loads[sb.tier][0] += 1
        loads[sb.tier][1] += sum(s.info.nbytes + (s.scale.nbytes if s.scale else 0) for s in sb.tensors)
    report.ram = _core.TierLoad(blocks=loads[Tier.RAM][0], bytes=loads[Tier.RAM][1])
    report.disk = _core.TierLoad(blocks=loads[Tier.DISK][0], bytes=loads[Tier.DISK][1])
    engine = _core.Engine(described, files, config, pool=pool[0], holder=f"stage {pool[1]}")
    # Before the RAM tier's load, which reads through the engine's lane too.
    engine.share_reads(lane, [sb.index for sb in streamed])
    report.staging_bytes = engine.staging_bytes()
    report.disk_mode_reason = config.disk_mode_reason
    report.disk_mode = engine.disk_read_mode() if report.disk.blocks else None
    storage = config.storage_dtype
    if (config.ram_in_memory_threads is not None or storage is not None) and report.ram.blocks:
        report.ram_source = "in memory" if storage is None else f"in memory as {storage}"
        # A stage read ahead leaves it to its loader thread (or the first block that needs it).
        if load_ram:
            _bytes, seconds = engine.load_ram_tier()
            report.ram = _core.TierLoad(blocks=report.ram.blocks, bytes=report.ram.bytes, seconds=seconds)
    engine.set_order(list(range(len(streamed))))
    return engine


def _entry(info: _core.TensorInfo, file_index: dict[str, int]) -> _core.StreamTensor:
    return _core.StreamTensor(
        info.name,
        file=file_index[os.fspath(info.file)],
        start=info.start,
        end=info.end,
        dtype=info.dtype,
        shape=list(info.shape),
        rows=info.rows,
    )
