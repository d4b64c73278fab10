"""The profile of a run (TRASH_PANDA_PROFILE=1), built by the core from the hooks' timings."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import _core, settings
from ..errors import ReadError

# Enough to get past the drive's first burst; the core stops after a second on a slow drive.
DRIVE_BYTES = 512 << 20

if TYPE_CHECKING:
    from collections.abc import Iterator

    from .handle import OffloadHandle
    from .state import ModelState


@dataclass
class Snapshot:
    """What the profile is made from, taken while the engine is still open."""

    blocks: list[tuple[str, _core.Tier]]
    runs: list[tuple[int, float, float, float, float, int, _core.Tier, int]]
    load: str | None
    engine: _core.EngineStats | None
    memory: list[dict[str, object]] = field(default_factory=list)
    device_copies: list[tuple[float, int, float]] = field(default_factory=list)  # (run start, bytes, s)
    link: float | None = None  # pinned host-to-device bytes per second, measured beside the run
    # The engine workers' stagings since the hooks were installed, and the profile's block index
    # of each engine block (the engine numbers only the streamed ones).
    stagings: list[_core.Staging] = field(default_factory=list)
    engine_blocks: list[int] = field(default_factory=list)
    drive: _core.DriveRate | None = None  # the drive's unbuffered read rate, measured at release

    def render(self) -> tuple[str, str, str]:
        memory = json.dumps(self.memory) if self.memory else None
        return _core.profile_report(
            self.blocks,
            self.runs,
            load=self.load,
            engine=self.engine,
            memory=memory,
            device_copies=self.device_copies,
            link=self.link,
            stagings=self.stagings,
            engine_blocks=self.engine_blocks,
            drive=self.drive,
        )


def memory_point(label: str) -> dict[str, object]:
    """Free RAM, the process's resident set, and the CPU tensors of 1 MB or more still alive."""
    import gc
    import warnings

    import torch

    holders = _holders()
    large = []
    with warnings.catch_warnings():
        # Looking at every live object touches deprecated module attributes that warn.
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            if type(obj) is not torch.Tensor and type(obj) is not torch.nn.Parameter:
                continue
            if obj.device.type == "cpu" and not obj.is_meta:
                n = obj.numel() * obj.element_size()
                if n >= 1 << 20:
                    what = f"{str(obj.dtype).removeprefix('torch.')}{list(obj.shape)}"
                    held = holders.get(id(obj))
                    large.append({"name": f"{held} {what}" if held else what, "bytes": n})
    large.sort(key=lambda t: -int(t["bytes"]))  # type: ignore[call-overload]
    return {
        "label": label,
        "free_ram": _core.available_ram(),
        "rss": _core.current_rss(),
        "private": _core.private_memory(),
        "large_tensors": large,
    }


def _holders() -> dict[int, str]:
    """Who holds a tensor, by its id: the module path of a parameter or buffer of a loaded
    model, so a profile names ``Model.blocks.3.up.weight`` and not only a dtype and shape, and
    the tensors the runtime keeps for a model (resident stored forms, the expansion buffer,
    device slots, views of the RAM tier and of staging buffers)."""
    from .state import get_state, live_models

    names: dict[int, str] = {}
    for model in live_models():
        owner = type(model).__name__
        for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers()]:
            names.setdefault(id(t), f"{owner}.{name}")
        state = get_state(model)
        if state is not None:
            for kept, what in _runtime_tensors(state):
                names.setdefault(id(kept), what.format(owner=owner))
    return names


def _runtime_tensors(state: ModelState) -> Iterator[tuple[object, str]]:
    """(tensor, what holds it) for what the runtime keeps of one model beside its parameters;
    ``{owner}`` in the text stands for the model's class."""
    for block in state.blocks:
        for spec in block.tensors:
            if spec.resident is not None:
                yield spec.resident, f"resident stored form of {{owner}}.{spec.name}"
            if spec.resident_scale is not None:
                yield spec.resident_scale, f"resident scale of {{owner}}.{spec.name}"
    handle = state.handle
    if handle is None:
        return
    prefix = {b.engine_index: b.prefix.rstrip(".") for b in state.blocks if b.engine_index is not None}
    yield from handle.backend.held(lambda b: prefix.get(b, str(b)))


def snapshot(handle: OffloadHandle) -> Snapshot:
    """The profile's inputs for what ran under ``handle``."""
    state = handle.state
    blocks = [(b.prefix.rstrip("."), b.tier) for b in state.blocks]
    handle.backend.settle()
    runs = [
        (i, start, end, t.staged_wait, t.gpu_wait, t.bytes, state.blocks[i].tier, t.expanded)
        for i, start, end, t in handle.runs
    ]
    copies = [(start, t.bytes, t.copy_seconds) for _i, start, _end, t in handle.runs if t.copy_seconds > 0]
    r = state.report
    load = None
    if r is not None:
        # The RAM tier is read into memory with TRASH_PANDA_RAM_IN_MEMORY and with any storage
        # dtype (converted on load); the engine's configuration says which, and with how many
        # readers. Otherwise it is mapped, and read during the passes.
        load = r.summary(state.config.ram_in_memory_threads, state.config.storage_dtype, _loader(handle))
    engine = None
    stagings: list[_core.Staging] = []
    engine_blocks: list[int] = []
    if state.engine is not None and not state.engine.closed:
        engine = state.engine.stats()
        stagings = [s for s in state.engine.stagings() if s.start >= handle.installed]
        by_engine = {b.engine_index: i for i, b in enumerate(state.blocks) if b.engine_index is not None}
        engine_blocks = [by_engine[i] for i in range(len(by_engine))]
    return Snapshot(
        blocks,
        runs,
        load,
        engine,
        device_copies=copies,
        link=getattr(handle.backend, "link", None),
        stagings=stagings,
        engine_blocks=engine_blocks,
        drive=_drive(state.checkpoint.files),
    )


def _drive(files: list[str]) -> _core.DriveRate | None:
    """The drive's own rate, read unbuffered from the checkpoint (which bypasses the page cache,
    so a warm cache does not flatter it): the reference the report sets the read rates against.
    None where the file system refuses unbuffered reads or the read fails: the profile is a
    report, and a failed measurement must not turn a finished run into an error."""
    try:
        return _core.measure_drive(files, DRIVE_BYTES)
    except ReadError:
        return None


def _loader(handle: OffloadHandle) -> tuple[int, int, float, float] | None:
    """stage(overlap=True)'s loader thread: what it read, in how long, and the blocks' waits:
    (blocks, bytes, seconds, waited seconds)."""
    loader = handle.state.loader
    if loader is None:
        return None
    return (len(loader.blocks) - len(loader.errors), loader.loaded_bytes, loader.load_seconds, loader.waited_seconds)


def build(handle: OffloadHandle) -> tuple[str, str, str]:
    """(report text, Chrome trace JSON, log line) of what ran under ``handle``."""
    return snapshot(handle).render()


def print_report(snap: Snapshot) -> None:
    report, trace, line = snap.render()
    print(report, file=sys.stderr)
    log = str(settings.setting("log"))
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(line + "\n")
        with open(log + ".trace.json", "w", encoding="utf-8") as f:
            f.write(trace)
