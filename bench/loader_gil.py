"""What the overlap loader costs the Python thread beside it: its GIL hold and its CPU, per GB read.

``stage(overlap=True)`` with every block resident returns at once and reads the blocks on its
loader thread. Beside it, the main thread runs a pure-Python probe (a counting loop, which needs
the GIL and nothing else) until the loader is done. The probe's rate against its rate alone,
measured right before, gives the share of the time the probe could not run, per GB read: the
loader's GIL hold and the CPU its threads took from the probe, together. The loader's Python
time is its thread's time in each block's load outside the core's read call (which runs
without the GIL): the most it can hold the GIL. The loader's CPU is the process's user+system
time during a load with no probe (cold file each time), per GB. Reads go past the page cache
(TRASH_PANDA_DISK_MODE=direct) or through it (buffered). Rounds alternate the ways.

    PYTHONPATH=python .venv/bin/python bench/loader_gil.py [--gb 1.0] [--rounds 3]

Results go to bench/results/loader_gil.md (figures, method, machine).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import DATA, RESULTS, build_meta, machine, md_table, write_checkpoint

import trash_panda as tp
from trash_panda import _core
from trash_panda.offload import materialize, overlap
from trash_panda.offload.state import get_state

D, F = 2048, 8192
PROBE_S = 1.0


def probe_rate(seconds: float, until: object = None) -> tuple[float, float]:
    """Iterations per second of a counting loop, for ``seconds`` or until ``until()`` is true;
    and how long it ran."""
    n = 0
    start = time.perf_counter()
    end = start + seconds
    check = until if callable(until) else None
    while True:
        for _ in range(10_000):
            n += 1
        now = time.perf_counter()
        if (check is not None and check()) or (check is None and now >= end):
            return n / (now - start), now - start


class _CoreWith:
    """``_core`` with ``read_block`` timed: what ``materialize`` calls for each block's reads."""

    def __init__(self, read_block: Any) -> None:
        self.read_block = read_block

    def __getattr__(self, name: str) -> Any:
        return getattr(_core, name)


@contextlib.contextmanager
def _patched(module: Any, name: str, value: Any) -> Iterator[None]:
    before = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, before)


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class PythonTime:
    """The loader thread's seconds in its blocks' loads, and of those in the core's read calls."""

    def __init__(self) -> None:
        self.block = 0.0
        self.core = 0.0

    def load_block(self, *args: Any, **kwargs: Any) -> None:
        t = time.perf_counter()
        overlap.load_block(*args, **kwargs)
        self.block += time.perf_counter() - t

    def read_block(self, *args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        out = _core.read_block(*args, **kwargs)
        self.core += time.perf_counter() - t
        return out

    @property
    def python(self) -> float:
        return self.block - self.core


def load(path: Path, blocks: int, probe: bool, timed: PythonTime | None = None) -> tuple[float, float, float | None]:
    """(wall seconds, CPU seconds, probe rate beside the loader or None) of one overlap load;
    ``timed`` times the loader's Python work."""
    _core.drop_cache(path)
    model = build_meta(blocks, D, F, torch.float32)
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    rate = None
    timing = contextlib.ExitStack()
    if timed is not None:
        timing.enter_context(overlap.reading_with(block=timed.load_block))
        timing.enter_context(_patched(materialize, "_core", _CoreWith(timed.read_block)))
    with (
        timing,
        tp.stage(lambda: model, path, device="cpu", resident_blocks=blocks, overlap=True, ram="1TB") as (m, _p, _h),
    ):
        state = get_state(m)
        assert state is not None and state.loader is not None
        loader = state.loader
        if probe:
            rate, _ = probe_rate(0, until=lambda: loader.done)
        else:
            loader.join()
        wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    return wall, cpu, rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    blocks = max(1, round(args.gb * 1e9 / (2 * D * F * 4)))
    DATA.mkdir(parents=True, exist_ok=True)
    path = DATA / f"loader_gil_{blocks}.safetensors"
    size = write_checkpoint(path, build_meta(blocks, D, F, torch.float32), torch.float32)
    gb = size / 1e9
    rows: dict[str, list[tuple[float, float, float, float]]] = {"direct": [], "buffered": []}
    for r in range(args.rounds):
        for mode in ("direct", "buffered") if r % 2 == 0 else ("buffered", "direct"):
            os.environ["TRASH_PANDA_DISK_MODE"] = mode
            alone, _ = probe_rate(PROBE_S)
            wall, _, beside = load(path, blocks, probe=True)
            assert beside is not None
            held = (1 - beside / alone) * wall  # seconds the probe could not run
            _, cpu, _ = load(path, blocks, probe=False)
            timed = PythonTime()
            load(path, blocks, probe=False, timed=timed)
            rows[mode].append((held / gb, timed.python / gb, cpu / gb, gb / wall))
            print(
                f"round {r + 1} {mode}: probe blocked {held / gb:.3f} s/GB, Python {timed.python / gb:.4f} s/GB, "
                f"CPU {cpu / gb:.3f} s/GB, {gb / wall:.2f} GB/s"
            )
    table = []
    for mode, got in rows.items():
        med = [sorted(x)[len(x) // 2] for x in zip(*got, strict=True)]
        table.append([mode, f"{med[0]:.3f}", f"{med[1]:.4f}", f"{med[2]:.3f}", f"{med[3]:.2f}"])
    text = md_table(
        ["reads", "probe blocked s/GB", "loader's Python (GIL at most) s/GB", "CPU s/GB", "load GB/s"], table
    )
    where = machine(path)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "loader_gil.md"
    out.write_text(
        f"# The overlap loader's GIL hold and CPU per GB\n\n{gb:.2f} GB fp32 checkpoint, {blocks} blocks, every "
        f"block resident, cold; medians of {args.rounds} rounds.\n\n{text}\n\nMachine: "
        + ", ".join(f"{k} {v}" for k, v in where.items())
        + "\n"
    )
    print(text)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
