"""stream_load: fill a model built on the meta device straight from its checkpoint, tier by tier."""

from __future__ import annotations

import difflib
import math
import os
import time
from typing import TYPE_CHECKING, Any

from .. import _core
from .._dtypes import torch_dtype
from ..blocks import find_blocks
from ..checkpoint import Checkpoint
from ..errors import ArgumentError, CheckpointError
from ..names import SCALE_SUFFIXES, KeyMap, is_scale, model_tensors, weight_of_scale
from ..plan import Plan, Tier, infer_compute_dtype, planning_inputs
from ..plan import plan as make_plan
from . import config
from .report import LoadReport
from .state import STATE_ATTR, BlockState, ModelState, TensorSpec, get_state, register_model

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["stream_load"]

_FLOAT_HEADERS = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")


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
) -> LoadReport:
    """Loads ``model`` (built on the meta device) from ``checkpoint`` into the tiers of ``plan``.

    The weights outside the blocks and the resident blocks go to the device; blocks in RAM stay in
    a map of the file (or private memory with ``TRASH_PANDA_RAM_IN_MEMORY=1``); blocks on disk
    stay in the file. :func:`install_offload` then streams them during forward.

    Without ``plan``, a plan is made with :func:`trash_panda.plan`. The low-level form names the
    streamed blocks with ``offload_prefixes`` (and those to keep with ``resident_prefixes``).
    On any error the model is left unloaded (every weight on the meta device), never half-loaded.
    """
    import torch
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
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return _stream_load(model, ckpt, plan, offload_prefixes, resident_prefixes, compute_dtype,
                            storage_dtype, key_map, skip_prefixes, dev)
    except BaseException:
        _unload(model)
        raise


def _resolve_plan(
    model: nn.Module,
    ckpt: Checkpoint,
    plan: Plan | None,
    offload_prefixes: list[str] | None,
    resident_prefixes: list[str] | None,
    compute_dtype: str | torch.dtype | None,
    storage_dtype: str | torch.dtype | None,
    key_map: KeyMap,
    skip_prefixes: list[str] | None,
    device: torch.device,
) -> Plan:
    from ..plan import _dtype_name, _free_vram

    if plan is None and offload_prefixes is None:
        return make_plan(model, ckpt, compute_dtype=compute_dtype, storage_dtype=storage_dtype,
                         key_map=key_map, skip_prefixes=skip_prefixes, device=device)
    if offload_prefixes is not None:
        prefixes = [b.prefix for b in find_blocks(model, offload_prefixes)]
        keep = tuple(resident_prefixes or ())
        resident = [p for p in prefixes if keep and p.startswith(keep)]
        plan = Plan.manual(resident=resident, streamed=[p for p in prefixes if p not in resident])
    assert plan is not None
    if plan.resolved and compute_dtype is None and storage_dtype is None:
        return plan
    tensors, prefixes = planning_inputs(model, ckpt, _block_prefixes(model, plan), key_map, skip_prefixes)
    options: dict[str, Any] = {}
    if not plan.resolved:
        options["compute_dtype"] = infer_compute_dtype(tensors) if compute_dtype is None else _dtype_name(compute_dtype)
        options["lookahead"] = config.setting("lookahead")
    else:
        options = dict(json_options(plan))
        if compute_dtype is not None:
            options["compute_dtype"] = _dtype_name(compute_dtype)
    if storage_dtype is not None:
        options["storage_dtype"] = _dtype_name(storage_dtype)
    core = plan._core.resolve(tensors, prefixes, _free_vram(device),
                              device.type == "cuda", **options)
    return Plan(core)


def _block_prefixes(model: nn.Module, plan: Plan) -> list[str]:
    """The model's blocks a plan is matched against: the ones block discovery finds, plus any
    module the plan names that discovery does not reach. A plan entry naming a whole list
    ("single_blocks.") then covers each block of that list."""
    found = [b.prefix for b in find_blocks(model)]
    for entry in (b.name for b in plan.blocks):
        if not any(f.startswith(entry) or entry.startswith(f) for f in found):
            found += [b.prefix for b in find_blocks(model, [entry])]
    return found


def json_options(plan: Plan) -> dict[str, Any]:
    import json

    opts: dict[str, Any] = json.loads(plan.to_json())["options"]
    min_free = opts.get("min_free_ram")
    if isinstance(min_free, dict):
        opts["min_free_ram"] = min_free.get("bytes", 0)
    return {k: v for k, v in opts.items() if v is not None}


