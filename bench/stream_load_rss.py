"""Peak RSS and speed of stream_load against a plain safetensors load (not a test).

    PYTHONPATH=python .venv/bin/python bench/stream_load_rss.py [--rounds 2] [--blocks 24]

Generates (once; reused when the layout matches) a ~6.4 GB bf16 checkpoint of 24 pre-norm MLP
blocks (d 4096, ffn 16384) under target/bench-data/, then loads it in separate subprocesses, each
with a fresh RSS and with the file's pages dropped from the page cache first (cold):

  ref      model built normally on the CPU (bf16, default init), then
           model.load_state_dict(safetensors.torch.load_file(path))
  tp-all   model on meta, trash_panda.stream_load with every block resident (CPU device)
  tp-half  model on meta, the first half of the blocks resident, the rest on the disk tier

RssSampler(1 ms) brackets the load call only. The bound checked for trash-panda is
peak - start <= resident bytes + largest tensor + 256 MB (+ the engine's staging pool when
blocks are streamed, reported separately). Writes bench/results/stream_load_rss.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import DATA, RESULTS, Block, build_meta, loadavg, machine, md_table, write_checkpoint

D, F = 4096, 16384
SLACK = 256 << 20


def child(mode: str, path: str, blocks: int) -> None:
    from trash_panda import Plan, _core, stream_load

    out: dict[str, object] = {"mode": mode}
    if mode == "ref":
        from _common import Net
        from safetensors.torch import load_file

        base = _core.current_rss()
        t = time.perf_counter()
        torch.set_default_dtype(torch.bfloat16)
        model = Net(blocks, D, F).eval()
        torch.set_default_dtype(torch.float32)
        out["build_s"] = time.perf_counter() - t
        _core.drop_cache(path)
        out["cached_before"] = _core.cached_bytes(path)
        s = _core.RssSampler(1)
        t = time.perf_counter()
        sd = load_file(path)
        model.load_state_dict(sd)
        out["seconds"] = time.perf_counter() - t
        start, peak, end = s.stop()
        del sd
        out["rss_with_model"] = start
        start = base  # the rise counts the model too: what it takes to end with a loaded model
        out["resident_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    else:
        model = build_meta(blocks, D, F, torch.bfloat16)
        prefixes = [f"blocks.{i}." for i in range(blocks)]
        keep = blocks if mode == "tp-all" else blocks // 2
        plan = Plan.manual(resident=prefixes[:keep], streamed=prefixes[keep:], streamed_tier="disk")
        _core.drop_cache(path)
        out["cached_before"] = _core.cached_bytes(path)
        s = _core.RssSampler(1)
        t = time.perf_counter()
        report = stream_load(model, path, plan=plan, device="cpu")
        out["seconds"] = time.perf_counter() - t
        start, peak, end = s.stop()
        out["report"] = str(report)
        out["staging_bytes"] = int(report.staging_bytes or 0)
        out["resident_bytes"] = int(report.device_tier.bytes + report.outside.bytes)
        out["streamed_bytes"] = int(report.disk.bytes + report.ram.bytes)
        first = model.blocks[0]
        assert isinstance(first, Block)
        out["checksum_ok"] = bool(torch.isfinite(first.up.weight[:4].float()).all())
    out.update(start=start, peak=peak, end=end)
    print("RESULT " + json.dumps(out))


def warm_memory(nbytes: float) -> None:
    """Touches and frees ``nbytes`` in a throwaway process before each load. In a VM, memory the
    guest has never touched is slow to fault in (the host backs it on first use); without this the
    load that runs first pays for it and the ones after do not, which skews the comparison."""
    code = f"import torch; t = torch.ones({int(nbytes)}, dtype=torch.uint8); assert int(t[-1]) == 1"
    subprocess.run([sys.executable, "-c", code], check=True)


def run_child(mode: str, path: Path, blocks: int) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--path", str(path), "--blocks", str(blocks)]
    la = loadavg()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{mode} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))
    res = json.loads(line[len("RESULT ") :])
    res["load_before"] = la
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--path")
    ap.add_argument("--blocks", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.path, args.blocks)
        return

    path = DATA / f"rss_{args.blocks}x{D}x{F}_bf16.safetensors"
    t = time.perf_counter()
    size = write_checkpoint(path, build_meta(args.blocks, D, F, torch.bfloat16), torch.bfloat16)
    gen_s = time.perf_counter() - t
    largest = D * F * 2
    print(
        f"checkpoint {path} {size / 1e9:.2f} GB (generated or checked in {gen_s:.1f} s), "
        f"largest tensor {largest / 1e6:.0f} MB"
    )
    modes = ["tp-all", "ref", "tp-half"]
    results: dict[str, list[dict]] = {m: [] for m in modes}
    for rnd in range(args.rounds):
        for m in modes:
            warm_memory(2.2 * size)
            r = run_child(m, path, args.blocks)
            results[m].append(r)
            print(
                f"round {rnd} {m:8s} {r['seconds']:6.2f} s  {size / r['seconds'] / 1e9:5.2f} GB/s  "
                f"rss start {r['start'] / 1e9:.2f} peak {r['peak'] / 1e9:.2f} end {r['end'] / 1e9:.2f} GB "
                f"(rise {(r['peak'] - r['start']) / 1e9:.2f})  cached before {r['cached_before']}  "
                f"load {r['load_before']}",
                flush=True,
            )

    rows = []
    verdicts = []
    ref_s = statistics.median(r["seconds"] for r in results["ref"])
    ref_rise = max(r["peak"] - r["start"] for r in results["ref"])
    for m in modes:
        rs = results[m]
        rise = max(r["peak"] - r["start"] for r in rs)
        peak = max(r["peak"] for r in rs)
        secs = statistics.median(r["seconds"] for r in rs)
        read = size if m != "tp-half" else size - rs[0].get("streamed_bytes", 0)
        resident = rs[0]["resident_bytes"]
        if m == "ref":
            bound = verdict = "-"
        else:
            staging = rs[0].get("staging_bytes", 0)
            b = resident + largest + SLACK + staging
            ok = rise <= b
            bound = f"{b / 1e9:.2f}" + (f" (incl. staging {staging / 1e9:.2f})" if staging else "")
            verdict = "PASS" if ok else f"FAIL (+{(rise - b) / 1e9:.2f} GB)"
            verdicts.append((m, verdict))
        rows.append(
            [
                m,
                f"{resident / 1e9:.2f}",
                f"{max(r['start'] for r in rs) / 1e9:.2f}",
                f"{peak / 1e9:.2f}",
                f"{rise / 1e9:.2f}",
                f"{rise / ref_rise:.2f}",
                bound,
                verdict,
                " / ".join(f"{r['seconds']:.2f}" for r in rs),
                f"{read / secs / 1e9:.2f}",
                f"{secs / ref_s:.2f}",
            ]
        )
    header = [
        "load",
        "resident GB",
        "RSS start GB",
        "RSS peak GB",
        "peak - start GB",
        "rise / ref",
        "bound GB",
        "within bound",
        "seconds (each round)",
        "GB/s (median)",
        "time / ref",
    ]
    table = md_table(header, rows)
    print(table)
    for m, v in verdicts:
        print(f"{m}: {v}")

    mach = machine(path)
    md = [
        "# stream_load peak RSS (`bench/stream_load_rss.py`)",
        "",
        f"- date: {mach['date']}",
        f"- machine: nproc {mach['nproc']} ({mach['cpu']}), {mach['ram']} RAM, kernel {mach['kernel']}, "
        f"{mach['fs']}, torch {mach['torch']} ({mach['torch_threads']} threads)",
        "- load average before each child: " + ", ".join(f"{m} {r['load_before']}" for m in modes for r in results[m]),
        f"- checkpoint: {size / 1e9:.2f} GB bf16 safetensors, {args.blocks} blocks of LayerNorm + Linear({D},{F}) + "
        f"Linear({F},{D}), no bias; largest tensor {largest / 1e6:.0f} MB; generated tensor by tensor",
        "- before each load a throwaway process touches and frees 2.2x the file's size, so no load pays for "
        "the VM backing fresh guest memory on first touch (the first load of a round did, before)",
        f"- {args.rounds} rounds; each load in its own subprocess (fresh RSS), the file's pages dropped "
        "(posix_fadvise DONTNEED) before the load (cold), RssSampler at 1 ms around the load call only",
        "- ref = model built normally on the CPU in bf16 (default init, outside the window), then "
        "`model.load_state_dict(safetensors.torch.load_file(path))`",
        "- tp-all = model on meta, `stream_load(plan=Plan.manual(resident=all blocks))` on the CPU device; "
        f"tp-half = the first {args.blocks // 2} blocks resident, the rest on the disk tier (the engine's staging "
        "pool is added to its bound)",
        "- bound = resident bytes + largest tensor + 256 MB, compared with peak - start (the start is the "
        "interpreter with torch imported, before any model exists: for ref it is taken before the model is "
        "built, so its rise counts the model plus the state dict)",
        "- GB/s = bytes read during the load (resident + outside) / median seconds",
        "",
        table,
        "",
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "stream_load_rss.md").write_text("\n".join(md))
    print(f"wrote {RESULTS / 'stream_load_rss.md'}")


if __name__ == "__main__":
    main()
