"""trash-panda against the libraries people use today, on the demo's 6 GB Llama (not a test).

    PYTHONPATH=python .venv/bin/python bench/peers/run.py [--resident 12] [--tokens 16]

The model of `make demo` (examples/demo_model.py: a transformers Llama of 30 layers, 6.07 GB
bf16, random weights, 6 shards). Every system keeps layers 0..resident-1 and the weights outside
the layers in memory and the other layers on disk (diffusers' group offloading cannot leave some
blocks alone: all its blocks are offloaded). One pass is a forward of the same prompt of
``--tokens`` tokens, on the CPU. Each system runs in its own subprocess:

  plain          transformers from_pretrained, everything in RAM: the compute floor
  trash-panda    trash_panda.from_pretrained with that plan (resident / disk tier)
  trash-panda-overlap  the same with overlap=True: the call returns once the model is planned
                 and hooked, and a worker thread reads the resident layers while the first
                 pass starts (transformers' device_map load likewise leaves them to the pass)
  transformers   from_pretrained(device_map=..., offload_folder=...) with those layers on "disk"
  accelerate     init_empty_weights + load_checkpoint_and_dispatch, the same device map
  diffusers-disk the plain load, then apply_group_offloading(block_level, offload_to_disk_path)
  diffusers-ram  the same, offloaded in RAM (no path)

For each: load seconds, bytes the load wrote (its offload folder), a first pass cold (the page
cache of the checkpoint and of every file the system wrote dropped, and checked with mincore),
two more cold passes, the median of three warm passes, the peak RSS of the process, and whether
its logits equal the plain model's. The physical floor is the disk-tier bytes over the drive's
direct-read speed, measured in the same run (before and after the systems). Writes
bench/results/peers.json; bench/peers/report.py turns it into the table and the pictures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "examples")]

import demo_model  # noqa: E402
import torch  # noqa: E402
from _common import device_read_bytes, direct_read_speed, loadavg, machine  # noqa: E402

FOLDER = demo_model.DEFAULT
WORK = ROOT / "target" / "bench-data" / "peers-llama"
RESULTS = ROOT / "bench" / "results"
SYSTEMS = [
    "plain",
    "trash-panda",
    "trash-panda-overlap",
    "transformers",
    "accelerate",
    "diffusers-disk",
    "diffusers-ram",
]
LAYERS = 30


def shards() -> list[Path]:
    return sorted(FOLDER.glob("model-*.safetensors"))


def files_under(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            out += [f for f in p.rglob("*") if f.is_file()]
    return out


def drop(paths: list[Path]) -> int:
    """Drops the files' pages from the page cache; returns the bytes still cached after."""
    from trash_panda import _core

    files = files_under(paths)
    for f in files:
        _core.drop_cache(f)
    return sum(_core.cached_bytes(f) for f in files)


