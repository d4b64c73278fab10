"""LoRAs on streamed weights: what a step costs with 1 and 4 LoRAs of rank 16 and 64, merged and
unmerged, against the same model with none (not a test).

    PYTHONPATH=python .venv/bin/python bench/adapters.py [--rounds 2] [--tokens 512]

A model of Linear blocks (bench/_common.py's Net, bf16) is streamed from its RAM tier by
trash_panda, every block streamed; LoRAs made with PEFT's initialisation on every up and down
projection, saved as PEFT saves them, are put on with ``trash_panda.load_adapter``. Ways, each in
a process of its own, the order rotated from round to round:

  plain             the model in memory (load_state_dict), no LoRA: the compute's reference
  streamed          trash_panda, no LoRA: what streaming costs by itself (the RAM tier mapped,
                    as by default on Linux)
  streamed_private  the same with the RAM tier in private memory (TRASH_PANDA_RAM_IN_MEMORY=1):
                    the kept merges are private memory, so this is the unpatched step to hold
                    them against
  peft_<n>x<r>      the plain model with the LoRAs through PEFT, unmerged (on this machine,
                    with no GPU, diffusers' group offloading moves nothing: this is its step)
  group_<n>x<r>     diffusers' apply_group_offloading (block level, CPU to CPU) on the plain
                    model with the same PEFT LoRAs: the peer's hooks, with nothing to move
  unmerged_<n>x<r>  trash_panda with the LoRAs unmerged: W x + s·B(A x) beside the weight
  merged_<n>x<r>    trash_panda with the LoRAs merged: computed on the first pass and kept where
                    each block lives (the plan is a GPU's, so the RAM tier is staged: a memory
                    image in place of the block's pages), so later steps stream merged blocks
  merged_private_<n>x<r> the same with the RAM tier in private memory: each block's merge kept
                    in a memory image it is staged from (against streamed_private)
  streamed_disk     trash_panda, no LoRA, every block on the disk tier (read with O_DIRECT on
                    each pass)
  merged_disk_<n>x<r> the same with the LoRAs merged: each block's merge kept in an overlay file
                    (beside the checkpoint), read in its place (against streamed_disk)
  per_copy_<n>x<r>  trash_panda merged with nothing kept (no image, no room beside the model):
                    W + ΔW made again on each bring, as ComfyUI's low-VRAM mode patches each copy
  chosen_<n>x<r>    trash_panda with mode="auto" and no RAM to keep merges: the core's cost
                    model chooses at each layer's first call between per_copy and unmerged
                    (run it at a few and at many tokens: --tokens)
  fp8               trash_panda, no LoRA, the blocks stored in fp8 (storage_dtype="fp8", one
                    scale per row) and expanded to bf16 as they run
  fp8_merged_<n>x<r> the same with the LoRAs merged: each merge quantized again to fp8 in the
                    block's layout and kept as codes and scales, expanded on each run

Each way: the load (and the adapters' load) timed, one first step, then ``--steps`` steps
timed; the median step against ``streamed``'s (and ``plain``'s) in the same round. The
process's peak RSS is beside. Writes bench/results/adapters.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import DATA, RESULTS, build_meta, machine, md_table, write_checkpoint

BLOCKS, D, F = 16, 1024, 4096
CONFIGS = [(1, 16), (4, 16), (1, 64), (4, 64)]
KINDS = ("peft", "group", "unmerged", "merged", "merged_private", "merged_disk", "per_copy", "chosen")
# Ways whose RAM tier is held in private memory.
PRIVATE = ("streamed_private", "merged_private")


def ways() -> list[str]:
    every = [f"{k}_{n}x{r}" for n, r in CONFIGS for k in KINDS]
    fixed = ["plain", "streamed", "streamed_private", "streamed_disk", "fp8"]
    return [*fixed, *every, *[f"fp8_merged_{n}x{r}" for n, r in CONFIGS]]


def _kind(way: str) -> tuple[str, str]:
    """A way's kind and its LoRAs (``<n>x<r>``, or empty)."""
    for kind in (
        "per_copy", "fp8_merged", "streamed_private", "streamed_disk", "merged_private", "merged_disk", *KINDS,
        "plain", "streamed", "fp8",
    ):  # fmt: skip
        if way == kind or way.startswith(kind + "_"):
            return kind, way.removeprefix(kind).removeprefix("_")
    raise SystemExit(f"unknown way {way!r}")


