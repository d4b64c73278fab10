"""GPU streaming benchmark: passes with most blocks in the RAM tier, each against what bounds it,
measured in the same run, and against the virtual-time model of the device bookkeeping.

For each setting (RAM-tier form x worker threads x lookahead) it loads the model, measures
torch's own pinned host-to-device copy rate for one block right beside it (the link), and runs
``--passes`` passes. Each pass gets a row: its time, the RAM tier's bytes over that time, the copy
engine's own rate (device-timed copies), both as a share of the link, the compute stream's wait
for copies, and the model's pass for the same block size, per-block compute time (measured with
every block resident), lookahead and link: ``predict_step`` of tests/support/vtdevice.py ("n/a" when
that is missing). Device-timed figures are read only after the backend has settled. The
markdown is appended to --out (default bench/results/gpu.md; $OUT/gpu.md when OUT is set). Its
files are removed at the end.

    PYTHONPATH=python:tests python3 bench/gpu_stream.py --blocks 32 --resident 8
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

import trash_panda as tp
from trash_panda import _core
from trash_panda.offload.backends.copies import CudaDevice
from trash_panda.offload.backends.cuda import DeviceBackend

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
# Its signature differs between revisions (see model_pass); None when tests/support/vtdevice.py is missing.
predict_step: Callable[..., dict[str, Any]] | None
try:
    from support.vtdevice import predict_step

    MODEL_ERROR = ""
except Exception as e:  # the model is optional: the measurements stand without it
    predict_step = None
    MODEL_ERROR = f"{type(e).__name__}: {e}"

DIM = 4096
FORMS = {"mapped": "0", "in-memory": "1"}  # TRASH_PANDA_RAM_IN_MEMORY


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(DIM, 2 * DIM, bias=False)
        self.down = nn.Linear(2 * DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Stack(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


def timed(fn: Callable[[], Any], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def model_pass(
    block_bytes: int, compute_s: float, lookahead: int, link: float, fill: float | None, workers: int, args: Any
) -> tuple[float, float] | str:
    """The model's steady pass: the resident blocks' compute plus one predicted step per
    streamed block, and the share of the time the link is busy; or why there is none.
    ``fill`` None: the RAM tier is copied directly from pinned memory."""
    if predict_step is None:
        return MODEL_ERROR
    streamed = args.blocks - args.resident
    options: dict[str, Any] = {"blocks": streamed}
    if "workers" in inspect.signature(predict_step).parameters:
        options["workers"] = workers
    try:
        r = predict_step(block_bytes, compute_s, lookahead, link, fill, **options)
        return args.resident * compute_s + streamed * float(r["step_s"]), float(r["link_busy"])
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def fill_rate(handle: tp.OffloadHandle, since: float) -> float | None:
    """Bytes per second of the warm RAM-tier staging (copies from the page cache into pinned
    buffers) of all the workers together, from the engine's own record; None when nothing was
    staged."""
    state = handle.state
    if state.engine is None:
        return None
    done = [
        s
        for s in state.engine.stagings()
        if s.start >= since and s.source == _core.StagingSource.RAM_WARM and s.end > s.start
    ]
    return total_fill_rate([(s.start, s.end, s.bytes) for s in done])


def total_fill_rate(stagings: list[tuple[float, float, int]]) -> float | None:
    """The fill rate ``predict_step`` takes: the workers' together, which the model shares out
    among the fills under way. Their bytes over the time at least one of them was filling (the
    union of their intervals), not over the sum of their times, which is one worker's rate: with
    two filling at once that is half the total, and the prediction twice too slow."""
    spans = sorted((a, b) for a, b, _n in stagings if b > a)
    if not spans:
        return None
    busy, start, end = 0.0, spans[0][0], spans[0][1]
    for a, b in spans[1:]:
        if a > end:
            busy += end - start
            start, end = a, b
        else:
            end = max(end, b)
    busy += end - start
    return sum(n for a, b, n in stagings if b > a) / busy


def run_setting(
    form: str, workers: int, lookahead: int, path: Path, x: torch.Tensor, want: torch.Tensor, env: dict[str, Any]
) -> list[str]:
    args = env["args"]
    os.environ["TRASH_PANDA_WORKERS"] = str(workers)
    os.environ["TRASH_PANDA_LOOKAHEAD"] = str(lookahead)
    os.environ["TRASH_PANDA_RAM_IN_MEMORY"] = FORMS[form]
    with torch.device("meta"):
        model = Stack(args.blocks)
    streamed = [f"blocks.{i}." for i in range(args.resident, args.blocks)]
    p = tp.Plan.manual(resident=[f"blocks.{i}." for i in range(args.resident)], streamed=streamed)
    tp.stream_load(model, path, plan=p, device=x.device)
    # torch's own pinned copy of one block, right beside the passes it bounds.
    link = CudaDevice(x.device).link_bandwidth(env["block_bytes"])
    handle = tp.install_offload(model)
    backend = handle.backend
    assert isinstance(backend, DeviceBackend)  # the model is on CUDA
    direct = bool(getattr(backend.copies, "images", None))
    walls = []
    with torch.no_grad():
        for i in range(args.passes):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            got = model(x)
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - t0)
            if i == 0:
                assert torch.equal(got, want), "offloaded output differs from the resident model's"
    backend.settle()  # every copy and wait event has happened: the device-timed figures are final
    stats = handle.stats()
    fill = None if direct else fill_rate(handle, handle.installed)
    per_block = env["compute"] / args.blocks
    if direct or fill is not None:
        predicted = model_pass(env["block_bytes"], per_block, lookahead, link, fill, workers, args)
    else:
        predicted = "the engine recorded no warm RAM-tier staging to take a fill rate from"
    runs = handle.runs[-args.passes * args.blocks :]  # resident blocks' runs are recorded too
    tp.release(model, handle)
    rows = []
    ram_bytes = len(streamed) * env["block_bytes"]
    for i, wall in enumerate(walls):
        timings = [t for b, _s, _e, t in runs[i * args.blocks : (i + 1) * args.blocks] if b >= args.resident]
        engine_s = sum(t.copy_seconds for t in timings)
        waited = sum(t.gpu_wait for t in timings)
        rate = ram_bytes / wall
        engine = sum(t.bytes for t in timings) / engine_s if engine_s > 0 else 0.0
        if isinstance(predicted, tuple):
            model_ms, busy = f"{predicted[0] * 1e3:.1f}", f"{predicted[1]:.0%}"
        else:
            model_ms, busy = "n/a", "n/a"
        rows.append(
            f"| {form}{'' if direct or form == 'mapped' else ' (not pinned)'} | {workers} | {lookahead} | {i + 1} "
            f"| {wall * 1e3:.1f} | {wall / env['floor']:.2f}x | {rate / 1e9:.2f} | {engine / 1e9:.2f} "
            f"| {link / 1e9:.2f} | {rate / link:.0%} | {waited * 1e3:.1f} | {model_ms} | {busy} "
            f"| {'-' if fill is None else f'{fill / 1e9:.1f}'} "
            f"| {stats.hits if stats else 0}/{stats.acquires if stats else 0} |"
        )
        print(rows[-1], flush=True)
    if isinstance(predicted, str):
        print(f"model: n/a ({predicted})", flush=True)
    print(
        f"{form} x{workers} lookahead {lookahead}: best pass {min(walls) * 1e3:.1f} ms, "
        f"{ram_bytes / min(walls) / 1e9:.2f} GB/s of the {link / 1e9:.2f} GB/s link",
        flush=True,
    )
    return rows


def swap_rows(path: Path, x: torch.Tensor, want: torch.Tensor, env: dict[str, Any]) -> list[str]:
    """``release_gpu()`` and ``restore_gpu()`` of the model with every block resident, three
    times each: their time and rate against torch's pinned copy measured beside them, the host
    RAM held while released, the device memory given back; the output after each restore is
    checked against the resident model's."""
    args = env["args"]
    with torch.device("meta"):
        model = Stack(args.blocks)
    tp.stream_load(
        model,
        path,
        plan=tp.Plan.manual(resident=[f"blocks.{i}." for i in range(args.blocks)], streamed=[]),
        device=x.device,
    )
    handle = tp.install_offload(model)
    link = CudaDevice(x.device).link_bandwidth(env["block_bytes"])
    rows = []
    try:
        for i in range(3):
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated(x.device)
            out = handle.release_gpu()
            torch.cuda.synchronize()
            freed = before - torch.cuda.memory_allocated(x.device)
            back = handle.restore_gpu()
            with torch.no_grad():
                assert torch.equal(model(x), want), "output after restore_gpu() differs from the resident model's"
            rows.append(
                f"| {i + 1} | {out.bytes / 1e9:.2f} | {out.seconds * 1e3:.1f} | {out.gb_per_s:.2f} "
                f"| {back.seconds * 1e3:.1f} | {back.gb_per_s:.2f} | {link / 1e9:.2f} | {out.host_bytes / 1e9:.2f} "
                f"| {'yes' if out.pinned else 'no'} | {freed / 1e9:.2f} | {out.kept_device_bytes / 1e6:.0f} |"
            )
            print(rows[-1], flush=True)
    finally:
        tp.release(model, handle)
    return rows


