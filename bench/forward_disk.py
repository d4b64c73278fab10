"""An offloaded forward pass with most blocks on the disk tier, against its floor (not a test).

    PYTHONPATH=python .venv/bin/python bench/forward_disk.py [--tokens 64] [--passes 2]

Model: 30 pre-norm MLP blocks (d 4096, ffn 16384, bf16; 268 MB a block, 8.05 GB in all),
generated once under target/bench-data/. Plan (CPU compute, a 2 GB device budget): the first 7
blocks resident (1.88 GB), the other 23 on the disk tier (6.17 GB), written with Plan.manual.

Measured in the same run:
  (i)   the drive's direct-read speed over the disk tier's byte range (one contiguous range), before
        and after the offloaded passes: dd iflag=direct bs=8M as one stream and as two at once, and
        plain O_DIRECT reads with 2 and 4 requests in flight; the best, averaged over before and
        after, is the drive speed
  (ii)  compute: a pass of the same model with every block resident (stream_load, all resident),
        median of 3 after a warm-up
  (iii) for each lookahead 1/2/4 x workers 1/2 x disk_mode direct/buffered: stream_load, install_offload,
        one warm-up pass, then ``--passes`` passes each after drop_cache(path) (cached bytes checked):
        pass time, the main thread's wait for staged blocks (sum of Timing.staged_wait from h.runs,
        and the engine's compute_waited_seconds), the disk bytes read during the pass, and the
        ratio to the floor max(compute, disk-tier bytes / dd speed).
Writes bench/results/forward_disk.md.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

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

from trash_panda import _core

N_BLOCKS, D, F = 30, 4096, 16384
RESIDENT = 7


def disk_range(path: Path, first: int) -> tuple[int, int]:
    from trash_panda import Checkpoint

    ck = Checkpoint(path)
    infos = [i for i in ck.tensors() if i.name.startswith("blocks.") and int(i.name.split(".")[1]) >= first]
    return min(i.start for i in infos), max(i.end for i in infos)


class BlockClock:
    """Forward pre/post hooks registered after the offload hooks: the pre-hook runs once the block's
    weights are in place, so post - pre is the block's compute alone."""

    def __init__(self, blocks) -> None:
        self.marks: list[tuple[int, float, float]] = []
        self.handles = []
        for i, b in enumerate(blocks):
            self.handles.append(b.register_forward_pre_hook(lambda _m, _a, i=i: self._pre(i)))
            self.handles.append(b.register_forward_hook(lambda _m, _a, _o, i=i: self._post(i)))
        self._t = 0.0

    # The clock the offload hooks time their runs with (handle.runs), so marks and runs compare.
    def _pre(self, i: int) -> None:
        self._t = _core.clock()

    def _post(self, i: int) -> None:
        self.marks.append((i, self._t, _core.clock()))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


DRIVE_LOG: list[tuple[str, dict[str, float]]] = []


