"""trash-panda against peer libraries on the same disk-offloaded model (not a test).

    PYTHONPATH=python .venv/bin/python bench/peers_disk.py [--passes 2]

The model and checkpoint of bench/forward_disk.py: 30 MLP blocks of 268 MB (8.05 GB bf16), CPU
compute, 64 tokens x 4096. Each system runs in its own subprocess (fresh RSS, nothing shared):

  trash-panda   stream_load with blocks 0-6 resident and 7-29 on the disk tier, install_offload
  accelerate    load_checkpoint_and_dispatch with the same split ("cpu" / "disk"), offload_folder
  diffusers     the model loaded, then apply_group_offloading(block_level, offload_to_disk_path):
                its group offloading keeps every block on disk, so its disk tier is all 30 blocks

For each: the load's seconds, bytes it wrote to disk and peak RSS rise; one warm-up pass, then
``--passes`` passes each made cold (posix_fadvise DONTNEED on the checkpoint and on every file the
system wrote), with the bytes the device really read (/proc/diskstats). Each system's floor is
max(compute, its disk-tier bytes / the drive's direct-read speed), with compute (every block
resident) and the drive (best of dd with one and two streams and plain O_DIRECT with 2 and 4 in
flight, over the whole file) measured in the same run. Outputs are compared with trash-panda's
all-resident output. Writes bench/results/peers_disk.md.
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import (
    DATA,
    RESULTS,
    build_meta,
    dd_direct,
    dd_direct_parallel,
    device_read_bytes,
    direct_read_speed,
    loadavg,
    machine,
    md_table,
    write_checkpoint,
)

N_BLOCKS, D, F, RESIDENT, TOKENS = 30, 4096, 16384, 7, 64
PATH = DATA / f"fwd_{N_BLOCKS}x{D}x{F}_bf16.safetensors"
WORK = DATA / "peers"
REF_OUT = WORK / "reference_output.pt"


def drop(paths: list[Path]) -> None:
    from trash_panda import _core

    for p in paths:
        if p.is_file():
            _core.drop_cache(p)
        elif p.is_dir():
            for f in p.rglob("*"):
                if f.is_file():
                    _core.drop_cache(f)


def written(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def inputs() -> torch.Tensor:
    return torch.randn(TOKENS, D, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)


def child(system: str, passes: int) -> dict[str, object]:
    """Runs one system in this process and returns its figures."""
    import trash_panda as tp
    from trash_panda import Plan, _core

    out_dir = WORK / system
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    prefixes = [f"blocks.{i}." for i in range(N_BLOCKS)]
    x = inputs()
    drop([PATH])
    sampler = _core.RssSampler(1)
    t0 = time.perf_counter()
    disk_blocks = N_BLOCKS - RESIDENT
    if system in ("compute", "trash-panda"):
        model = build_meta(N_BLOCKS, D, F, torch.bfloat16)
        resident = prefixes if system == "compute" else prefixes[:RESIDENT]
        plan = Plan.manual(resident=resident, streamed=[p for p in prefixes if p not in resident], streamed_tier="disk")
        tp.stream_load(model, PATH, plan=plan, device="cpu")
        tp.install_offload(model)
    elif system == "accelerate":
        from _common import Net
        from accelerate import init_empty_weights, load_checkpoint_and_dispatch

        with init_empty_weights():
            model = Net(N_BLOCKS, D, F).to(torch.bfloat16).eval()
        device_map = {f"blocks.{i}": ("cpu" if i < RESIDENT else "disk") for i in range(N_BLOCKS)}
        device_map["norm_out"] = "cpu"
        model = load_checkpoint_and_dispatch(
            model, str(PATH), device_map=device_map, offload_folder=str(out_dir), dtype=torch.bfloat16
        )
    elif system == "diffusers":
        from diffusers.hooks import apply_group_offloading
        from safetensors.torch import load_file

        model = build_meta(N_BLOCKS, D, F, torch.bfloat16)
        model.load_state_dict(load_file(str(PATH)), assign=True)
        apply_group_offloading(
            model,
            onload_device=torch.device("cpu"),
            offload_device=torch.device("cpu"),
            offload_type="block_level",
            num_blocks_per_group=1,
            offload_to_disk_path=str(out_dir),
        )
        disk_blocks = N_BLOCKS
    else:
        raise SystemExit(f"unknown system {system}")
    load_s = time.perf_counter() - t0
    _start, peak, _end = sampler.stop()
    rise = peak - _start
    res: dict[str, object] = {
        "system": system,
        "load_s": load_s,
        "written": written(out_dir),
        "rss_rise": rise,
        "disk_blocks": disk_blocks,
    }
    with torch.inference_mode():
        first = model(x)  # warm-up (and, for a peer, its first read of the offloaded weights)
        secs, device = [], []
        for _ in range(passes if system != "compute" else 3):
            drop([PATH, out_dir])
            d0 = device_read_bytes(PATH)
            t = time.perf_counter()
            out = model(x)
            secs.append(time.perf_counter() - t)
            device.append(device_read_bytes(PATH) - d0)
    res["passes"] = secs
    res["device"] = device
    if system == "compute":
        torch.save(first, REF_OUT)
        res["same"] = True
    else:
        ref = torch.load(REF_OUT)
        res["same"] = bool(torch.equal(out, ref)) and bool(torch.equal(first, ref))
        res["max_diff"] = float((out.float() - ref.float()).abs().max())
    shutil.rmtree(out_dir, ignore_errors=True)
    return res


def run(system: str, passes: int) -> dict[str, Any]:
    """The child's result, as JSON gives it back (or why it failed)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).resolve().parent.parent / "python"), os.environ.get("PYTHONPATH", "")]
        ),
    }
    r = subprocess.run(
        [sys.executable, __file__, "--child", system, "--passes", str(passes)], capture_output=True, text=True, env=env
    )
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:], file=sys.stderr)
        return {"system": system, "error": (r.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def drive() -> dict[str, float]:
    from trash_panda import _core

    size = PATH.stat().st_size
    speeds = {}
    for name, fn in (
        ("dd, one stream", lambda: dd_direct(PATH, 0, size)),
        ("dd, two streams", lambda: dd_direct_parallel(PATH, 0, size, jobs=2)),
        ("O_DIRECT, 2 in flight", lambda: direct_read_speed(PATH, 0, size, threads=2)),
        ("O_DIRECT, 4 in flight", lambda: direct_read_speed(PATH, 0, size, threads=4)),
    ):
        _core.drop_cache(PATH)
        speeds[name] = fn()
    return speeds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--passes", type=int, default=2)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.passes)))
        return
    WORK.mkdir(parents=True, exist_ok=True)
    write_checkpoint(PATH, build_meta(N_BLOCKS, D, F, torch.bfloat16), torch.bfloat16)
    block_bytes = 2 * D * F * 2 + 2 * D * 2
    speeds = [drive()]
    print("drive (before):", {k: round(v, 2) for k, v in speeds[0].items()}, flush=True)
    results = {}
    for system in ("compute", "trash-panda", "accelerate", "diffusers"):
        results[system] = r = run(system, args.passes)
        print(system, r, f"load {loadavg()}", flush=True)
    speeds.append(drive())
    print("drive (after):", {k: round(v, 2) for k, v in speeds[1].items()}, flush=True)
    best = statistics.mean(max(s.values()) for s in speeds)
    compute = statistics.median(results["compute"]["passes"])
    rows = []
    for system in ("trash-panda", "accelerate", "diffusers"):
        r = results[system]
        if "error" in r:
            rows.append([system, "failed: " + str(r["error"])[:80]] + [""] * 8)
            continue
        disk_bytes = int(r["disk_blocks"]) * block_bytes
        floor = max(compute, disk_bytes / (best * 1e9))
        secs = r["passes"]
        med = statistics.median(secs)
        dev = statistics.median(r["device"]) / 1e9
        rows.append(
            [
                system,
                f"{r['load_s']:.1f}",
                f"{int(r['written']) / 1e9:.2f}",
                f"{int(r['rss_rise']) / 1e9:.2f}",
                f"{disk_bytes / 1e9:.2f}",
                " / ".join(f"{s:.2f}" for s in secs),
                f"{dev:.2f} ({dev / med:.2f} GB/s)",
                f"{floor:.2f}",
                f"{med / floor:.2f}",
                "yes" if r["same"] else f"no (max diff {r.get('max_diff')})",
            ]
        )
    header = [
        "system",
        "load s",
        "written GB",
        "load peak RSS rise GB",
        "disk-tier GB",
        "cold pass s (each)",
        "device read a pass GB",
        "floor s",
        "pass / floor",
        "output equal",
    ]
    table = md_table(header, rows)
    print(table)
    mach = machine(PATH)
    md = [
        "# trash-panda against peer libraries, same model, disk offload (`bench/peers_disk.py`)",
        "",
        f"- date: {mach['date']}; machine: nproc {mach['nproc']} ({mach['cpu']}), {mach['ram']} RAM, kernel "
        f"{mach['kernel']}, {mach['fs']}, torch {mach['torch']}",
        f"- model: {N_BLOCKS} MLP blocks of {block_bytes / 1e6:.0f} MB bf16 "
        f"({PATH.stat().st_size / 1e9:.2f} GB file), CPU compute, input {TOKENS} x {D}; "
        f"blocks 0-{RESIDENT - 1} in memory, the rest on disk (diffusers: all on disk)",
        "- drive over the whole file, best of dd (1 and 2 streams) and O_DIRECT (2 and 4 in flight): "
        + "; ".join(", ".join(f"{k} {v:.2f}" for k, v in s.items()) for s in speeds)
        + f" GB/s; mean of the best {best:.2f} GB/s",
        f"- compute, every block resident: {' / '.join(f'{s:.2f}' for s in results['compute']['passes'])} s "
        f"(median {compute:.2f} s)",
        "- each system in its own subprocess; the load is timed from the model built on meta (diffusers: "
        "the plain load of the file included, as its group offloading starts from a loaded model); "
        "one warm-up pass, then passes made cold (page cache of the checkpoint and of every file the "
        "system wrote dropped); device bytes from /proc/diskstats",
        "",
        table,
        "",
    ]
    (RESULTS / "peers_disk.md").write_text("\n".join(md))
    print(f"wrote {RESULTS / 'peers_disk.md'}")


if __name__ == "__main__":
    main()