def _model_file() -> Path:
    path = DATA / "adapters-net-bf16.safetensors"
    write_checkpoint(path, build_meta(BLOCKS, D, F, torch.bfloat16), torch.bfloat16)
    return path


def _loras(n: int, rank: int) -> list[Path]:
    """``n`` LoRAs of rank ``rank`` on every up and down projection, saved as PEFT saves them."""
    from peft import LoraConfig, get_peft_model_state_dict, inject_adapter_in_model
    from safetensors.torch import save_file

    out = []
    for i in range(n):
        folder = DATA / f"adapters-lora-{rank}-{i}"
        if not (folder / "adapter_model.safetensors").is_file():
            folder.mkdir(parents=True, exist_ok=True)
            with torch.device("meta"):
                net = build_meta(BLOCKS, D, F, torch.bfloat16)
            net = net.to_empty(device="cpu")
            torch.manual_seed(100 + i)
            inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=rank, target_modules=["up", "down"]), net)
            with torch.no_grad():
                for name, p in net.named_parameters():
                    if "lora_B" in name:  # PEFT starts B at zero: a trained LoRA's is not
                        p.normal_(0, 0.01)
            state = get_peft_model_state_dict(net)
            save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "adapter_model.safetensors"))
            (folder / "adapter_config.json").write_text(json.dumps({"r": rank, "lora_alpha": rank}))
        out.append(folder)
    return out