def _drive(path: Path, start: int, length: int, when: str) -> float:
    """The drive's direct-read speed over the disk tier's range: the best of dd (one and two
    streams) and plain O_DIRECT reads with 2 and 4 requests in flight, so the floor is as strict
    as the drive allows."""
    speeds = {}
    for name, fn in (
        ("dd, one stream", lambda: dd_direct(path, start, length)),
        ("dd, two streams", lambda: dd_direct_parallel(path, start, length, jobs=2)),
        ("O_DIRECT, 2 in flight", lambda: direct_read_speed(path, start, length, threads=2)),
        ("O_DIRECT, 4 in flight", lambda: direct_read_speed(path, start, length, threads=4)),
    ):
        _core.drop_cache(path)
        speeds[name] = fn()
    print(
        f"drive ({when}): " + ", ".join(f"{k} {v:.2f} GB/s" for k, v in speeds.items()) + f"  load {loadavg()}",
        flush=True,
    )
    DRIVE_LOG.append((when, speeds))
    return max(speeds.values())


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main() -> None:
    import trash_panda as tp
    from trash_panda import Plan

    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--lookaheads", default="1,2,4")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--modes", default="direct,buffered")
    args = ap.parse_args()

    path = DATA / f"fwd_{N_BLOCKS}x{D}x{F}_bf16.safetensors"
    size, gen_s = timed(
        lambda: write_checkpoint(path, build_meta(N_BLOCKS, D, F, torch.bfloat16), torch.bfloat16, seed=1)
    )
    start, end = disk_range(path, RESIDENT)
    disk_bytes = end - start
    block_bytes = 2 * D * F * 2 + 2 * D * 2
    print(
        f"checkpoint {path}: {size / 1e9:.2f} GB ({gen_s:.1f} s); disk tier blocks {RESIDENT}..{N_BLOCKS - 1}: "
        f"{disk_bytes / 1e9:.2f} GB at [{start}, {end})",
        flush=True,
    )
    x = torch.randn(args.tokens, D, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    prefixes = [f"blocks.{i}." for i in range(N_BLOCKS)]

    # (i) the drive, before
    dd = [_drive(path, start, disk_bytes, "before")]

    # (ii) compute with every block resident
    model = build_meta(N_BLOCKS, D, F, torch.bfloat16)
    tp.stream_load(model, path, plan=Plan.manual(resident=prefixes, streamed=[]), device="cpu")
    with torch.inference_mode():
        ref, _ = timed(lambda model=model: model(x))
        per_block = []
        blk_x = x
        for b in model.blocks[:4]:
            _, s = timed(lambda b=b: b(blk_x))
            per_block.append(s)
        passes = [timed(lambda model=model: model(x))[1] for _ in range(3)]
        clock = BlockClock(model.blocks)
        model(x)
        clock.remove()
    compute = statistics.median(passes)
    ref_res = sum(e - s for i, s, e in clock.marks if i < RESIDENT)
    ref_str = sum(e - s for i, s, e in clock.marks if i >= RESIDENT)
    print(
        f"all resident, compute by block group: blocks 0-{RESIDENT - 1} {ref_res:.2f} s, blocks "
        f"{RESIDENT}-{N_BLOCKS - 1} {ref_str:.2f} s",
        flush=True,
    )
    compute_block = compute / N_BLOCKS
    print(
        f"compute, all resident: {' / '.join(f'{p:.2f}' for p in passes)} s a pass -> {compute:.2f} s "
        f"({compute_block * 1e3:.0f} ms a block, {2 * args.tokens * 2 * D * F / compute_block / 1e9:.0f} GFLOP/s); "
        f"read of a block at dd speed {block_bytes / dd[0] / 1e6:.0f} ms  load {loadavg()}",
        flush=True,
    )
    del model
    gc.collect()
    _core.trim_heap()

    rows = []
    results = []
    for la in [int(v) for v in args.lookaheads.split(",")]:
        for wk in [int(v) for v in args.workers.split(",")]:
            for mode in args.modes.split(","):
                os.environ["TRASH_PANDA_LOOKAHEAD"] = str(la)
                os.environ["TRASH_PANDA_WORKERS"] = str(wk)
                os.environ["TRASH_PANDA_DISK_MODE"] = mode
                model = build_meta(N_BLOCKS, D, F, torch.bfloat16)
                plan = Plan.manual(resident=prefixes[:RESIDENT], streamed=prefixes[RESIDENT:], streamed_tier="disk")
                report = tp.stream_load(model, path, plan=plan, device="cpu")
                h = tp.install_offload(model)
                clock = BlockClock(model.blocks)
                with torch.inference_mode():
                    model(x)  # warm-up
                    for k in range(args.passes):
                        _core.drop_cache(path)
                        cached = _core.cached_bytes(path)
                        la_before = loadavg()
                        s0 = h.stats()
                        r0 = len(h.runs)
                        m0 = len(clock.marks)
                        dev0 = device_read_bytes(path)
                        out, secs = timed(lambda model=model: model(x))
                        device = device_read_bytes(path) - dev0
                        s1 = h.stats()
                        assert s0 is not None and s1 is not None  # streamed blocks: the model has an engine
                        # The streamed blocks' runs (the resident ones are recorded too).
                        runs = [r for r in h.runs[r0:] if r[0] >= RESIDENT]
                        marks = clock.marks[m0:]
                        c_res = sum(e - a for i, a, e in marks if i < RESIDENT)
                        c_str = sum(e - a for i, a, e in marks if i >= RESIDENT)
                        pre = {i: a for i, a, _e in marks}
                        bring = sum(pre[i] - a - t.staged_wait for i, a, _b, t in runs if i in pre)
                        staged_wait = sum(t.staged_wait for _i, _a, _b, t in runs)
                        engine_wait = s1.compute_waited_seconds - s0.compute_waited_seconds
                        read = s1.disk_bytes - s0.disk_bytes
                        misses = s1.misses - s0.misses
                        waits = sorted(((t.staged_wait, i) for i, _a, _b, t in runs), reverse=True)[:3]
                        busy = sum((b - a) - t.staged_wait for _i, a, b, t in runs)
                        floor = max(compute, disk_bytes / (dd[0] * 1e9))
                        same = torch.equal(out, ref)
                        res = dict(
                            la=la,
                            wk=wk,
                            mode=mode,
                            k=k,
                            secs=secs,
                            staged_wait=staged_wait,
                            engine_wait=engine_wait,
                            read=read,
                            misses=misses,
                            cached=cached,
                            waits=waits,
                            busy=busy,
                            floor=floor,
                            c_res=c_res,
                            c_str=c_str,
                            bring=bring,
                            same=same,
                            load=la_before,
                            first=runs[0][3].staged_wait if runs else 0.0,
                            disk_mode=report.disk_mode,
                            device=device,
                        )
                        results.append(res)
                        print(
                            f"la {la} workers {wk} {mode:8s} pass {k}: {secs:.2f} s, waited {staged_wait:.2f} s "
                            f"({staged_wait / secs:.0%}; engine {engine_wait:.2f}), device read {device / 1e9:.2f} GB "
                            f"({device / secs / 1e9:.2f} GB/s), first disk block waited "
                            f"{res['first']:.2f} s, read {read / 1e9:.2f} GB, misses {misses}, cached before {cached}, "
                            f"hooked blocks busy {busy:.2f} s (compute {c_str:.2f}, copy-in {bring:.2f}), "
                            f"resident blocks {c_res:.2f} s, ratio to floor {secs / floor:.2f}, "
                            f"top waits {[(i, round(w, 2)) for w, i in waits]}, same output {same}, load {la_before}",
                            flush=True,
                        )
                clock.remove()
                tp.release(model, h)
                del model, h
                gc.collect()
                _core.trim_heap()

    # (i) the drive, after
    dd.append(_drive(path, start, disk_bytes, "after"))
    drive = statistics.mean(dd)
    io_floor = disk_bytes / (drive * 1e9)
    floor = max(compute, io_floor)
    for la in sorted({r["la"] for r in results}):
        for wk in sorted({r["wk"] for r in results}):
            for mode in args.modes.split(","):
                rs = [r for r in results if r["la"] == la and r["wk"] == wk and r["mode"] == mode]
                if not rs:
                    continue
                secs = statistics.median(r["secs"] for r in rs)
                best = min(r["secs"] for r in rs)
                wait = statistics.median(r["staged_wait"] for r in rs)
                ratio = secs / floor
                rows.append(
                    [
                        f"{la}",
                        f"{wk}",
                        mode,
                        " / ".join(f"{r['secs']:.2f}" for r in rs),
                        f"{wait:.2f}",
                        f"{wait / secs:.0%}",
                        f"{statistics.median(r['first'] for r in rs):.2f}",
                        f"{statistics.median(r['c_str'] for r in rs):.2f}",
                        f"{statistics.median(r['bring'] for r in rs):.2f}",
                        f"{statistics.median(r['c_res'] for r in rs):.2f}",
                        f"{statistics.median(r['read'] for r in rs) / secs / 1e9:.2f}",
                        f"{statistics.median(r['device'] for r in rs) / secs / 1e9:.2f}",
                        f"{ratio:.2f}",
                        f"{best / floor:.2f}",
                        "yes" if ratio <= 1.1 else "no",
                    ]
                )
    header = [
        "lookahead",
        "workers",
        "disk mode",
        "pass s (each)",
        "waited s (median)",
        "wait share",
        "first disk block wait s",
        "streamed blocks compute s",
        "copy-in s",
        "resident blocks compute s",
        "engine disk GB/s in pass",
        "device GB/s in pass (/proc/diskstats)",
        "ratio to floor (median)",
        "best ratio",
        "<= 1.1x",
    ]
    table = md_table(header, rows)
    print(table)
    mach = machine(path)
    summary = (
        f"floor = max(compute {compute:.2f} s, disk tier {disk_bytes / 1e9:.2f} GB / drive {drive:.2f} GB/s = "
        f"{io_floor:.2f} s) = {floor:.2f} s"
    )
    print(summary)
    md = [
        "# Offloaded forward with a disk tier (`bench/forward_disk.py`)",
        "",
        f"- date: {mach['date']}",
        f"- machine: nproc {mach['nproc']} ({mach['cpu']}), {mach['ram']} RAM, kernel {mach['kernel']}, "
        f"{mach['fs']}, torch {mach['torch']} ({mach['torch_threads']} threads); load average at the start of each "
        f"pass {min(r['load'] for r in results)} .. {max(r['load'] for r in results)} "
        "(the benchmark's own threads included)",
        f"- model: {N_BLOCKS} blocks of LayerNorm + Linear({D},{F}) + GELU + Linear({F},{D}), bf16, "
        f"{block_bytes / 1e6:.0f} MB a block, {size / 1e9:.2f} GB file; CPU compute, input {args.tokens} tokens x {D}",
        f"- plan: `Plan.manual(resident=blocks 0-{RESIDENT - 1} ({RESIDENT * block_bytes / 1e9:.2f} GB), "
        f'streamed=blocks {RESIDENT}-{N_BLOCKS - 1}, streamed_tier="disk")` = {disk_bytes / 1e9:.2f} GB on disk '
        "(a 2 GB device budget)",
        "- (i) drive, over the disk tier's byte range, cold, the best of four readers counts: "
        + "; ".join(f"{when}: " + ", ".join(f"{k} {v:.2f}" for k, v in sp.items()) for when, sp in DRIVE_LOG)
        + f" GB/s; mean of the best before and after {drive:.2f} GB/s",
        f"- (ii) compute: the same model with every block resident (stream_load, all resident), median of 3 "
        f"passes after a warm-up: {compute:.2f} s ({compute_block * 1e3:.0f} ms a block; a block's read at dd speed "
        f"is {block_bytes / drive / 1e6:.0f} ms)",
        f"- (iii) offloaded: per setting a fresh stream_load + install_offload, one warm-up pass, then "
        f"{args.passes} passes each after `drop_cache(path)` (cached bytes before each: "
        f"{max(r['cached'] for r in results)} at most). waited = sum of the hooks' Timing.staged_wait over the pass "
        "(the engine's compute_waited_seconds agrees); disk GB/s = engine disk_bytes read during "
        "the pass / pass time. streamed/resident blocks compute = time between forward pre-hooks registered "
        "after the offload hooks and the forward hooks (the block's own compute); copy-in = hook start to compute "
        "start minus the wait (what the hook does besides waiting: views of the staging buffer, or an expansion). "
        f"With every block resident the same split was: blocks 0-{RESIDENT - 1} {ref_res:.2f} s, blocks "
        f"{RESIDENT}-{N_BLOCKS - 1} {ref_str:.2f} s. "
        "Every pass's output equalled the all-resident output: "
        f"{all(r['same'] for r in results)}",
        f"- {summary}; target: pass <= 1.1x floor",
        "",
        table,
        "",
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "forward_disk.md").write_text("\n".join(md))
    print(f"wrote {RESULTS / 'forward_disk.md'}")


if __name__ == "__main__":
    main()
