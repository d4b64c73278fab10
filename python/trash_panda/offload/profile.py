"""The profile of a run (TRASH_PANDA_PROFILE=1), built by the core from the hooks' timings."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

from .. import _core
from . import config

if TYPE_CHECKING:
    from .hooks import OffloadHandle


def build(handle: OffloadHandle) -> tuple[str, str, str]:
    """(report text, Chrome trace JSON, log line) of what ran under ``handle``."""
    state = handle._state
    blocks = [(b.prefix.rstrip("."), b.tier.value) for b in state.blocks]
    runs = [(i, start, end, t.staged_wait, t.gpu_wait, t.bytes, state.blocks[i].tier.value)
            for i, start, end, t in handle.runs]
    r = state.report
    load = None
    if r is not None:
        load = json.dumps({
            "seconds": r.seconds,
            "device": {"bytes": r.device_tier.bytes + r.outside.bytes,
                       "seconds": r.device_tier.seconds + r.outside.seconds},
            "ram": {"bytes": 0 if r.ram_source == "in memory" else r.ram.bytes, "seconds": 0.0},
            "disk": {"bytes": 0, "seconds": 0.0},
            "ram_in_memory": ({"bytes": r.ram.bytes, "seconds": r.ram.seconds,
                               "threads": int(config.setting("ram_threads"))}
                              if r.ram_source == "in memory" and r.ram.blocks else None),
        })
    engine = None
    if state.engine is not None and not state.engine.closed:
        engine = state.engine.stats_json()
    return _core.profile_report(blocks, runs, load=load, engine=engine)


def print_report(handle: OffloadHandle) -> None:
    report, trace, line = build(handle)
    print(report, file=sys.stderr)
    log = str(config.setting("log"))
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(line + "\n")
        with open(log + ".trace.json", "w", encoding="utf-8") as f:
            f.write(trace)
