"""The pipeline runner against the other ways of running a pipeline too large for the RAM budget
(one staging pool, stages read ahead and kept), on a cold cache, two runs each (not a test).

    PYTHONPATH=python .venv/bin/python bench/pipeline.py [--preset full] [--steps 8] [--budget 0.6]

The pipeline (bench/_pipeline_models.py, random bf16 weights written once under
target/bench-data/pipeline-<preset>/): a Llama rewrites the prompt (a prefill and 4 tokens with
the KV cache), a T5 encoder encodes it, an SD3 transformer denoises 32x32 latents in ``--steps``
Euler steps (the last one in a final pass), an SD3-style AutoencoderKL decodes 256x256 images.
The RAM budget is ``--budget`` times the four checkpoints' bytes.

Ways, each in a process of its own started with the four files dropped from the page cache:
  plain          every model loaded with load_state_dict at the start (over the budget)
  stage          one trash_panda.stage(ram=budget, overlap=True) per model, one after another
  pipeline       trash_panda.Pipeline(ram=budget)
  no_pool        the same without its pool of pages (every read into new pages; not a default
                 way: ``--ways plain,pipeline,no_pool`` weighs what the pool gives)
  model_offload  diffusers' enable_model_cpu_offload(device="cpu"): without an accelerator it
                 refuses; on the CPU it holds every model in RAM
  group_offload  diffusers' apply_group_offloading(block_level, offload_to_disk_path) per model,
                 each loaded at its first turn; its files are dropped from the cache once written
Each way runs the pipeline twice (a second prompt), and plain a third time, warm, for the
compute. Between the runs the page cache (outside the budget) keeps what it holds; with
``--drop-between-runs`` the files leave it before run 2, as on a machine whose RAM is the budget.
Measured per way: time per stage and run, peak RSS (RssSampler), bytes read from the drive
holding target/ (/proc/diskstats), the images against plain's. The floor is
max(2 x the warm compute, the four files / the drive's best reader, measured before and after
the ways). Plain's process then times each stage's warm compute alone and beside a read of
the transformer's file as a stage ahead is read (bench/_read_cost.py): what a read behind
compute costs the compute here. Every byte a way reads costs either that or its read time with
nothing computing, so the report adds the lesser of the two, per GB the runs must read, to the
warm compute (and to the floor with the stages' order, for run 2's reads). Writes
bench/results/pipeline.md and bench/results/pipeline.png (a time line per way: each stage's
start, compute and its loader's reads, the drive's read rate and the RSS).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _pipeline_models as pm
import torch
from _common import RESULTS, best_reader, cold, device_read_bytes, loadavg, machine, md_table
from _pipeline_report import (
    cost_floors,
    least_reads,
    ordered_first_run,
    peak_at,
    plot,
    read_cost_note,
    rounds_section,
    run_total,
    stage_seconds,
    way_total,
)
from _read_cost import stage_costs

WAYS = ("plain", "stage", "pipeline", "model_offload", "group_offload")
ALL_WAYS = (*WAYS, "no_pool")
WORK = pm.DATA / "pipeline-work"
CLASS_STAGE = {
    "LlamaForCausalLM": "llm",
    "T5EncoderModel": "text",
    "SD3Transformer2DModel": "transformer",
    "AutoencoderKL": "vae",
}


# -- the child: one way, two runs ---------------------------------------------------------------


class Recorder:
    """What a way's process reports: spans on its time line, a sample of the drive's reads and
    of the RSS every 50 ms, and the loaders that read weights behind the main thread."""

    def __init__(self, drive_path: Path) -> None:
        from trash_panda import _core

        self.t0 = time.perf_counter()
        self.drive = drive_path
        self.spans: list[dict[str, Any]] = []
        self.samples: list[tuple[float, int, int]] = []
        self.loaders: list[tuple[str, Any]] = []
        self.drop: list[Path] = []
        self.read0 = device_read_bytes(drive_path)
        self.rss = _core.RssSampler(2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        self._instrument()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def _sample(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.is_set():
            with open("/proc/self/statm") as f:
                rss = int(f.read().split()[1]) * page
            self.samples.append((self.now(), device_read_bytes(self.drive) - self.read0, rss))
            time.sleep(0.05)

    def _instrument(self) -> None:
        """Wraps where every loader thread starts (a stage's load, or a kept stage reading its
        given-back blocks again) to learn which stage it reads for, and the loader's run to
        learn when it read."""
        from trash_panda.offload import overlap

        rec = self
        start_loader = overlap.start_loader
        run = overlap.ResidentLoader._run

        def hooked(handle: Any, *a: Any, **k: Any) -> Any:
            loader = start_loader(handle, *a, **k)
            rec.loaders.append((CLASS_STAGE.get(type(handle.model).__name__, "?"), loader))
            return loader

        def timed_run(self: Any) -> None:
            self.t_start = rec.now()
            try:
                run(self)
            finally:
                self.t_end = rec.now()

        overlap.start_loader = hooked
        overlap.ResidentLoader._run = timed_run  # type: ignore[method-assign]

    @contextmanager
    def stage(self, run: int, name: str) -> Iterator[Any]:
        """Around a stage: ``ready()`` marks the end of its start (the model can be called);
        the span's end is after its release or hand-over."""
        span: dict[str, Any] = {"run": run, "stage": name, "t0": self.now()}

        def ready() -> None:
            span["ready"] = self.now()

        try:
            yield ready
        finally:
            span["t1"] = self.now()
            span.setdefault("ready", span["t0"])
            self.spans.append(span)

    def between_runs(self, number: int) -> None:
        """Before run 2 with --drop-between-runs: the files (and what a way wrote) leave the page
        cache, as on a machine whose RAM is the budget, where the cache could not have kept
        them. Pages a process has mapped stay: those are counted in its RSS."""
        from trash_panda import _core

        if number == 2 and self.drop:
            for f in self.drop:
                for g in f.rglob("*") if f.is_dir() else [f]:
                    if g.is_file():
                        _core.drop_cache(g)

    def finish(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        start, peak, _end = self.rss.stop()
        reads = []
        for name, loader in self.loaders:
            if hasattr(loader, "t_start"):
                reads.append(
                    {
                        "stage": name,
                        "t0": loader.t_start,
                        "t1": getattr(loader, "t_end", loader.t_start),
                        "bytes": loader.loaded_bytes,
                        "waited": loader.waited_seconds,
                    }
                )
        return {
            "spans": self.spans,
            "samples": self.samples,
            "loader_reads": reads,
            "peak_rss": peak,
            "start_rss": start,
            "read": device_read_bytes(self.drive) - self.read0,
        }


def one_run(number: int, rec: Recorder, enter: Any, steps: int, final: Any = None) -> torch.Tensor:
    """One run of the pipeline; ``enter(name)`` is a context manager that yields the stage's
    model, ``final(model)`` one around the last denoising step (None: no final pass)."""
    rec.between_runs(number)
    with torch.no_grad():
        with rec.stage(number, "llm") as ready, enter("llm") as llm:
            ready()
            ids = pm.rewrite(llm, pm.prompt(number, llm.config.vocab_size))
        with rec.stage(number, "text") as ready, enter("text") as text:
            ready()
            cond = pm.encode(text, ids)
        latents = pm.start_latents(number)
        with rec.stage(number, "transformer") as ready, enter("transformer") as tr:
            ready()
            for step in range(steps - 1):
                latents = pm.denoise(tr, latents, cond, step, steps)
            with final(tr) if final is not None else nullcontext():
                latents = pm.denoise(tr, latents, cond, steps - 1, steps)
        with rec.stage(number, "vae") as ready, enter("vae") as vae:
            ready()
            return pm.decode(vae, latents)


def child(way: str, preset: str, steps: int, budget: int, drop: bool, out: Path) -> None:
    import trash_panda as tp

    ms = pm.models(preset)
    rec = Recorder(ms["transformer"].path)
    if drop:
        rec.drop = [m.path for m in ms.values()] + [WORK / "group-offload"]
    orders = Path(tempfile.mkdtemp(prefix="pipeline-orders-"))  # each way starts with no order file
    result: dict[str, Any] = {"way": way}
    images = []
    if way in ("plain", "model_offload"):
        loaded: dict[str, torch.nn.Module] = {}
        for name, m in ms.items():
            with rec.stage(0, name) as ready:
                loaded[name] = pm.plain(m)
                ready()
        if way == "model_offload":
            from diffusers import DiffusionPipeline

            class Holder(DiffusionPipeline):
                model_cpu_offload_seq = "llm->text->transformer->vae"

                def __init__(self, llm: Any, text: Any, transformer: Any, vae: Any) -> None:
                    super().__init__()
                    self.register_modules(llm=llm, text=text, transformer=transformer, vae=vae)

            holder = Holder(**loaded)
            try:
                holder.enable_model_cpu_offload()
            except RuntimeError as e:
                result["refused"] = f"enable_model_cpu_offload(): {type(e).__name__}: {e}"
            holder.enable_model_cpu_offload(device="cpu")

        @contextmanager
        def enter(name: str) -> Iterator[torch.nn.Module]:
            yield loaded[name]

        runs = 3 if way == "plain" else 2
        for r in range(1, runs + 1):
            images.append(one_run(r, rec, enter, steps))
    elif way == "stage":
        # stage()'s own options by name (checked), the plan's and the load's through its **kwargs.
        opts: dict[str, Any] = {"device": "cpu", "ram": budget, "min_free_ram": 0}

        @contextmanager
        def enter(name: str) -> Iterator[torch.nn.Module]:
            m = ms[name]
            build = functools.partial(pm.meta, m)
            with tp.stage(build, m.path, overlap=True, order_file_destination=orders, **opts) as (model, _plan, handle):
                enter.handle = handle  # type: ignore[attr-defined]
                yield model

        @contextmanager
        def final(model: torch.nn.Module) -> Iterator[None]:
            with enter.handle.final_pass():  # type: ignore[attr-defined]
                yield

        for r in (1, 2):
            images.append(one_run(r, rec, enter, steps, final))
    elif way in ("pipeline", "no_pool"):
        stages = [
            tp.Stage(
                n, functools.partial(pm.meta, m), m.path, options={"min_free_ram": 0}, order_file_destination=orders
            )
            for n, m in ms.items()
        ]
        with tp.Pipeline(stages, device="cpu", ram=budget) as pipe:
            if way == "no_pool":
                pipe._keeper.pages = None  # the reference: every read into new pages
            kept = []
            for r in (1, 2):
                with pipe.run() as run:

                    def final(model: torch.nn.Module, run: Any = run) -> Any:
                        return run.final_pass()

                    images.append(one_run(r, rec, run.stage, steps, final))
                kept.append(pipe.loaded)
            result["kept"] = kept
            result["report"] = pipe.report()
            # What each stage holds and the most it needed beside that, for the bound on what
            # any runner must read again (least_reads).
            result["stage_bytes"] = {r.stage: r.holds for r in pipe.records if r.run == 1}
            result["working"] = {n: max(r.peak for r in pipe.records if r.stage == n) for n in ms}
    elif way == "group_offload":
        from diffusers.hooks import apply_group_offloading

        from trash_panda import _core

        folder = WORK / "group-offload"
        shutil.rmtree(folder, ignore_errors=True)
        loaded = {}

        @contextmanager
        def enter(name: str) -> Iterator[torch.nn.Module]:
            if name not in loaded:
                model = pm.plain(ms[name])
                apply_group_offloading(
                    model,
                    onload_device=torch.device("cpu"),
                    offload_device=torch.device("cpu"),
                    offload_type="block_level",
                    num_blocks_per_group=1,
                    offload_to_disk_path=str(folder / name),
                )
                # What it wrote is read back from the drive, as a cold pass of the other ways is.
                os.sync()
                for f in (folder / name).rglob("*"):
                    if f.is_file():
                        _core.drop_cache(f)
                loaded[name] = model
            yield loaded[name]

        for r in (1, 2):
            images.append(one_run(r, rec, enter, steps))
        result["written"] = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        shutil.rmtree(folder, ignore_errors=True)
    else:
        raise SystemExit(f"unknown way {way!r}: expected one of {', '.join(ALL_WAYS)}")
    result.update(rec.finish())
    if way == "plain":  # after the recorder stops: its reads and memory are not the way's
        result["read_cost"] = stage_costs(loaded, ms["transformer"].path, steps)
    shutil.rmtree(orders, ignore_errors=True)
    torch.save([i.contiguous() for i in images], out.with_suffix(".pt"))
    out.write_text(json.dumps(result))


# -- the parent: the drive, the ways, the report -----------------------------------------------


def run_way(way: str, args: argparse.Namespace, budget: int, files: list[Path]) -> dict[str, Any]:
    for f in files:
        cold(f)
    out = WORK / f"{way}.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--child", way, "--preset", args.preset, "--steps", str(args.steps)]
    cmd += ["--drop-between-runs"] if args.drop_between_runs else []
    t = time.perf_counter()
    try:
        proc = subprocess.run(
            [*cmd, "--budget-bytes", str(budget)], capture_output=True, text=True, timeout=args.timeout
        )
    except subprocess.TimeoutExpired as e:
        # A hang is a finding: say where it was, leave the other ways their turn.
        tail = "\n".join(str(e.stderr or "").splitlines()[-15:])
        print(f"  {way}: no result after {args.timeout} s\n{tail}", flush=True)
        return {"way": way, "failed": f"{tail}\nno result after {args.timeout} s"}
    wall = time.perf_counter() - t
    if proc.returncode != 0 or not out.exists():
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        print(f"  {way}: failed (exit {proc.returncode})\n{tail}", flush=True)
        return {"way": way, "failed": tail}
    res = json.loads(out.read_text())
    res["process_s"] = wall
    res["images"] = torch.load(out.with_suffix(".pt"))
    return res


