"""The schedule of the device bookkeeping over a grid, on the virtual-time device of the test suite
(tests/support/vtdevice.py, CUDA's semantics): block size, compute / copy, lookahead and RAM-tier form ->
the steady step against its ideal, max(copy, compute, fill) per block, and the share of the time
the link is busy. A model: no device runs and nothing is timed; every figure follows from the
rates given (link, fill, the host's costs) and the bookkeeping's rules. tests/device/test_copy_schedule.py
holds the bound on a smaller grid in ``make test``.

    PYTHONPATH=python .venv/bin/python bench/schedule_sweep.py             # bench/results/schedule_sweep.md
    PYTHONPATH=python .venv/bin/python bench/schedule_sweep.py --rev ed43c4a --out -   # another revision's
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _common import RESULTS, ROOT, machine, md_table

from support.vtdevice import CALL_S, LAUNCH_S, predict_step
from trash_panda.offload.backends.copies import SlotCopies

SIZES = (64_000_000, 256_000_000, 1_000_000_000, 2_000_000_000)
RATIOS = (0.1, 0.2, 0.5, 0.8, 0.9, 1.0, 1.1, 1.25, 2.0, 5.0, 10.0)
LOOKAHEADS = (1, 2, 4)
# fill rate as a multiple of the link; None: the private RAM tier, pinned, copied directly.
FORMS: dict[str, float | None] = {
    "direct": None,
    "staged, fill 2x link": 2.0,
    "staged, fill = link": 1.0,
    "staged, fill = link/2": 0.5,
}
# The staging buffers pageable (their pinning declined): each copy holds the host until it is
# done, so the ideal is max(compute, copy + the host's queueing, fill) and the link cannot stay
# busy while the host queues; fill as a multiple of the link.
PAGEABLE: dict[str, float] = {
    "pageable, fill 2x link": 2.0,
    "pageable, fill = link/2": 0.5,
}
STEP_BOUND, BUSY_BOUND = 1.05, 0.95
PIVOT_RATIOS = (0.1, 0.5, 1.0, 2.0, 10.0)


def pipeline_at(rev: str) -> type[SlotCopies]:
    """The copies' bookkeeping as ``rev`` has it (the rest of the tree as it is): SlotCopies in
    offload/backends/copies.py, or CopyPipeline in offload/copy_pipeline.py, or in
    offload/device.py before that."""
    places = {
        "backends/copies.py": "trash_panda.offload.backends",
        "copy_pipeline.py": "trash_panda.offload",
        "device.py": "trash_panda.offload",
    }
    found = {name: _show(rev, f"python/trash_panda/offload/{name}") for name in places}
    name = next((n for n, src in found.items() if src is not None), None)
    if name is None:
        raise SystemExit(f"no copy bookkeeping at revision {rev}")
    package = places[name]
    path = Path(tempfile.mkdtemp()) / "device.py"
    path.write_text(found[name] or "")
    spec = importlib.util.spec_from_file_location(f"{package}._device_at_rev", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    copies: type[SlotCopies] = getattr(module, "SlotCopies", None) or module.CopyPipeline
    return copies


def _show(rev: str, path: str) -> str | None:
    got = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], capture_output=True, text=True)
    return got.stdout if got.returncode == 0 else None


def sweep(link: float, launch_s: float, pipeline: type[SlotCopies]) -> list[dict[str, Any]]:
    rows = []
    forms: dict[str, float | None] = {**FORMS, **PAGEABLE}
    for size, ratio, lookahead, form in itertools.product(SIZES, RATIOS, LOOKAHEADS, forms):
        fill = forms[form]
        pageable = form in PAGEABLE
        try:
            r = predict_step(
                size,
                ratio * size / link,
                lookahead,
                link,
                None if fill is None else fill * link,
                launch_s=launch_s,
                pipeline=pipeline,
                **({"pinned": False} if pageable else {}),
            )
        except Exception as e:  # a revision whose bookkeeping breaks: its row says how
            r = {"ratio": float("nan"), "link_busy": float("nan"), "violations": [f"{type(e).__name__}: {e}"]}
            r.update(copy_s=size / link, compute_s=ratio * size / link, host_s=launch_s + CALL_S)
            r.update(fill_s=0.0 if fill is None else size / (fill * link))
        r.update(size=size, ratio_cc=ratio, lookahead=lookahead, form=form)
        terms = {"copy": r["copy_s"], "compute": r["compute_s"], "fill": r["fill_s"], "host": r["host_s"]}
        if pageable:  # the host holds for each copy: copy and queueing add up on the host
            terms = {"copy + host": r["copy_s"] + r["host_s"], "compute": r["compute_s"], "fill": r["fill_s"]}
            if r["ratio"] == r["ratio"]:
                r["ratio"] = r["step_s"] / max(terms.values())
        r["bound_by"] = max(terms, key=lambda k: terms[k])
        r["copy_bound"] = r["bound_by"] == "copy"
        r["ok"] = (
            not r["violations"] and r["ratio"] <= STEP_BOUND and (not r["copy_bound"] or r["link_busy"] >= BUSY_BOUND)
        )
        rows.append(r)
    return rows


def _mb(size: int) -> str:
    return f"{size / 1e9:g} GB" if size >= 1e9 else f"{size / 1e6:g} MB"


def _cell(r: dict[str, Any]) -> str:
    if r["violations"] and r["ratio"] != r["ratio"]:
        return "error"
    mark = "" if r["ok"] else " ✗"
    return f"{r['ratio']:.2f} · {r['link_busy']:.0%}{mark}"


def summary(rows: list[dict[str, Any]]) -> str:
    out = []
    for form, lookahead in itertools.product([*FORMS, *PAGEABLE], LOOKAHEADS):
        sel = [r for r in rows if r["form"] == form and r["lookahead"] == lookahead]
        worst = max(sel, key=lambda r: r["ratio"] if r["ratio"] == r["ratio"] else float("inf"))
        busy = [r["link_busy"] for r in sel if r["copy_bound"]]
        out.append(
            [
                form,
                str(lookahead),
                f"{worst['ratio']:.3f}",
                f"{_mb(worst['size'])}, {worst['ratio_cc']:g}x",
                f"{min(busy):.1%}" if busy else "-",
                f"{sum(not r['ok'] for r in sel)} / {len(sel)}",
            ]
        )
    header = ["RAM form", "lookahead", "worst step / ideal", "at (block, compute/copy)", "least link busy, copy-bound"]
    return md_table([*header, "outside the bound"], out)


def pivot(rows: list[dict[str, Any]], forms: list[str]) -> str:
    """step / ideal · link busy, by block size and compute / copy (rows), lookahead and form."""
    index = {(r["size"], r["ratio_cc"], r["lookahead"], r["form"]): r for r in rows}
    header = ["block", "compute / copy"] + [f"la {la}, {f}" for f in forms for la in LOOKAHEADS]
    out = []
    for size, ratio in itertools.product(SIZES, PIVOT_RATIOS):
        out.append([_mb(size), f"{ratio:g}"] + [_cell(index[(size, ratio, la, f)]) for f in forms for la in LOOKAHEADS])
    return md_table(header, out)


def full(rows: list[dict[str, Any]]) -> str:
    out = [
        [
            _mb(r["size"]),
            f"{r['ratio_cc']:g}",
            str(r["lookahead"]),
            r["form"],
            f"{r['copy_s'] * 1e3:.2f}",
            f"{r['compute_s'] * 1e3:.2f}",
            f"{r['fill_s'] * 1e3:.2f}",
            f"{r['ratio']:.3f}",
            f"{r['link_busy']:.1%}",
            r["bound_by"],
            "yes" if r["ok"] else "NO" + (f" ({r['violations'][0]})" if r["violations"] else ""),
        ]
        for r in rows
    ]
    header = ["block", "compute / copy", "lookahead", "RAM form", "copy ms", "compute ms", "fill ms"]
    return md_table([*header, "step / ideal", "link busy", "bound by", "within bound"], out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--link-gbps", type=float, default=50.0, help="host-to-device link, GB/s (default 50)")
    ap.add_argument("--launch-us", type=float, default=LAUNCH_S * 1e6, help="host time to queue one block's compute")
    ap.add_argument("--rev", help="run the bookkeeping (device.py) of this git revision instead of the tree's")
    ap.add_argument("--out", default=None, help="markdown file to write ('-': none); default bench/results/...")
    args = ap.parse_args()
    link = args.link_gbps * 1e9
    launch = args.launch_us * 1e-6
    pipeline = pipeline_at(args.rev) if args.rev else SlotCopies
    t0 = time.perf_counter()
    rows = sweep(link, launch, pipeline)
    took = time.perf_counter() - t0
    m = machine(ROOT)
    bad = sum(not r["ok"] for r in rows)
    head = (
        f"# Schedule sweep on the virtual-time device (a model, not a measurement)\n\n"
        f"device.py: {args.rev or 'working tree'}; link {args.link_gbps:g} GB/s; host {args.launch_us:g} us to queue "
        f"a block's compute, {CALL_S * 1e6:g} us per copy queued or wait woken; 16 blocks x 4 passes, the "
        f"first left out; buffers = slots = lookahead + 1; 2 workers sharing the fill rate.\n"
        f"Ran in {took:.1f} s on {m['cpu']} ({m['nproc']} CPUs), {m['date']}, torch {m['torch']}.\n"
        f"Bound: step <= {STEP_BOUND}x max(copy, compute, fill, host) and link busy >= {BUSY_BOUND:.0%} where copy "
        f"is the largest (pageable staging: {STEP_BOUND}x max(copy + host, compute, fill)): {len(rows) - bad} of "
        f"{len(rows)} cases within it; pinned forms {sum(r['ok'] for r in rows if r['form'] in FORMS)} of "
        f"{sum(r['form'] in FORMS for r in rows)}.\n"
        f"The model's rules (tests/device/test_vtdevice.py): streams and events, each host thread's current "
        f"stream, one copy engine, copies from pageable memory holding the host, the caching allocator's "
        f"per-stream reuse, and a lease back in the pool only once every view of its buffer is gone.\n"
    )
    text = "\n".join(
        [
            head,
            "## Worst case per form and lookahead\n",
            summary(rows),
            "\n## step / ideal · link busy (✗: outside the bound)\n",
            pivot(rows, ["staged, fill 2x link", "direct"]),
            "\n",
            pivot(rows, ["staged, fill = link", "staged, fill = link/2"]),
            "\n",
            pivot(rows, list(PAGEABLE)),
            "\n## Every case\n",
            full(rows),
            "",
        ]
    )
    print("\n".join(text.split("\n## Every case")[0].splitlines()))
    out = args.out if args.out is not None else ("-" if args.rev else str(RESULTS / "schedule_sweep.md"))
    if out != "-":
        Path(out).write_text(text)
        print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