def meter_row(x: torch.Tensor, blocks: int) -> str:
    """What a memory window (the meter a stage's run opens: the allocator's history recorded and
    replayed) costs a pass with every block resident: the best of five passes inside one
    against the best of five outside, alternated, on the same model."""
    from trash_panda.offload.meter import measured

    torch.manual_seed(0)
    with torch.device(x.device):
        model = Stack(blocks).to(torch.bfloat16).eval()
    plain, windowed = float("inf"), float("inf")
    with torch.no_grad():
        model(x)
        for _ in range(5):
            plain = min(plain, timed(lambda: model(x), repeat=1))
            with measured(x.device):
                windowed = min(windowed, timed(lambda: model(x), repeat=1))
    return (
        f"- a pass inside a memory window: {windowed * 1e3:.1f} ms against {plain * 1e3:.1f} ms outside one "
        f"({windowed / plain:.3f}x; best of five each, alternated)"
    )


def reference(blocks: int, path: Path, x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Writes the checkpoint; returns the output and the best time of a pass with every block on
    the GPU."""
    torch.manual_seed(0)
    with torch.device(x.device):  # initialized on the GPU: seconds, not minutes of CPU init
        ref = Stack(blocks).to(torch.bfloat16).eval()
    save_file({k: v.contiguous().cpu() for k, v in ref.state_dict().items()}, str(path))
    with torch.no_grad():
        return ref(x), timed(lambda: ref(x))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=32)
    ap.add_argument("--resident", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--passes", type=int, default=4)
    ap.add_argument("--forms", nargs="+", choices=list(FORMS), default=list(FORMS))
    ap.add_argument("--workers", type=int, nargs="+", default=[2])
    ap.add_argument("--lookahead", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--out", default="bench/results/gpu.md")
    args = ap.parse_args()
    dev = torch.device("cuda")
    workdir = Path(tempfile.mkdtemp(prefix="tp-gpu-"))
    path = workdir / "stack.safetensors"
    block_bytes = 2 * DIM * 2 * DIM * 2
    x = torch.randn(args.tokens, DIM, dtype=torch.bfloat16, device=dev)
    want, compute = reference(args.blocks, path, x)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(dev)
    outside = total - free - torch.cuda.memory_reserved(dev)
    link0 = CudaDevice(dev).link_bandwidth(block_bytes)
    ram_bytes = (args.blocks - args.resident) * block_bytes
    floor = max(compute, ram_bytes / link0)
    env = {"args": args, "block_bytes": block_bytes, "compute": compute, "floor": floor}
    rows: list[str] = []
    swaps: list[str] = []
    metered = "- a pass inside a memory window: not measured"
    try:
        for form in args.forms:
            for workers in args.workers if form == "mapped" else args.workers[:1]:
                for lookahead in args.lookahead:
                    rows += run_setting(form, workers, lookahead, path, x, want, env)
        swaps = swap_rows(path, x, want, env)
        metered = meter_row(x, args.resident)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    model_line = (
        "the virtual-time model (tests/support/vtdevice.py predict_step) for the same block size, per-block compute "
        "(resident pass / blocks), lookahead, link and, for the mapped form, the engine's own warm fill rate"
        if predict_step is not None
        else f"model: n/a ({MODEL_ERROR})"
    )
    lines = [
        f"- {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {torch.cuda.get_device_name(dev)}, "
        f"torch {torch.__version__}, {platform.node()}",
        f"- model: {args.blocks} blocks of {block_bytes / 1e6:.0f} MB bf16, {args.resident} resident, "
        f"{args.blocks - args.resident} in the RAM tier ({ram_bytes / 1e9:.2f} GB); input {args.tokens} x {DIM}",
        f"- a pass with every block resident: {compute * 1e3:.1f} ms; pinned copy of one block (torch, before the "
        f"settings): {link0 / 1e9:.2f} GB/s; floor max(compute, RAM tier / link): {floor * 1e3:.1f} ms",
        f"- GPU memory outside torch (context, kernels, libraries): {outside / 1e6:.0f} MB; the plans keep "
        f"{_core.CUDA_CONTEXT_FLOOR / 1e6:.0f} MB for it",
        metered,
        "- per pass: ms (wall, synchronized) and against the floor; copy GB/s = RAM-tier bytes / pass; engine "
        "GB/s = bytes / the copy engine's time (events); link = torch's pinned copy of one block measured right "
        "before the setting; waited = the compute stream's wait for copies (events, read after settling); model = "
        + model_line
        + "; fill = warm staging GB/s of the workers together (mapped form); hits/acquires from the engine",
        "",
        "| RAM tier | workers | lookahead | pass | ms | / floor | copy GB/s | engine GB/s | link GB/s | of link "
        "| waited ms | model ms | model link busy | fill GB/s | hits/acquires |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "release_gpu() / restore_gpu() of the model with every block resident (the time of each call, "
        "synchronized; link = torch's pinned copy of one block beside them; host GB = RAM held while released; "
        "freed GB = torch's allocated device memory given back; kept MB = device slots and expansion, which stay):",
        "",
        "| round | GB moved | release ms | release GB/s | restore ms | restore GB/s | link GB/s | host GB | pinned "
        "| freed GB | kept MB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
        *swaps,
        "",
    ]
    text = "\n".join(lines)
    print(text)
    out = Path(os.environ["OUT"]) / "gpu.md" if os.environ.get("OUT") else Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a", encoding="utf-8") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