def read_in(res: dict[str, Any], t0: float, t1: float) -> int:
    """Bytes the drive read between t0 and t1 of the way's time line (its 50 ms samples)."""
    before = [b for t, b, _ in res["samples"] if t <= t0] or [0]
    upto = [b for t, b, _ in res["samples"] if t <= t1] or [0]
    return upto[-1] - before[-1]


def report(
    args: argparse.Namespace, got: dict[str, dict[str, Any]], sizes: dict[str, int], budget: int, drive: list[float]
) -> str:
    ok = {w: r for w, r in got.items() if "failed" not in r}
    total_bytes = sum(sizes.values())
    plain = ok.get("plain")
    compute = {}
    if plain is not None:  # the warm run: the plain models' third run, every weight in memory
        compute = stage_seconds(plain, 3)
    warm = sum(compute.values())
    speed = statistics.mean(drive)
    floor = max(2 * warm, total_bytes / 1e9 / speed)
    floor_run = max(warm, total_bytes / 1e9 / speed)
    first = ordered_first_run(sizes, compute, speed, args.steps)
    rows = []
    for way, r in ok.items():
        load = sum(s["t1"] - s["t0"] for s in r["spans"] if s["run"] == 0)
        t1, t2 = run_total(r, 1), run_total(r, 2)
        total = way_total(r)
        r["total"] = total
        r1 = [s for s in r["spans"] if s["run"] == 1]
        r2 = [s for s in r["spans"] if s["run"] == 2]
        r["read1"] = read_in(r, 0.0, max(s["t1"] for s in r1))
        r["read2"] = read_in(r, min(s["t0"] for s in r2), max(s["t1"] for s in r2))
        same = plain is not None and all(
            torch.equal(a, b) for a, b in zip(r["images"][:2], plain["images"][:2], strict=True)
        )
        per = [stage_seconds(r, n) for n in (1, 2)]
        rows.append(
            [
                way,
                f"{total:.1f}",
                f"{load:.1f}" if load else "-",
                f"{t1:.1f} / {t2:.1f}",
                *[f"{per[0].get(s, 0):.2f} / {per[1].get(s, 0):.2f}" for s in pm.STAGES],
                f"{r['peak_rss'] / 1e9:.2f} ({(r['peak_rss'] - r['start_rss']) / 1e9:.2f})",
                f"{r['read1'] / 1e9:.2f} / {r['read2'] / 1e9:.2f}",
                f"{r.get('written', 0) / 1e9:.2f}",
                f"{total / floor:.2f}x",
                "-" if plain is None else ("yes" if same else "no"),
            ]
        )
    header = ["way", "total s", "load before run 1 s", "run 1 / run 2 s"]
    header += [f"{s} s (run 1 / 2)" for s in pm.STAGES]
    header += [
        "peak RSS GB (over the start)",
        "read GB (load + run 1 / run 2)",
        "wrote GB",
        "total / floor",
        "images = plain",
    ]
    mach = machine(pm.DATA)
    lines = [
        "# Pipeline runner (`bench/pipeline.py`)",
        "",
        f"- date: {mach['date']}",
        f"- machine: nproc {mach['nproc']} ({mach['cpu']}, {args.cpu_flags}), {mach['ram']} RAM, kernel "
        f"{mach['kernel']}, {mach['fs']}, torch {mach['torch']}; load average at the end {loadavg()}",
        f"- models (preset {args.preset}, random bf16 weights, bf16 compute on the CPU): "
        + ", ".join(f"{n} {sizes[n] / 1e9:.2f} GB" for n in pm.STAGES)
        + f"; {total_bytes / 1e9:.2f} GB in all",
        f"- a run: the LLM rewrites a {pm.PROMPT_TOKENS}-token prompt ({pm.REWRITE_STEPS} tokens, KV cache), "
        f"T5 encodes it, {args.steps} Euler steps of the SD3 transformer on {pm.LATENT}x{pm.LATENT} latents "
        "(the last in a final pass), the VAE decodes a 256x256 image; two runs per way (two prompts)",
        f"- RAM budget: {budget / 1e9:.2f} GB ({args.budget:.0%} of the four checkpoints): `ram=` of every "
        "`stage(overlap=True)`, `Pipeline(ram=)`; `min_free_ram=0` in both (the budget is the weights' and staging's)",
        "- each way in its own process, the four files dropped from the page cache before it (checked with "
        "mincore); "
        + (
            "dropped again before its second run (`--drop-between-runs`: the budget as the machine's RAM); "
            if args.drop_between_runs
            else "nothing dropped between its runs (the page cache, outside the budget, may serve run 2); "
        )
        + "peak RSS of the whole process (RssSampler, 2 ms), and in brackets over its RSS before the first "
        "load (torch, transformers and diffusers imported); bytes read: /proc/diskstats of the drive "
        "holding target/ (every process's reads)",
        f"- drive: best reader (O_DIRECT with 4 and 16 requests in flight, dd iflag=direct, the best) on the "
        f"transformer's file before / after the ways: {' / '.join(f'{d:.2f}' for d in drive)} GB/s",
        (
            "- compute, warm (plain's third run, every weight in memory): "
            + ", ".join(f"{s} {compute.get(s, 0):.2f} s" for s in pm.STAGES)
            + f"; {warm:.2f} s a run (plain's runs 1 and 2, weights in memory too: {run_total(plain, 1):.2f} and "
            f"{run_total(plain, 2):.2f} s: the machine's speed drifts between runs by that much)"
            if plain is not None
            else "- compute, warm: not measured (the plain way did not run), so the floors below are the reads' alone"
        ),
        f"- floor of the two runs: max(2 x {warm:.2f} s, {total_bytes / 1e9:.2f} GB / {speed:.2f} GB/s) = "
        f"{floor:.2f} s (one run: {floor_run:.2f} s)",
        f"- the floor with the stages' order (no runner beats it): run 1 cannot end before the weights of "
        f"every stage up to the transformer are read, then 7/8 of its warm compute and the VAE's "
        f"({first:.2f} s), run 2 not before the warm compute: {first + warm:.2f} s, "
        f"{(first + warm) / floor:.2f}x the floor",
        "",
        md_table(header, rows),
        "",
    ]
    notes = []
    runner = ok.get("pipeline")
    if runner is not None:
        if warm:  # plain ran: the warm compute is known
            notes.append(
                f"runner / floor: {runner['total'] / floor:.2f}x; "
                f"its run 1 / the one-run floor: {run_total(runner, 1) / floor_run:.2f}x; "
                f"runner / the floor with the stages' order: {runner['total'] / (first + warm):.2f}x "
                f"(run 1 {run_total(runner, 1) / first:.2f}x, run 2 {run_total(runner, 2) / warm:.2f}x)"
            )
        for way, r in ok.items():
            if way != "pipeline":
                notes.append(
                    f"runner / {way}: {runner['total'] / r['total']:.2f}x total, "
                    f"{run_total(runner, 2) / run_total(r, 2):.2f}x on run 2, "
                    f"{runner['peak_rss'] / r['peak_rss']:.2f}x peak RSS"
                )
        unkept = max(0, total_bytes - budget)
        least = least_reads(list(runner["stage_bytes"]), runner["stage_bytes"], runner["working"], budget)
        cost = plain.get("read_cost") if plain is not None else None
        if cost is not None:
            floors = cost_floors(cost, speed, sizes, compute, args.steps, runner, budget)
            notes.append(read_cost_note(cost, floors, total_bytes, runner))
        none = least_reads(
            list(runner["stage_bytes"]), runner["stage_bytes"], dict.fromkeys(runner["working"], 0), budget
        )
        working = ", ".join(f"{n} {b / 1e9:.2f}" for n, b in runner["working"].items())
        notes.append(
            f"second run: the runner read {runner['read2'] / 1e9:.2f} GB; the files less the budget are "
            f"{unkept / 1e9:.2f} GB; what the budget cannot keep while each stage also holds the working memory "
            f"it measured ({working} GB) is {least / 1e9:.2f} GB (the least any runner reads a run, by an optimal "
            f"cache of bytes: {runner['read2'] / max(least, 1):.2f}x that; {none / 1e9:.2f} GB were no working memory "
            f"needed); stages loaded after each run: "
            f"{runner['kept']}"
        )
    for way, r in got.items():
        if "failed" in r:
            notes.append(f"{way}: failed: `{r['failed'].splitlines()[-1] if r['failed'] else '?'}`")
        elif r.get("refused"):
            notes.append(
                f'{way}: {r["refused"]}; run with `device="cpu"`, it moves each model from the CPU to the CPU: '
                "every model stays in RAM, so its figures are plain PyTorch's with hooks, not an offload"
            )
    for way, r in ok.items():
        if r["samples"] and way in ("pipeline", "stage"):
            notes.append(f"{way}: {peak_at(r)}")
        if r["loader_reads"]:
            behind = ", ".join(
                f"{lr['stage']} {lr['bytes'] / 1e9:.2f} GB in {lr['t1'] - lr['t0']:.2f} s (waited {lr['waited']:.2f} s)"
                for lr in r["loader_reads"]
            )
            notes.append(f"{way}: loader threads, in order: {behind}")
    lines += [f"- {n}" for n in notes]
    if runner is not None:
        lines += ["", "`pipe.report()` of the runner:", "", "```", runner["report"].rstrip(), "```"]
    png = "pipeline.png" if args.preset == "full" else f"pipeline-{args.preset}.png"
    lines += ["", f"![stages on a time line]({png})", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="full", choices=sorted(pm.PRESETS))
    ap.add_argument("--steps", type=int, default=8)
    # 0.75: every model fits alone, the four do not fit together; what is measured is how the
    # memory moves between them. Under 0.6 the transformer alone outgrows the budget and
    # streams part of its blocks on every step, a test of streaming, not of the runner.
    ap.add_argument("--budget", type=float, default=0.75, help="the RAM budget, a share of the checkpoints' bytes")
    ap.add_argument("--ways", default=",".join(WAYS))
    ap.add_argument("--timeout", type=int, default=900, help="seconds a way may take before it counts as hung")
    ap.add_argument(
        "--drop-between-runs",
        action="store_true",
        help="drop the files from the page cache before the second run (the budget as the machine's RAM)",
    )
    ap.add_argument("--rounds", type=int, default=1, help="run the ways this many times, interleaved")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--budget-bytes", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(
            args.child, args.preset, args.steps, args.budget_bytes, args.drop_between_runs, WORK / f"{args.child}.json"
        )
        return
    ms = pm.models(args.preset)
    total = pm.write_all(ms)
    sizes = {n: m.path.stat().st_size for n, m in ms.items()}
    budget = int(total * args.budget)
    WORK.mkdir(parents=True, exist_ok=True)
    with open("/proc/cpuinfo") as f:
        flags = f.read().split("flags", 1)[1].split("\n", 1)[0].split()
    args.cpu_flags = " ".join(f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f in flags) or "AVX2 only"
    files = [m.path for m in ms.values()]
    drive = [best_reader(ms["transformer"].path)]
    print(f"{total / 1e9:.2f} GB, budget {budget / 1e9:.2f} GB, best reader {drive[0]:.2f} GB/s", flush=True)
    rounds: list[dict[str, dict[str, Any]]] = []
    for n in range(args.rounds):
        got: dict[str, dict[str, Any]] = {}
        for way in args.ways.split(","):
            got[way] = r = run_way(way, args, budget, files)
            if "failed" not in r:
                print(
                    f"  round {n + 1} {way}: {r['process_s']:.1f} s in its process, peak RSS "
                    f"{r['peak_rss'] / 1e9:.2f} GB, read {r['read'] / 1e9:.2f} GB, load avg {loadavg()}",
                    flush=True,
                )
        rounds.append(got)
    drive.append(best_reader(ms["transformer"].path))
    text = report(args, got, sizes, budget, drive)
    if args.rounds > 1:
        text += rounds_section(rounds, sizes, statistics.mean(drive), args.steps, budget)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "pipeline" if args.preset == "full" else f"pipeline-{args.preset}"
    plot(got, budget, RESULTS / f"{name}.png")
    (RESULTS / f"{name}.md").write_text(text.replace("(pipeline.png)", f"({name}.png)"))


if __name__ == "__main__":
    main()
