"""A model's first run: load + first pass on a cold cache, with and without ``overlap=True``, with
no order file, a traced order and a real order file, against the drive's best reader measured in
the same round (not a test).

    PYTHONPATH=python .venv/bin/python bench/first_run.py [--rounds 2] [--models flux,llama]

Models (checkpoints generated once under target/bench-data/):
  flux   a Flux-shaped model of pre-norm MLP blocks (d 2048, ffn 8192, bf16; 67 MB a block):
         ``--main`` main blocks defined first and ``--text`` text blocks defined after them, the
         text blocks run first (their output conditions the main ones)
  llama  transformers' LlamaForCausalLM (hidden 2048, ffn 5632, ``--layers`` layers, bf16)
Each stage plans a third of the blocks resident, a third on the RAM tier (mapped) and the rest
on the disk tier, computes on the CPU, and runs one forward pass.

Per model and round, each on a cold file (``drop_cache``, checked with ``cached_bytes``):
  reference   the drive's best reader over the whole file: plain O_DIRECT with 4 and with 16
              requests in flight and dd iflag=direct, the best of the three, measured right
              before each run
  compute     a warm pass of the plain model (weights in memory), the median of 3
  runs        eager or overlap x {no order file, traced order (``trace_order`` on the meta
              model, timed apart), a real order file written by an earlier run}
Printed per run: load seconds, first pass seconds, the sum, the bytes the device read
(/proc/diskstats), and the floor max(compute, file bytes / best reader): every byte of the file
is read once; the table's floor takes the median of the model's best-reader readings. Then the
ratios: overlap against eager, a traced order against a real order file.
Writes bench/results/first_run.md.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import (
    DATA,
    RESULTS,
    Block,
    best_reader,
    cold,
    device_read_bytes,
    loadavg,
    machine,
    md_table,
    write_checkpoint,
)
from torch import nn

import trash_panda as tp

D, F = 2048, 8192
ORDERS = ("none", "traced", "file")
HEADER = ["model, load, order", "load s", "first pass s", "total s", "read GB", "best reader GB/s", "floor s"]
HEADER.append("total / floor")


class FluxShaped(nn.Module):
    """Main blocks defined first, text blocks after them; the text blocks run first."""

    def __init__(self, main: int, text: int) -> None:
        super().__init__()
        self.img_in = nn.Linear(D, D, bias=False)
        self.blocks = nn.ModuleList(Block(D, F) for _ in range(main))
        self.text_blocks = nn.ModuleList(Block(D, F) for _ in range(text))
        self.norm_out = nn.LayerNorm(D)

    def forward(self, x: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        x = self.img_in(x)
        for b in self.text_blocks:
            text = b(text)
        x = x + text.mean(dim=1, keepdim=True)
        for b in self.blocks:
            x = b(x)
        return self.norm_out(x)


class Subject:
    """One model of the benchmark: how to build it (meta or real), its checkpoint and inputs."""

    def __init__(self, name: str, build: Callable[[], nn.Module], path: Path, args: tuple[Any, ...]) -> None:
        self.name = name
        self.build = build
        self.path = path
        self.args = args

    def meta(self) -> nn.Module:
        with tp.empty_weights():
            return self.build().to(torch.bfloat16).eval()

    def blocks(self) -> list[str]:
        from trash_panda.blocks import find_blocks

        return [b.prefix for b in find_blocks(self.meta())]


def flux(main: int, text: int) -> Subject:
    path = DATA / f"first-run-flux-{main}-{text}.safetensors"
    with torch.device("meta"):
        shapes = FluxShaped(main, text).to(torch.bfloat16)
    write_checkpoint(path, shapes, torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 64, D, generator=gen).to(torch.bfloat16)
    t = torch.randn(1, 32, D, generator=gen).to(torch.bfloat16)
    return Subject("flux", lambda: FluxShaped(main, text), path, (x, t))


def llama(layers: int) -> Subject:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=16,
        vocab_size=32000,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    path = DATA / f"first-run-llama-{layers}.safetensors"
    with torch.device("meta"):
        shapes = LlamaForCausalLM(config).to(torch.bfloat16)
    write_checkpoint(path, shapes, torch.bfloat16)
    ids = torch.randint(0, 32000, (1, 64), generator=torch.Generator().manual_seed(0))
    return Subject("llama", lambda: LlamaForCausalLM(config), path, (ids,))


def compute_seconds(s: Subject) -> float:
    from safetensors.torch import load_file

    torch.manual_seed(0)
    model = s.build().to(torch.bfloat16).eval()
    model.load_state_dict(load_file(str(s.path)), strict=False)
    times = []
    with torch.no_grad():
        model(*s.args)  # warm-up
        for _ in range(3):
            t = time.perf_counter()
            model(*s.args)
            times.append(time.perf_counter() - t)
    del model
    gc.collect()
    return statistics.median(times)


def tiers(s: Subject) -> dict[str, Any]:
    """A third of the blocks resident, a third on the RAM tier, the rest on disk."""
    from trash_panda import Checkpoint

    prefixes = s.blocks()
    sizes = {p: 0 for p in prefixes}
    for info in Checkpoint(s.path).tensors():
        for p in prefixes:
            if info.name.startswith(p):
                sizes[p] += info.nbytes
    block = max(sizes.values())
    third = len(prefixes) // 3
    return {"resident_blocks": third, "ram": str(third * block + (256 << 20)), "min_free_ram": 0}


def run(s: Subject, overlap: bool, order: list[str] | None, destination: Path) -> dict[str, float]:
    cold(s.path)
    d0 = device_read_bytes(s.path)
    t0 = time.perf_counter()
    with (
        tp.stage(
            s.meta,
            s.path,
            device="cpu",
            overlap=overlap,
            order=order,
            order_file_destination=destination,
            **tiers(s),
        ) as (model, _plan, _handle),
        torch.no_grad(),
    ):
        t1 = time.perf_counter()
        model(*s.args)
        t2 = time.perf_counter()
    read = device_read_bytes(s.path) - d0
    gc.collect()
    return {"load": t1 - t0, "first": t2 - t1, "total": t2 - t0, "read": read}


def measure(s: Subject, rounds: int) -> tuple[list[list[str]], list[str]]:
    compute = compute_seconds(s)
    print(f"{s.name}: {s.path.stat().st_size / 1e9:.2f} GB, warm pass {compute:.2f} s", flush=True)
    t = time.perf_counter()
    traced = tp.trace_order(s.meta(), *s.args)
    trace_s = time.perf_counter() - t
    defined = s.blocks()
    print(f"  trace_order: {trace_s:.2f} s; runs {traced[:2]}... where the model defines {defined[:2]}...")
    with_file = Path(tempfile.mkdtemp(prefix="first-run-file-"))
    run(s, False, None, with_file)  # writes the real order file the "file" runs read
    got: dict[tuple[bool, str], list[dict[str, float]]] = {}
    for r in range(rounds):
        cases = [(ov, o) for ov in (False, True) for o in ORDERS]
        if r % 2:
            cases.reverse()  # the drive serves faster after idle spells: alternate
        for overlap, how in cases:
            best = best_reader(s.path)
            empty = Path(tempfile.mkdtemp(prefix="first-run-none-"))
            dest = with_file if how == "file" else empty
            out = run(s, overlap, traced if how == "traced" else None, dest)
            shutil.rmtree(empty, ignore_errors=True)
            out["best"] = best
            # Every byte of the file is read once (resident, RAM tier, disk tier): the floor is
            # the file at the best reader's rate, or the compute; the device's own count (which
            # also sees other processes' reads) is printed beside it.
            out["floor"] = max(compute, s.path.stat().st_size / 1e9 / best)
            got.setdefault((overlap, how), []).append(out)
            print(
                f"  {'overlap' if overlap else 'eager':<7} {how:<6} load {out['load']:6.2f} s  first pass "
                f"{out['first']:6.2f} s  total {out['total']:6.2f} s  read {out['read'] / 1e9:5.2f} GB  "
                f"best reader {best:5.2f} GB/s  floor {out['floor']:5.2f} s  load avg {loadavg()}",
                flush=True,
            )
    shutil.rmtree(with_file, ignore_errors=True)

    def med(key: tuple[bool, str], field: str) -> float:
        return statistics.median(o[field] for o in got[key])

    # The drive's rate swings between one reading and the next (it bursts after idle spells), so
    # each row's floor uses the median of every best-reader reading of this model, not only the
    # one taken right before the run; the per-run readings are printed above and in the column.
    drive = statistics.median(o["best"] for runs in got.values() for o in runs)
    floor = max(compute, s.path.stat().st_size / 1e9 / drive)
    rows = []
    for overlap in (False, True):
        for how in ORDERS:
            k = (overlap, how)
            rows.append(
                [
                    f"{s.name}, {'overlap' if overlap else 'eager'}, {how}",
                    f"{med(k, 'load'):.2f}",
                    f"{med(k, 'first'):.2f}",
                    f"{med(k, 'total'):.2f}",
                    f"{med(k, 'read') / 1e9:.2f}",
                    f"{med(k, 'best'):.2f}",
                    f"{floor:.2f}",
                    f"{med(k, 'total') / floor:.2f}x",
                ]
            )
    notes = [
        f"{s.name}: {s.path.stat().st_size / 1e9:.2f} GB; warm pass {compute:.2f} s; drive {drive:.2f} GB/s "
        f"(median best reader); floor {floor:.2f} s; trace_order took {trace_s:.2f} s"
    ]
    for how in ORDERS:
        ov, ea = med((True, how), "total"), med((False, how), "total")
        notes.append(f"{s.name}, {how}: overlap load + first pass / eager: {ov / ea:.2f}x")
    notes.append(
        f"{s.name}: first pass with a traced order / with a real order file: "
        f"eager {med((False, 'traced'), 'first') / med((False, 'file'), 'first'):.2f}x, "
        f"overlap {med((True, 'traced'), 'first') / med((True, 'file'), 'first'):.2f}x"
    )
    return rows, notes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--models", default="flux,llama")
    ap.add_argument("--main", type=int, default=40)
    ap.add_argument("--text", type=int, default=8)
    ap.add_argument("--layers", type=int, default=16)
    args = ap.parse_args()
    subjects = []
    for name in args.models.split(","):
        if name == "flux":
            subjects.append(flux(args.main, args.text))
        elif name == "llama":
            subjects.append(llama(args.layers))
        else:
            raise SystemExit(f"--models: unknown model {name!r}: expected flux or llama")
    rows: list[list[str]] = []
    notes: list[str] = []
    for s in subjects:
        r, n = measure(s, args.rounds)
        rows += r
        notes += n
    mach = machine(subjects[0].path)
    lines = [
        "# First run (`bench/first_run.py`)",
        "",
        f"- date: {mach['date']}",
        f"- machine: nproc {mach['nproc']} ({mach['cpu']}), {mach['ram']} RAM, kernel {mach['kernel']}, "
        f"{mach['fs']}, torch {mach['torch']}; load average at the end {loadavg()}",
        f"- {args.rounds} rounds, medians; every run on a cold file; CPU compute",
        "",
        md_table(HEADER, rows),
        "",
        *[f"- {n}" for n in notes],
        "",
    ]
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "first_run.md").write_text(text)


if __name__ == "__main__":
    main()
