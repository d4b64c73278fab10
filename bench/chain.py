"""A two-model chain, cold: a language model that computes long (greedy decoding with its KV
cache), then a large model that computes briefly (an SD3 transformer, a few Euler steps). The
runner's reason to exist is reading the second model behind the first one's compute; this
times whether it does, against every other way of running the chain (not a test).

    PYTHONPATH=python .venv/bin/python bench/chain.py [--dtype fp32] [--rounds 3] [--ways ...]

Ways, each in a process of its own started with both files dropped from the page cache, the
order of the ways rotated from round to round:
  plain        both models loaded with load_state_dict at the start; its output is the reference
  stage        one trash_panda.stage() per model, one after the other
  pipeline     trash_panda.Pipeline(stages), its defaults
  no_prefetch  trash_panda.Pipeline(stages, prefetch=False)
  no_pool      trash_panda.Pipeline(stages) without its pool of pages (every read into new
               pages): with ``--ram``, what the pool gives the reads that wait for the first
               model's memory
  *_direct     the same with TRASH_PANDA_DISK_MODE=direct (``--direct``)

``plain``'s load copies each tensor out of the file's map (so that the file can leave the page
cache for the read costs after it): its time is not a plain load's.

References measured in the same run: the drive (``dd iflag=direct bs=8M`` over both files,
before and after the ways); each model's warm compute (plain's process, after its run); and
what reading the second file costs the first model's compute beside it, three ways (plain's
process, files dropped first): an O_DIRECT read into one reused buffer (the irreducible cost),
O_DIRECT into fresh pages, O_DIRECT into pages faulted before the compute began (what a pool of
pages would give the reads), and a read through the page cache. The floor is
max(total compute + the second file's GB x the irreducible cost per GB, both files / drive);
the floor with the models' order adds that nothing computes before the first model's weights
are in. The runner's report (below the table) says what reading ahead cost the first model's
compute and whether it went on. ``--ram 3GB`` gives the runner ways that budget (the second
model's reads then wait in part for the first model's memory). Each way's process time (user
and system CPU seconds) is beside its run time. Writes bench/results/chain-<dtype>[-ram].md.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import DATA, RESULTS, cold, dd_direct, loadavg, machine, md_table, write_checkpoint

WAYS = ("plain", "stage", "pipeline", "no_prefetch")
ALL_WAYS = (*WAYS, "no_pool")
TOKENS = 48  # the language model's greedy tokens, each a pass over its layers
STEPS = 6  # the transformer's Euler steps
LATENT = 16  # 16x16 latents: 64 image tokens
TEXT = 16  # the transformer's text tokens, taken from the language model's output
PIECE = 64 << 20


def _llm() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=1536,
        intermediate_size=4096,
        num_hidden_layers=8,
        num_attention_heads=24,
        num_key_value_heads=24,
        vocab_size=16000,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def _denoiser() -> torch.nn.Module:
    from diffusers import SD3Transformer2DModel

    return SD3Transformer2DModel(
        sample_size=LATENT,
        patch_size=2,
        in_channels=16,
        out_channels=16,
        num_layers=8,
        attention_head_dim=64,
        num_attention_heads=24,
        joint_attention_dim=1536,
        caption_projection_dim=1536,
        pooled_projection_dim=1536,
        pos_embed_max_size=LATENT // 2,
    )


MAKE: dict[str, Callable[[], torch.nn.Module]] = {"llm": _llm, "denoiser": _denoiser}


def _dtype(name: str) -> torch.dtype:
    return {"fp32": torch.float32, "bf16": torch.bfloat16}[name]


def paths(dtype: str) -> dict[str, Path]:
    folder = DATA / f"chain-{dtype}"
    return {n: folder / f"{n}.safetensors" for n in MAKE}


def write(dtype: str) -> None:
    for i, (name, path) in enumerate(paths(dtype).items()):
        with torch.device("meta"):
            shapes = MAKE[name]().to(_dtype(dtype))
        write_checkpoint(path, shapes, _dtype(dtype), seed=i)


def meta(name: str, dtype: str) -> torch.nn.Module:
    import trash_panda as tp

    with tp.empty_weights():
        return MAKE[name]().to(_dtype(dtype)).eval()


def plain(name: str, dtype: str) -> torch.nn.Module:
    from safetensors.torch import load_file

    model = meta(name, dtype)
    # Copied out of the file's map, which is then closed: a mapped file stays in the page
    # cache, and the read costs after the run need it cold.
    weights = {k: v.clone() for k, v in load_file(str(paths(dtype)[name])).items()}
    model.load_state_dict(weights, strict=False, assign=True)
    return model


# -- the chain's two turns ------------------------------------------------------------------


def generate(llm: torch.nn.Module) -> torch.Tensor:
    ids = torch.randint(4, 16000, (1, 16), generator=torch.Generator().manual_seed(0))
    out = llm(input_ids=ids, use_cache=True)
    for _ in range(TOKENS):
        nxt = out.logits[:, -1:].float().argmax(-1)
        ids = torch.cat([ids, nxt], dim=1)
        out = llm(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
    return ids


def denoise(denoiser: torch.nn.Module, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(int(ids.sum()))
    text = torch.randn(1, TEXT, 1536, generator=g).to(dtype)
    pooled = text.mean(dim=1)
    latents = torch.randn(1, 16, LATENT, LATENT, generator=g).to(dtype)
    sig = [1.0 - i / STEPS for i in range(STEPS + 1)]
    for s in range(STEPS):
        t = torch.full((1,), sig[s] * 1000.0)
        v = denoiser(hidden_states=latents, encoder_hidden_states=text, pooled_projections=pooled, timestep=t).sample
        latents = latents + (sig[s + 1] - sig[s]) * v
    return latents


# -- what a read beside the compute costs it --------------------------------------------------


def _reader(path: Path, how: str, stop: threading.Event, done: list[int], ready: list[torch.Tensor]) -> None:
    """Reads ``path`` to its end (or ``stop``): ``reused``, O_DIRECT into one buffer touched
    beforehand; ``fresh``, O_DIRECT into new pages per piece, kept; ``prefaulted``, O_DIRECT
    into ``ready``, pages of their own per piece written before the compute began (what a pool
    of pages faulted once would hand the reads); ``buffered``, through the page cache into one
    reused buffer."""
    from trash_panda import _core
    from trash_panda.offload.materialize import _fresh

    size = path.stat().st_size // 4096 * 4096
    buf = torch.empty(PIECE + 8192, dtype=torch.uint8)
    buf.fill_(0)
    kept = []
    for i, start in enumerate(range(0, size, PIECE)):
        if stop.is_set():
            break
        n = min(PIECE, size - start)
        if how == "fresh":
            dst = _fresh((n,), torch.uint8, n, start)
            kept.append(dst)
        elif how == "prefaulted":
            dst = ready[i][:n]
        else:
            shift = (start - buf.data_ptr()) % 4096
            dst = buf[shift : shift + n]
        _core.read_tensors(str(path), [(start, dst)], threads=4, direct=how != "buffered")
        done[0] += n


def read_costs(work: Callable[[], Any], path: Path, alone: float) -> dict[str, float]:
    """Seconds of compute lost per GB read beside ``work``, for each way of reading."""
    from trash_panda.offload.materialize import _fresh

    out = {}
    for how in ("reused", "fresh", "prefaulted", "buffered"):
        ready = []
        if how == "prefaulted":
            size = path.stat().st_size // 4096 * 4096
            ready = [_fresh((PIECE,), torch.uint8, PIECE, 0) for _ in range(0, size, PIECE)]
            for piece in ready:
                piece.fill_(0)
        cold(path)
        stop, done = threading.Event(), [0]
        t = threading.Thread(target=_reader, args=(path, how, stop, done, ready))
        t.start()
        t0 = time.perf_counter()
        work()
        took = time.perf_counter() - t0
        gb = done[0] / 1e9
        stop.set()
        t.join()
        out[how] = max(0.0, took - alone) / gb if gb else float("nan")
        out[f"{how}_gb"] = gb
    return out


# -- one way, in its own process ---------------------------------------------------------------


def child(way: str, dtype: str, out: Path, ram: str | None) -> None:
    import resource

    import trash_panda as tp

    ps = paths(dtype)
    for name in MAKE:  # the libraries' imports and first builds, which no way should pay for
        meta(name, dtype)
    for p in ps.values():
        cold(p)
    dt = _dtype(dtype)
    times: dict[str, float] = {}
    result: dict[str, Any] = {"way": way}
    start = time.perf_counter()

    def mark(name: str, t0: float) -> None:
        times[name] = time.perf_counter() - t0

    if way == "plain":
        t0 = time.perf_counter()
        models = {n: plain(n, dtype) for n in MAKE}
        mark("load", t0)
        with torch.inference_mode():
            t0 = time.perf_counter()
            ids = generate(models["llm"])
            mark("llm", t0)
            t0 = time.perf_counter()
            latents = denoise(models["denoiser"], ids, dt)
            mark("denoiser", t0)
        times["total"] = time.perf_counter() - start
        with torch.inference_mode():
            warm = {}
            for _ in range(2):
                t0 = time.perf_counter()
                generate(models["llm"])
                warm["llm"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                denoise(models["denoiser"], ids, dt)
                warm["denoiser"] = time.perf_counter() - t0
            result["warm"] = warm
            result["costs"] = read_costs(lambda: generate(models["llm"]), ps["denoiser"], warm["llm"])
    elif way == "stage":
        with torch.inference_mode():
            t0 = time.perf_counter()
            with tp.stage(lambda: meta("llm", dtype), ps["llm"], device="cpu") as (llm, _p, _h):
                ids = generate(llm)
            mark("llm", t0)
            t0 = time.perf_counter()
            with tp.stage(lambda: meta("denoiser", dtype), ps["denoiser"], device="cpu") as (den, _p, _h):
                latents = denoise(den, ids, dt)
            mark("denoiser", t0)
        times["total"] = time.perf_counter() - start
    else:
        stages = [tp.Stage(n, functools.partial(meta, n, dtype), ps[n]) for n in MAKE]
        prefetch = way != "no_prefetch"
        with torch.inference_mode(), tp.Pipeline(stages, device="cpu", prefetch=prefetch, ram=ram) as pipe:
            if way == "no_pool":
                pipe._keeper.pages = None  # the reference: every read into new pages
            with pipe.run() as run:
                t0 = time.perf_counter()
                with run.stage("llm") as llm:
                    ids = generate(llm)
                mark("llm", t0)
                t0 = time.perf_counter()
                with run.stage("denoiser") as den:
                    latents = denoise(den, ids, dt)
                mark("denoiser", t0)
            times["total"] = time.perf_counter() - start
            result["report"] = pipe.report()
    result["times"] = times
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["cpu"] = {"user": usage.ru_utime, "system": usage.ru_stime}
    torch.save({"ids": ids, "latents": latents}, out.with_suffix(".pt"))
    out.write_text(json.dumps(result))


def run_way(way: str, dtype: str, work: Path, ram: str | None) -> dict[str, Any]:
    base = way.removesuffix("_direct")
    env = dict(os.environ)
    if way.endswith("_direct"):
        env["TRASH_PANDA_DISK_MODE"] = "direct"
    out = work / f"{way}.json"
    cmd = [sys.executable, __file__, "--child", base, "--dtype", dtype, "--out", str(out)]
    if ram is not None:
        cmd += ["--ram", ram]
    subprocess.run(cmd, check=True, env=env)
    result: dict[str, Any] = json.loads(out.read_text())
    result["outputs"] = torch.load(out.with_suffix(".pt"))
    return result


@contextmanager
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="chain-") as d:
        yield Path(d)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ways", default=",".join(WAYS))
    ap.add_argument("--direct", action="store_true", help="also each runner way with TRASH_PANDA_DISK_MODE=direct")
    ap.add_argument("--ram", default=None, help="the runner ways' RAM budget (Pipeline(ram=)), e.g. 3GB")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.child:
        child(args.child, args.dtype, Path(args.out), args.ram)
        return
    write(args.dtype)
    ps = paths(args.dtype)
    sizes = {n: p.stat().st_size for n, p in ps.items()}
    ways = args.ways.split(",")
    unknown = [w for w in ways if w not in ALL_WAYS]
    if unknown:
        ap.error(f"unknown ways {unknown}: expected some of {', '.join(ALL_WAYS)}")
    if args.direct:
        ways += [f"{w}_direct" for w in ways if w != "plain"]

    def drive() -> float:
        speeds = []
        for p in ps.values():
            cold(p)
            speeds.append(dd_direct(p, 0, p.stat().st_size // 4096 * 4096))
        return statistics.mean(speeds)

    drives = [drive()]
    results: dict[str, list[dict[str, Any]]] = {w: [] for w in ways}
    with workdir() as work:
        for r in range(args.rounds):
            order = ways[r % len(ways) :] + ways[: r % len(ways)]
            for way in order:
                res = run_way(way, args.dtype, work, args.ram)
                results[way].append(res)
                print(f"round {r + 1} {way}: {res['times']}", flush=True)
            drives.append(drive())
    report(args, results, drives, sizes, ways)


def report(
    args: argparse.Namespace,
    results: dict[str, list[dict[str, Any]]],
    drives: list[float],
    sizes: dict[str, int],
    ways: list[str],
) -> None:
    plains = results["plain"]
    ref = plains[0]["outputs"]
    warm = {n: statistics.median(p["warm"][n] for p in plains) for n in MAKE}
    costs = {k: statistics.median(p["costs"][k] for p in plains) for k in plains[0]["costs"]}
    drive = statistics.median(drives)
    total_gb = sum(sizes.values()) / 1e9
    den_gb = sizes["denoiser"] / 1e9
    compute = sum(warm.values())
    floor = max(compute + den_gb * costs["reused"], total_gb / drive)
    # Nothing computes before the first model's weights are in: its read comes first, then its
    # compute with the second model's read beside it (at the irreducible cost), then the second
    # model's compute.
    llm_gb = sizes["llm"] / 1e9
    ordered = llm_gb / drive + max(warm["llm"] + den_gb * costs["reused"], den_gb / drive) + warm["denoiser"]
    rows = []
    for way in ways:
        totals = [r["times"]["total"] for r in results[way]]
        equal = all(
            torch.equal(r["outputs"]["ids"], ref["ids"]) and torch.equal(r["outputs"]["latents"], ref["latents"])
            for r in results[way]
        )
        rows.append(
            [way]
            + [f"{t:.2f}" for t in totals]
            + [
                f"{statistics.median(totals) / floor:.2f}x",
                f"{statistics.median(totals) / ordered:.2f}x",
                f"{statistics.median(r['cpu']['user'] for r in results[way]):.1f}",
                f"{statistics.median(r['cpu']['system'] for r in results[way]):.1f}",
                "yes" if equal else "**no**",
            ]
        )
    m = machine(next(iter(paths(args.dtype).values())))
    lines = [
        f"# Two-model chain, {args.dtype}, cold{'' if args.ram is None else f', the runners within ram={args.ram}'} "
        f"({m['date']})",
        "",
        f"Machine: {m['cpu']}, {m['nproc']} CPUs, {m['ram']}, kernel {m['kernel']}, {m['fs']}; "
        f"torch {m['torch']}; load after: {loadavg()}.",
        "",
        f"Files: language model {sizes['llm'] / 1e9:.2f} GB ({TOKENS} tokens), "
        f"transformer {den_gb:.2f} GB ({STEPS} steps). Drive (dd iflag=direct bs=8M, "
        f"before and after each round): {', '.join(f'{d:.2f}' for d in drives)} GB/s, median {drive:.2f}.",
        "",
        f"Warm compute: language model {warm['llm']:.2f} s, transformer {warm['denoiser']:.2f} s. "
        f"Reading the transformer's file beside the language model's compute costs it, per GB: "
        f"O_DIRECT into a reused buffer {costs['reused']:.2f} s, into fresh pages {costs['fresh']:.2f} s, "
        f"into pages faulted before the compute {costs.get('prefaulted', float('nan')):.2f} s, "
        f"through the page cache {costs['buffered']:.2f} s.",
        "",
        f"Floor: max({compute:.2f} s + {den_gb:.2f} GB x {costs['reused']:.2f} s/GB, "
        f"{total_gb:.2f} GB / {drive:.2f} GB/s) = {floor:.2f} s. With the models' order (the first one's "
        f"weights read before anything computes): {llm_gb:.2f} GB / {drive:.2f} GB/s + max({warm['llm']:.2f} s + "
        f"{den_gb:.2f} GB x {costs['reused']:.2f} s/GB, {den_gb:.2f} GB / {drive:.2f} GB/s) + {warm['denoiser']:.2f} s "
        f"= {ordered:.2f} s.",
        "",
        md_table(
            ["way"]
            + [f"round {i + 1} s" for i in range(args.rounds)]
            + ["median / floor", "median / floor with the order", "user s", "system s", "output = plain's"],
            rows,
        ),
    ]
    for way in ways:
        if "report" in results[way][-1]:
            lines += [
                "",
                f"`pipe.report()` of {way}, last round:",
                "",
                "```",
                results[way][-1]["report"].rstrip(),
                "```",
            ]
    text = "\n".join(lines) + "\n"
    print(text)
    suffix = "" if args.ram is None else f"-ram{args.ram}"
    (RESULTS / f"chain-{args.dtype}{suffix}.md").write_text(text)


if __name__ == "__main__":
    main()
