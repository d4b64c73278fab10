"""The parts of bench/pipeline.py's report that are figures of their own: where the RSS peaked,
the least any runner must read in a run, the least time a cold first run can take in the
stages' order, and the plot of the stages on one time line."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import _pipeline_models as pm


def peak_at(r: dict[str, Any]) -> str:
    """Where the highest RSS sample fell: the stage running then, or between stages."""
    t, _read, rss = max(r["samples"], key=lambda x: x[2])
    during = [s for s in r["spans"] if s["t0"] <= t <= s["t1"]]
    where = ", ".join(f"run {s['run']} {s['stage']}" for s in during) or "between stages"
    return f"highest RSS {(rss - r['start_rss']) / 1e9:.2f} GB over the start at {t:.1f} s, during {where}"


def least_reads(order: list[str], weights: dict[str, int], working: dict[str, int], budget: int) -> int:
    """The bytes a run of ``order``, repeated, must read at the least when each stage needs its
    weights whole at its turn, beside its working memory, within ``budget``: an optimal cache
    (Belady's: give up first what is needed again last) over divisible bytes, run three times
    round the pipeline; the last run's reads. A lower bound for any runner: it ignores that the
    next stage's reads overlap the running one."""
    held = dict.fromkeys(order, 0)
    n = len(order)
    read = 0
    for turn in range(3 * n):
        i = turn % n
        now = order[i]
        if turn >= 2 * n:
            read += weights[now] - held[now]
        held[now] = weights[now]
        over = sum(held.values()) - (budget - working[now])
        for j in sorted(range(n), key=lambda j: -((j - i) % n)):
            if over <= 0:
                break
            if j != i:
                gone = min(over, held[order[j]])
                held[order[j]] -= gone
                over -= gone
    return read


def ordered_first_run(sizes: dict[str, int], compute: dict[str, float], speed: float, steps: int) -> float:
    """The least time any way can take for a cold first run: a stage's first call needs all its
    weights, and every later stage waits for its output, so for each stage k the run lasts at
    least the reads of the stages up to k, then what compute of k can only follow its first
    call (the transformer's steps after the first; nothing of the others, to stay a bound) and
    every later stage's warm compute. The largest of these, and at least the warm compute."""
    best = sum(compute.values())
    read = 0.0
    for i, name in enumerate(pm.STAGES):
        read += sizes[name] / 1e9 / speed
        after = compute.get(name, 0.0) * (steps - 1) / steps if name == "transformer" else 0.0
        best = max(best, read + after + sum(compute.get(n, 0.0) for n in pm.STAGES[i + 1 :]))
    return best


def cost_floors(
    cost: dict[str, dict[str, float]],
    speed: float,
    sizes: dict[str, int],
    compute: dict[str, float],
    steps: int,
    runner: dict[str, Any],
    budget: int,
) -> tuple[float, float, float, int]:
    """Two floors that count what a read costs (_read_cost.py's measure): the warm compute of both
    runs plus every byte the runs must read (the files, then what run 2 must read again), and the
    floor with the stages' order plus run 2's bytes. A byte is read either beside compute,
    costing it at least the least of the stages' costs, or with nothing computing, costing its
    read time: the lesser of the two per GB, so both stay bounds. Returns that cost per GB, the
    two floors and run 2's bytes."""
    import math

    measured = [c["per_gb"] for c in cost.values() if not math.isnan(c["per_gb"])]
    # Nothing measured (the reads were over before any compute began): no cost counted.
    per_gb = min([*measured, 1 / speed]) if measured else 0.0
    warm = sum(compute.values())
    again = least_reads(list(runner["stage_bytes"]), runner["stage_bytes"], runner["working"], budget)
    with_reads = 2 * warm + per_gb * (sum(sizes.values()) + again) / 1e9
    ordered = ordered_first_run(sizes, compute, speed, steps) + warm + per_gb * again / 1e9
    return per_gb, with_reads, ordered, again


def read_cost_note(
    cost: dict[str, dict[str, float]], floors: tuple[float, float, float, int], total_bytes: int, runner: dict[str, Any]
) -> str:
    """The compute a read beside each stage costs it, and the runner against :func:`cost_floors`."""
    per_gb, with_reads, ordered, again = floors
    stages = "; ".join(
        f"{n} {c['alone']:.2f} s alone, {c['beside']:.2f} s beside {c['gb_during']:.2f} GB read: {c['per_gb']:.2f} s/GB"
        for n, c in cost.items()
    )
    drive = min(c["drive_read"] for c in cost.values()) / 1e9
    pairs = next(iter(cost.values()))["pairs"]
    return (
        "reads beside compute (plain's process after its runs, every weight in memory; each stage's warm "
        "compute alone and while the transformer's file is read as a stage ahead is, direct into fresh "
        f"pages, medians of {pairs:.0f} pairs in turn; the drive served at least {drive:.2f} GB a read): "
        f"{stages}. At {per_gb:.2f} s per GB (the least of these and of the read time alone), the warm "
        f"compute plus the {(total_bytes + again) / 1e9:.2f} GB the two runs must read is {with_reads:.2f} s, "
        f"the floor with the stages' order plus run 2's {again / 1e9:.2f} GB is {ordered:.2f} s: the runner is "
        f"{way_total(runner) / max(with_reads, ordered):.2f}x the higher"
    )


def plot(got: dict[str, dict[str, Any]], budget: int, path: Path) -> None:
    """One time line per way: per stage its start (light), its compute (dark) and its loader's
    reads (hatched, above the bar); under it the drive's read rate and the process's RSS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = {w: r for w, r in got.items() if "failed" not in r}
    colors = dict(zip(pm.STAGES, ("tab:purple", "tab:green", "tab:blue", "tab:orange"), strict=True))
    fig, axes = plt.subplots(
        2 * len(ok), 1, figsize=(13, 3.3 * len(ok)), sharex=True, gridspec_kw={"height_ratios": [1.3, 1] * len(ok)}
    )
    for i, (way, r) in enumerate(ok.items()):
        lanes, meter = axes[2 * i], axes[2 * i + 1]
        for s in r["spans"]:
            y: float = pm.STAGES.index(s["stage"])  # a float: the loader reads' bars below sit between lanes
            c = colors[s["stage"]]
            lanes.barh(y, s["ready"] - s["t0"], left=s["t0"], height=0.35, color=c, alpha=0.35)
            lanes.barh(y, s["t1"] - s["ready"], left=s["ready"], height=0.35, color=c)
        for lr in r["loader_reads"]:
            y = pm.STAGES.index(lr["stage"]) + 0.3 if lr["stage"] in pm.STAGES else 0
            lanes.barh(
                y,
                max(lr["t1"] - lr["t0"], 0.02),
                left=lr["t0"],
                height=0.2,
                color="white",
                edgecolor=colors.get(lr["stage"], "k"),
                hatch="///",
            )
        lanes.set_yticks(range(len(pm.STAGES)), pm.STAGES)
        lanes.invert_yaxis()
        lanes.set_title(f"{way}: start (light), compute (dark), loader reads (hatched)", fontsize=9, loc="left")
        t = [x[0] for x in r["samples"]]
        b = [x[1] for x in r["samples"]]
        rate = [0.0] + [(b[k] - b[k - 1]) / max(t[k] - t[k - 1], 1e-3) / 1e9 for k in range(1, len(t))]
        meter.fill_between(t, rate, step="pre", color="grey", alpha=0.5, label="drive reads GB/s")
        meter.plot(t, [x[2] / 1e9 for x in r["samples"]], color="k", lw=1, label="RSS GB")
        meter.axhline((r["start_rss"] + budget) / 1e9, color="r", lw=0.8, ls="--", label="RSS at the start + budget")
        meter.legend(fontsize=7, loc="upper right")
    axes[-1].set_xlabel("seconds since the process started measuring")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def stage_seconds(res: dict[str, Any], run: int) -> dict[str, float]:
    """Each stage's seconds in run ``run`` of a way (3: plain's warm run)."""
    return {s["stage"]: s["t1"] - s["t0"] for s in res["spans"] if s["run"] == run}


def run_total(res: dict[str, Any], run: int) -> float:
    spans = [s for s in res["spans"] if s["run"] == run]
    return max(s["t1"] for s in spans) - min(s["t0"] for s in spans)


def way_total(res: dict[str, Any]) -> float:
    """A way's two runs and any load before them, as the main table counts them."""
    load = sum(s["t1"] - s["t0"] for s in res["spans"] if s["run"] == 0)
    return load + run_total(res, 1) + run_total(res, 2)