def _rss_peak() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def one(way: str, tokens: int, steps: int) -> dict[str, Any]:
    """Runs ``way`` in this process; its figures."""
    import trash_panda as tp

    path = _model_file()
    kind, cfg = _kind(way)
    n, rank = (int(v) for v in cfg.split("x")) if cfg else (0, 0)
    files = _loras(n, rank) if n else []
    t0 = time.perf_counter()
    if kind in ("plain", "peft", "group"):
        from safetensors.torch import load_file

        model = build_meta(BLOCKS, D, F, torch.bfloat16).to_empty(device="cpu")
        model.load_state_dict(load_file(str(path)))
    else:
        model = build_meta(BLOCKS, D, F, torch.bfloat16)
        storage = "fp8" if kind.startswith("fp8") else None
        ram = "1KB" if kind.endswith("_disk") else "64GB"  # every block on the disk tier, or in RAM
        plan = tp.plan(
            model, path, vram="1TB", ram=ram, resident_blocks=0, headroom_vram=0, device="cpu",
            storage_dtype=storage, compute_dtype="bf16",
        )  # fmt: skip
        tp.stream_load(model, path, plan=plan, device="cpu")
        tp.install_offload(model)
    load_s = time.perf_counter() - t0
    if kind in ("per_copy", "chosen"):
        from trash_panda.offload import patches
        from trash_panda.offload.merges import merged_copies
        from trash_panda.offload.state import get_state

        state = get_state(model)
        assert state is not None
        # Nothing kept, neither in the blocks' images nor beside the model: each bring merges
        # again.
        patches.image_place = lambda *_: None
        merged_copies(state).spare = 0
    t0 = time.perf_counter()
    mode = "auto" if kind == "chosen" else "unmerged"
    handles = [tp.load_adapter(model, f, name=f"l{i}", mode=mode) for i, f in enumerate(files)]
    adapters_s = time.perf_counter() - t0
    if kind in ("merged", "merged_private", "merged_disk", "per_copy", "fp8_merged"):
        for h in handles:
            h.merge()
    if kind == "group":
        from diffusers.hooks import apply_group_offloading

        apply_group_offloading(
            model, onload_device=torch.device("cpu"), offload_device=torch.device("cpu"), offload_type="block_level",
            num_blocks_per_group=1,
        )  # fmt: skip
    x = torch.randn(1, tokens, D, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    times = []
    with torch.no_grad():
        for _ in range(steps + 1):
            t0 = time.perf_counter()
            out = model(x)
            times.append(time.perf_counter() - t0)
    chose = ""
    if kind == "chosen":
        chose = ", ".join(sorted({why.split(" (")[0] for h in handles for why in h.modes.values()}))
    images = ""
    state = None
    if kind not in ("plain", "peft", "group"):
        from trash_panda.offload.state import get_state

        state = get_state(model)
    held = state.engine.overlay_bytes() if state is not None and state.engine is not None else None
    if held is not None and held.blocks:
        images = f"{held.blocks} ({held.memory / 2**30:.2f} GiB memory, {held.file / 2**30:.2f} GiB files)"
    return {
        "images": images,
        "chose": chose,
        "way": way,
        "load_s": load_s,
        "adapters_s": adapters_s,
        "first_s": times[0],
        "step_s": statistics.median(times[1:]),
        "rss_peak": _rss_peak(),
        "checksum": float(out.float().abs().sum()),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--ways", nargs="*", default=None)
    ap.add_argument("--out", default="adapters.md", help="file name under bench/results/")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.tokens, args.steps)))
        return
    chosen = args.ways or ways()
    _model_file()
    for n, rank in CONFIGS:
        _loras(n, rank)
    results: dict[str, list[dict[str, Any]]] = {w: [] for w in chosen}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parent.parent / "python")]))
    for r in range(args.rounds):
        order = chosen[r % len(chosen) :] + chosen[: r % len(chosen)]
        for way in order:
            cmd = [sys.executable, __file__, "--one", way, "--tokens", str(args.tokens), "--steps", str(args.steps)]
            extra = {"TRASH_PANDA_RAM_IN_MEMORY": "1"} if way.startswith(PRIVATE) else {}
            p = subprocess.run(cmd, capture_output=True, text=True, env=dict(env, **extra))
            if p.returncode != 0:
                raise SystemExit(f"{way} failed:\n{p.stderr[-3000:]}")
            got = json.loads(p.stdout.strip().splitlines()[-1])
            results[way].append(got)
            print(f"round {r} {way}: step {got['step_s']:.3f} s, first {got['first_s']:.3f} s", flush=True)
    med = {w: statistics.median(x["step_s"] for x in v) for w, v in results.items()}
    base = med.get("streamed")
    private = med.get("streamed_private")
    disk = med.get("streamed_disk")
    plain = med.get("plain")
    rows = []
    for w in chosen:
        v = results[w]
        rows.append(
            [
                w,
                f"{med[w]:.3f}",
                f"{med[w] / base:.2f}x" if base else "",
                f"{med[w] / private:.2f}x" if private else "",
                f"{med[w] / disk:.2f}x" if disk and "disk" in w else "",
                f"{med[w] / plain:.2f}x" if plain else "",
                f"{statistics.median(x['first_s'] for x in v):.3f}",
                f"{statistics.median(x['adapters_s'] for x in v):.2f}",
                f"{max(x['rss_peak'] for x in v) / 2**30:.2f}",
                v[0]["chose"],
                v[0].get("images", ""),
            ]
        )
    table = md_table(
        [
            "way",
            "step (s)",
            "vs streamed",
            "vs streamed_private",
            "vs streamed_disk",
            "vs plain",
            "first step (s)",
            "adapters' load (s)",
            "peak RSS (GiB)",
            "auto chose",
            "merged images",
        ],
        rows,
    )
    info = machine(DATA)
    text = (
        f"# Adapters on streamed weights\n\n{BLOCKS} blocks of d={D}, f={F}, bf16 "
        f"({BLOCKS * 2 * D * F * 2 / 2**30:.2f} GiB), {args.tokens} tokens a step, every block streamed from its "
        f"RAM tier; LoRAs on every up and down projection; the median of {args.steps} steps after the first, "
        f"the median over {args.rounds} rounds.\n\n"
        f"Machine: {info['cpu']}, {info['nproc']} CPUs, {info['ram']}, torch {info['torch']}, {info['date']}.\n\n"
        f"{table}\n"
    )
    out = RESULTS / args.out
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