def device_map(resident: int) -> dict[str, str]:
    dm = {"model.embed_tokens": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    dm.update({f"model.layers.{i}": ("cpu" if i < resident else "disk") for i in range(LAYERS)})
    return dm


def prompt_ids(tokens: int) -> torch.Tensor:
    return torch.randint(4, 1000, (1, tokens), generator=torch.Generator().manual_seed(0))


def build(system: str, resident: int, out_dir: Path) -> torch.nn.Module:
    """The system's model, loaded its own way."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if system == "plain":
        return AutoModelForCausalLM.from_pretrained(FOLDER, dtype=torch.bfloat16)
    if system in ("trash-panda", "trash-panda-overlap"):
        import trash_panda as tp

        names = [f"model.layers.{i}." for i in range(LAYERS)]
        plan = tp.Plan.manual(resident=names[:resident], streamed=names[resident:], streamed_tier="disk")
        overlap = system == "trash-panda-overlap"
        return tp.from_pretrained(AutoModelForCausalLM, FOLDER, device="cpu", plan=plan, overlap=overlap)
    if system == "transformers":
        return AutoModelForCausalLM.from_pretrained(
            FOLDER, dtype=torch.bfloat16, device_map=device_map(resident), offload_folder=str(out_dir)
        )
    if system == "accelerate":
        from accelerate import init_empty_weights, load_checkpoint_and_dispatch

        with init_empty_weights():
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(FOLDER), dtype=torch.bfloat16)
        return load_checkpoint_and_dispatch(
            model, str(FOLDER), device_map=device_map(resident), offload_folder=str(out_dir), dtype=torch.bfloat16
        )
    if system.startswith("diffusers"):
        from diffusers.hooks import apply_group_offloading

        model = AutoModelForCausalLM.from_pretrained(FOLDER, dtype=torch.bfloat16)
        apply_group_offloading(
            model,
            onload_device=torch.device("cpu"),
            offload_device=torch.device("cpu"),
            offload_type="block_level",
            num_blocks_per_group=1,
            offload_to_disk_path=str(out_dir) if system == "diffusers-disk" else None,
        )
        return model
    raise SystemExit(f"unknown system {system!r}: expected one of {', '.join(SYSTEMS)}")


def child(system: str, resident: int, tokens: int) -> dict[str, object]:
    """Runs one system in this process and returns its figures."""
    from trash_panda import _core

    out_dir = WORK / system
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    ids = prompt_ids(tokens)
    files = [*shards(), out_dir]
    res: dict[str, object] = {"system": system, "cached_before_load": drop(shards())}
    sampler = _core.RssSampler(1)
    d0 = device_read_bytes(FOLDER)
    t0 = time.perf_counter()
    model = build(system, resident, out_dir).eval()
    res["load_s"] = time.perf_counter() - t0
    res["load_read"] = device_read_bytes(FOLDER) - d0
    res["written"] = sum(f.stat().st_size for f in files_under([out_dir]))
    trace = os.environ.get("TRASH_PANDA_LOG")

    def run_pass() -> tuple[float, torch.Tensor]:
        t = time.perf_counter()
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits
        return time.perf_counter() - t, logits

    cold, cold_read, cached = [], [], []
    for _ in range(3):
        cached.append(drop(files))
        d0 = device_read_bytes(FOLDER)
        secs, logits = run_pass()
        cold.append(secs)
        cold_read.append(device_read_bytes(FOLDER) - d0)
    warm = [run_pass()[0] for _ in range(3)]
    _start, peak, _end = sampler.stop()
    res.update(cold=cold, cold_read=cold_read, cached_at_cold_start=cached, warm=warm, peak_rss=peak)
    ref = WORK / "plain_logits.pt"
    if system == "plain":
        torch.save(logits, ref)
        res["equal"] = True
    else:
        want = torch.load(ref)
        res["equal"] = bool(torch.equal(logits, want))
        res["max_diff"] = float((logits.float() - want.float()).abs().max())
    if system.startswith("trash-panda"):
        import trash_panda as tp

        tp.release(model)  # with TRASH_PANDA_PROFILE=1 and TRASH_PANDA_LOG, writes the trace
        res["trace"] = (trace + ".trace.json") if trace else None
    shutil.rmtree(out_dir, ignore_errors=True)
    return res


def run_child(system: str, resident: int, tokens: int) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "python"), os.environ.get("PYTHONPATH", "")])}
    if system == "trash-panda":
        env.update(TRASH_PANDA_PROFILE="1", TRASH_PANDA_LOG=str(WORK / "trash-panda-run.jsonl"))
    cmd = [sys.executable, __file__, "--child", system, "--resident", str(resident), "--tokens", str(tokens)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        tail = [line for line in r.stderr.strip().splitlines() if line.strip()]
        print(r.stderr[-4000:], file=sys.stderr)
        return {"system": system, "error": tail[-1] if tail else f"exit code {r.returncode}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def drive_speed(disk_files: list[tuple[Path, int, int]]) -> float:
    """GB/s of O_DIRECT reads (4 in flight) of the disk tier's byte ranges: the physical floor's rate."""
    total, seconds = 0, 0.0
    for path, start, length in disk_files:
        t = time.perf_counter()
        speed = direct_read_speed(path, start, length, threads=4)
        seconds += time.perf_counter() - t
        total += length
        del speed
    return total / seconds / 1e9


def disk_ranges(resident: int) -> list[tuple[Path, int, int]]:
    """(file, start, length) of the layers on disk, 4096-aligned, merged per file (a span may
    take in a resident layer's tensor: this only measures the drive's rate on the same files)."""
    from trash_panda import Checkpoint

    ckpt = Checkpoint(FOLDER / "model.safetensors.index.json")
    spans: dict[str, list[int]] = {}
    for t in ckpt.tensors():
        if t.name.startswith("model.layers.") and int(t.name.split(".")[2]) >= resident:
            lo, hi = spans.get(str(t.file), [t.start, t.end])
            spans[str(t.file)] = [min(lo, t.start), max(hi, t.end)]
    return [(Path(f), lo - lo % 4096, (hi - lo + lo % 4096) // 4096 * 4096) for f, (lo, hi) in spans.items()]


def _disk_tier_bytes(resident: int) -> int:
    from trash_panda import Checkpoint

    ckpt = Checkpoint(FOLDER / "model.safetensors.index.json")
    return sum(
        t.nbytes for t in ckpt.tensors() if t.name.startswith("model.layers.") and int(t.name.split(".")[2]) >= resident
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--resident", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.resident, args.tokens)))
        return
    demo_model.create()
    WORK.mkdir(parents=True, exist_ok=True)
    ranges = disk_ranges(args.resident)
    disk_bytes = _disk_tier_bytes(args.resident)
    speeds = [drive_speed(ranges)]
    print(f"drive {speeds[0]:.2f} GB/s over the disk tier's {disk_bytes / 1e9:.2f} GB; load {loadavg()}", flush=True)
    results = []
    for system in args.systems.split(","):
        r = run_child(system, args.resident, args.tokens)
        r["loadavg"] = loadavg()
        results.append(r)
        print(json.dumps(r), flush=True)
    speeds.append(drive_speed(ranges))
    print(f"drive after: {speeds[1]:.2f} GB/s; load {loadavg()}", flush=True)
    out = {
        "machine": machine(FOLDER),
        "versions": _versions(),
        "resident": args.resident,
        "tokens": args.tokens,
        "layers": LAYERS,
        "disk_bytes": disk_bytes,
        "drive_gbps": speeds,
        "physical_floor_s": disk_bytes / (statistics.mean(speeds) * 1e9),
        "results": results,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "peers.json").write_text(json.dumps(out, indent=1))
    print(f"wrote {RESULTS / 'peers.json'}")


def _versions() -> dict[str, str]:
    import accelerate
    import diffusers
    import transformers

    import trash_panda

    return {
        "trash_panda": trash_panda.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
        "diffusers": diffusers.__version__,
    }


if __name__ == "__main__":
    main()