def _scale_kind(weight: tuple[int, ...], scale: list[int], name: str) -> str:
    n = math.prod(scale)
    rows = weight[0] if weight else 1
    cols = math.prod(weight[1:]) if len(weight) > 1 else (weight[0] if weight else 1)
    if len(weight) == 1:
        rows, cols = 1, weight[0]
    if n == 1:
        return "tensor"
    if name.endswith(".weight_scale_inv") and len(scale) == 2 and scale == [math.ceil(rows / 128), math.ceil(cols / 128)]:
        return "block"
    if n == rows and (len(scale) == 1 or (len(scale) == 2 and scale[1] == 1)):
        return "row"
    if len(scale) == 2 and scale == [math.ceil(rows / 128), math.ceil(cols / 128)]:
        return "block"
    raise CheckpointError(
        f"scale tensor {name!r} has shape {scale}, which fits none of: one value, one per row "
        f"({rows}), or one per 128x128 block of a weight of shape {list(weight)}"
    )


def _near(name: str, names: list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    return f" (near names in the checkpoint: {', '.join(close)})" if close else ""


def _stream_load(
    model: nn.Module,
    ckpt: Checkpoint,
    plan: Plan | None,
    offload_prefixes: list[str] | None,
    resident_prefixes: list[str] | None,
    compute_dtype: str | torch.dtype | None,
    storage_dtype: str | torch.dtype | None,
    key_map: KeyMap,
    skip_prefixes: list[str] | None,
    device: torch.device,
) -> LoadReport:
    import torch
    from torch import nn

    t_start = time.perf_counter()
    plan = _resolve_plan(model, ckpt, plan, offload_prefixes, resident_prefixes, compute_dtype,
                         storage_dtype, key_map, skip_prefixes, device)
    opts = json_options(plan)
    compute = torch_dtype(_core.dtype_header_name(str(opts.get("compute_dtype", "BF16"))))
    storage = opts.get("storage_dtype")
    named = model_tensors(ckpt, key_map, skip_prefixes)
    files = ckpt.files
    report = LoadReport(checkpoint=files[0] if len(files) == 1 else os.path.dirname(files[0]),
                        device=str(device), compute_dtype=str(compute).removeprefix("torch."))

    # Every parameter once (tied ones share an entry), with the names it goes by.
    params: dict[int, tuple[list[tuple[nn.Module, str, str]], Any]] = {}
    for mod_name, module in model.named_modules(remove_duplicate=False):
        for attr, p in module._parameters.items():
            if p is not None:
                entry = params.setdefault(id(p), ([], p))
                entry[0].append((module, attr, f"{mod_name}.{attr}" if mod_name else attr))

    block_tiers = {b.name: b.tier for b in plan.blocks}
    prefixes = sorted(block_tiers, key=len, reverse=True)
    blocks: dict[str, BlockState] = {}
    for i, b in enumerate(plan.blocks):
        try:
            module = model.get_submodule(b.name.rstrip("."))
        except AttributeError:
            raise ArgumentError(f"plan block {b.name!r} names no module of {type(model).__name__}") from None
        blocks[b.name] = BlockState(index=i, prefix=b.name, module=module, tier=b.tier)

    missing: list[str] = []
    outside: list[TensorSpec] = []
    used: set[str] = set()
    for owners, p in params.values():
        found = next((n for _m, _a, n in owners if n in named), None)
        if found is None:
            missing.append(owners[0][2])
            continue
        info = named[found]
        shape = tuple(int(d) for d in p.shape)
        if tuple(info.shape) != shape:
            raise CheckpointError(
                f"{ckpt.files[0] if len(ckpt.files) == 1 else 'checkpoint'}: tensor {info.name!r} has shape "
                f"{list(info.shape)} but the model's {found} has shape {list(shape)}"
            )
        if (info.dtype in _FLOAT_HEADERS) != p.dtype.is_floating_point:
            raise CheckpointError(f"tensor {info.name!r} is {info.dtype} but the model's {found} is {p.dtype}")
        scale = scale_name = None
        if found.endswith(".weight"):
            for suffix in SCALE_SUFFIXES[:3]:
                cand = found[: -len(".weight")] + suffix
                if cand in named:
                    scale, scale_name = named[cand], cand
                    used.add(cand)
                    break
        kind = "none" if scale is None else _scale_kind(shape, list(scale.shape), scale_name or "")
        target = compute if p.dtype.is_floating_point else torch_dtype(info.dtype)
        module, attr, _ = owners[0]
        spec = TensorSpec(name=found, module=module, attr=attr, info=info, scale=scale, scale_kind=kind,
                          target=target, shape=shape)
        used.add(found)
        spec.owners = [(m, a) for m, a, _ in owners]
        prefix = next((q for q in prefixes if found.startswith(q)), None)
        if prefix is None:
            outside.append(spec)
        else:
            others = [n for _m, _a, n in owners if not n.startswith(prefix)]
            if others:
                raise ArgumentError(f"{found} is tied to {others[0]}, outside its block {prefix}: "
                                    "tied weights must live outside the blocks")
            blocks[prefix].tensors.append(spec)
    if missing:
        listed = "; ".join(m + _near(m, list(named)) for m in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise CheckpointError(f"{len(missing)} parameter(s) of the model are not in the checkpoint: {listed}{more}")
    report.unexpected = sorted(n for n in named if n not in used and not (is_scale(n) and weight_of_scale(n) in used)
                               and n not in dict(model.named_buffers()))

    threads = max(1, int(config.setting("ram_threads")))
    # Outside weights: read, expanded to the compute dtype once, kept on the device.
    t0 = time.perf_counter()
    for spec in outside:
        _materialize(spec, spec.target, device, storage=None, threads=threads, expand=True)
        report.outside.tensors += 1
        report.outside.bytes += spec.info.nbytes
    report.outside.seconds = time.perf_counter() - t0

    # Resident blocks: read to the device in their stored form (or the storage dtype).
    t0 = time.perf_counter()
    streamed: list[BlockState] = []
    for state_block in blocks.values():
        if state_block.tier != Tier.DEVICE:
            streamed.append(state_block)
            continue
        for spec in state_block.tensors:
            _materialize(spec, spec.target, device, storage=storage, threads=threads, expand=False)
            report.device_tier.bytes += spec.info.nbytes
        report.device_tier.blocks += 1
    report.device_tier.seconds = time.perf_counter() - t0

    # Streamed blocks: described to the engine, which stages them ahead of each run.
    engine = None
    lookahead = int(opts.get("lookahead", config.setting("lookahead")))
    if streamed:
        file_index = {f: i for i, f in enumerate(files)}
        described = []
        for e, sb in enumerate(streamed):
            sb.engine_index = e
            entries: list[tuple[str, int, int, int, str, list[int]]] = []
            for spec in sb.tensors:
                spec.staged_index = len(entries)
                entries.append(_entry(spec.info, file_index))
                if spec.scale is not None:
                    spec.scale_index = len(entries)
                    entries.append(_entry(spec.scale, file_index))
                spec.placeholder = _placeholder(spec)
            tier = "ram" if sb.tier == Tier.RAM else "disk"
            described.append((sb.prefix, tier, entries))
            load = report.ram if tier == "ram" else report.disk
            load.blocks += 1
            load.bytes += sum(s.info.nbytes + (s.scale.nbytes if s.scale else 0) for s in sb.tensors)
        in_memory = bool(config.setting("ram_in_memory"))
        disk_mode, report.disk_mode_reason = _disk_mode(plan, report.disk.bytes, report.ram.bytes, in_memory)
        engine = _core.Engine(described, files, lookahead=lookahead, workers=int(config.setting("workers")),
                              disk_mode=disk_mode, ram_in_memory=in_memory, ram_threads=threads,
                              storage=None if storage is None else str(storage))
        report.staging_bytes = engine.staging_bytes()
        report.disk_mode = engine.disk_read_mode() if report.disk.blocks else None
        if (in_memory or storage is not None) and report.ram.blocks:
            report.ram_source = "in memory" if storage is None else f"in memory as {storage}"
            _bytes, report.ram.seconds = engine.load_ram_tier()
        engine.set_order(list(range(len(streamed))))

    # Parameters: real tensors where they are final, placeholders where hooks will fill them.
    for spec in [*outside, *(s for b in blocks.values() for s in b.tensors)]:
        param = spec.placeholder if spec.placeholder is not None else spec.module._parameters[spec.attr]
        for m, a in spec.owners:
            m._parameters[a] = param

    report.kept_buffers = _load_buffers(model, named, device)
    state = ModelState(checkpoint=ckpt, plan=plan, device=device, compute_dtype=compute, blocks=list(blocks.values()),
                       engine=engine, files=files, lookahead=lookahead, report=report)
    setattr(model, STATE_ATTR, state)
    register_model(model)
    report.seconds = time.perf_counter() - t_start
    return report


def _entry(info: _core.TensorInfo, file_index: dict[str, int]) -> tuple[str, int, int, int, str, list[int]]:
    return (info.name, file_index[os.fspath(info.file)], info.start, info.end, info.dtype, list(info.shape))


def _placeholder(spec: TensorSpec) -> Any:
    import torch
    from torch import nn

    return nn.Parameter(torch.empty(spec.shape, dtype=spec.target, device="meta"), requires_grad=False)


def _disk_mode(plan: Plan, disk_bytes: int, ram_bytes: int, in_memory: bool) -> tuple[str, str]:
    """O_DIRECT when the disk tier could not stay in the page cache beside the RAM tier."""
    chosen = str(config.setting("disk_mode"))
    if not disk_bytes:
        return ("direct" if chosen == "auto" else chosen), ""
    if chosen != "auto":
        return chosen, f"{chosen} reads, as TRASH_PANDA_DISK_MODE says"
    budgets = plan.budgets or {}
    spare = int(budgets.get("usable_ram", 0)) - int(budgets.get("min_free_ram", 0)) - int(budgets.get("pinned_staging", 0))
    spare -= ram_bytes
    if disk_bytes <= spare:
        return "buffered", (f"buffered reads: its {disk_bytes / 1e9:.2f} GB fit in the page cache beside the RAM tier "
                            f"({spare / 1e9:.2f} GB spare)")
    return "direct", (f"O_DIRECT reads: its {disk_bytes / 1e9:.2f} GB would not stay in the page cache "
                      f"({max(spare, 0) / 1e9:.2f} GB spare beside the RAM tier), and buffered reads would evict it")


def _read(info: _core.TensorInfo, threads: int) -> torch.Tensor:
    """One tensor of the checkpoint, read into private CPU memory in its stored dtype."""
    import torch

    t = torch.empty(tuple(info.shape), dtype=torch_dtype(info.dtype))
    if info.nbytes:
        _core.read_tensors(os.fspath(info.file), [(info.start, t.reshape(-1).view(torch.uint8))], threads=threads)
    return t


def _materialize(spec: TensorSpec, target: torch.dtype, device: torch.device, *, storage: str | None,
                 threads: int, expand: bool) -> None:
    """Reads one parameter. ``expand``: to its compute dtype now (outside weights); otherwise kept
    stored (resident blocks), and expanded by the hooks when it differs from the compute dtype."""
    import torch
    from torch import nn

    from .. import dtype as kernels

    stored = _read(spec.info, threads)
    scale = _read(spec.scale, threads) if spec.scale is not None else None
    if not expand and storage is not None and scale is None and stored.dtype.is_floating_point:
        stored, scale = _convert_storage(stored, storage, spec)
    final: torch.Tensor | None = None
    if not stored.dtype.is_floating_point or (stored.dtype == target and scale is None):
        final = stored
    elif expand:
        final = kernels.expand(stored, target, None if scale is None else _scale_arg(scale, spec))
    if final is not None:
        param = nn.Parameter(final.to(device), requires_grad=False)
        for m, a in spec.owners:
            m._parameters[a] = param
        return
    spec.resident = stored.to(device)
    spec.resident_scale = None if scale is None else scale.to(device)
    spec.placeholder = _placeholder(spec)


def _scale_arg(scale: torch.Tensor, spec: TensorSpec) -> torch.Tensor:
    import torch

    s = scale.to(torch.float32)
    return s.reshape(-1, 1) if spec.scale_kind == "row" else s


def _convert_storage(stored: torch.Tensor, storage: str, spec: TensorSpec) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The storage dtype's form of a resident tensor (the planner counted it that way)."""
    import torch

    from .. import dtype as kernels

    if storage == "BF16":
        if stored.dtype in (torch.float32, torch.float64):
            return kernels.cast(stored.float() if stored.dtype == torch.float64 else stored, torch.bfloat16), None
        return stored, None
    if storage == "F8_E4M3":
        if stored.dim() == 2 and stored.numel() >= _core.FP8_MIN_ELEMENTS and stored.dtype in (
            torch.float32, torch.float16, torch.bfloat16
        ):
            q, s = kernels.quantize_fp8(stored, per_row=True)
            spec.scale_kind = "row"
            return q, s
        return stored, None
    raise ArgumentError(f"storage_dtype {storage!r}: expected bf16 or fp8")


def _load_buffers(model: nn.Module, named: dict[str, _core.TensorInfo], device: torch.device) -> list[str]:
    """Buffers come from the checkpoint when it has them; otherwise the values the model made
    at construction are kept. Returns the names of the kept ones."""
    kept = []
    for mod_name, module in model.named_modules():
        for attr, b in module._buffers.items():
            if b is None:
                continue
            name = f"{mod_name}.{attr}" if mod_name else attr
            if name in named:
                module._buffers[attr] = _read(named[name], 2).to(device=device, dtype=b.dtype)
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


def _unload(model: nn.Module) -> None:
    """Puts every weight back on the meta device and forgets the load (after a failed load)."""
    import torch
    from torch import nn

    state = get_state(model)
    if state is not None and state.engine is not None:
        state.engine.close()
    for module in model.modules():
        for attr, p in list(module._parameters.items()):
            if p is not None and not p.is_meta:
                module._parameters[attr] = nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=False)
        for attr, b in list(module._buffers.items()):
            if b is not None and not b.is_meta:
                module._buffers[attr] = torch.empty_like(b, device="meta")
    if hasattr(model, STATE_ATTR):
        delattr(model, STATE_ATTR)