def rounds_section(
    rounds: list[dict[str, dict[str, Any]]], sizes: dict[str, int], speed: float, steps: int, budget: int
) -> str:
    """Every way's total in each round, the ways interleaved round by round, and the runner's
    ratios with the floors of its own round (plain's warm run of that round): the machine's speed
    drifts between minutes, so a ratio is only as good as the round it was taken in."""
    ways = [w for w in rounds[0] if all("failed" not in r.get(w, {"failed": 1}) for r in rounds)]
    lines = ["", f"## The ways in {len(rounds)} rounds, interleaved", ""]
    lines += ["The tables and notes above are the last round's.", ""]
    head = "| way | " + " | ".join(f"round {i + 1} s" for i in range(len(rounds))) + " | median s |"
    lines += [head, "|---|" + "---:|" * (len(rounds) + 1)]
    for w in ways:
        totals = [way_total(r[w]) for r in rounds]
        lines.append(f"| {w} | " + " | ".join(f"{t:.1f}" for t in totals) + f" | {statistics.median(totals):.1f} |")
    if "pipeline" in ways and "plain" in ways:
        plain_floor, order_floor, cost_floor = [], [], []
        for r in rounds:
            compute = stage_seconds(r["plain"], 3)
            warm = sum(compute.values())
            floor = max(2 * warm, sum(sizes.values()) / 1e9 / speed)
            plain_floor.append(way_total(r["pipeline"]) / floor)
            order_floor.append(way_total(r["pipeline"]) / (ordered_first_run(sizes, compute, speed, steps) + warm))
            if "read_cost" in r["plain"]:
                _, with_reads, ordered, _ = cost_floors(
                    r["plain"]["read_cost"], speed, sizes, compute, steps, r["pipeline"], budget
                )
                cost_floor.append(way_total(r["pipeline"]) / max(with_reads, ordered))
        lines += [
            "",
            "- runner / the floor of its round: "
            + ", ".join(f"{x:.2f}x" for x in plain_floor)
            + f" (median {statistics.median(plain_floor):.2f}x); / the floor with the stages' order: "
            + ", ".join(f"{x:.2f}x" for x in order_floor)
            + f" (median {statistics.median(order_floor):.2f}x)"
            + (
                "; / the higher floor with the reads' cost: "
                + ", ".join(f"{x:.2f}x" for x in cost_floor)
                + f" (median {statistics.median(cost_floor):.2f}x)"
                if cost_floor
                else ""
            ),
        ]
    for w in ways:
        if w != "pipeline" and "pipeline" in ways:
            ratio = [way_total(r["pipeline"]) / way_total(r[w]) for r in rounds]
            lines.append(f"- runner / {w}, round by round: " + ", ".join(f"{x:.2f}x" for x in ratio))
    return "\n".join(lines) + "\n"
