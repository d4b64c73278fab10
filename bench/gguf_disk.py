"""A Flux-shaped diffusers transformer streamed from the disk tier as bf16 (safetensors), Q8_0 and
Q4_K (GGUF): the bytes each pass reads and its time, beside the drive's direct read of each file,
the pass with every block in memory (the compute alone), and diffusers' own GGUF loading with
group offloading to disk on the same files (not a test).

    PYTHONPATH=python:tests .venv/bin/python bench/gguf_disk.py [--rounds 2] [--tokens 16]

Model: FluxTransformer2DModel, 6 double and 12 single blocks of width 1536 (12 heads of 128),
text width 4096: 0.95 B parameters, 1.9 GB in bf16. Its files are made once under
target/bench-data/gguf-flux/: random bf16 weights as safetensors, and GGUF files whose 2-D
weights are random Q8_0 or Q4_K blocks with weight-sized scales (what matters here is their
bytes). One pass: a 16 x 16 latent (256 image tokens) and 32 text tokens, on the CPU.

Per round and format, alternated: the file dropped from the page cache; trash-panda's
``load_pipeline(files=...)`` with every block on the disk tier (O_DIRECT), a first pass and a
second, each with the drive's bytes read from /proc/diskstats; the same with every block in RAM
(second pass: the compute alone); a dd iflag=direct read of the file, cold; diffusers'
``from_single_file`` (GGUFQuantizationConfig, bf16 compute) with ``enable_group_offload`` to a
disk folder, block level, a first and a second pass. Writes bench/results/gguf-disk.md (with
``--tokens 16``, the default) or gguf-disk-<tokens>.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import numpy as np
import torch
from _common import DATA, RESULTS, cold, dd_direct, device_read_bytes, machine, md_table

import trash_panda

HERE = DATA / "gguf-flux"
# The transformer's shape: 6 double and 12 single blocks of width 1536 (12 heads of 128).
SHAPE: dict[str, Any] = {
    "in_channels": 64,
    "double": 6,
    "single": 12,
    "head_dim": 128,
    "heads": 12,
    "text_dim": 4096,
    "pooled_dim": 768,
    "axes": (16, 56, 56),
    "text": 32,
}


def _model() -> torch.nn.Module:
    from support.diffusion_models import flux
    from trash_panda.offload import empty_weights

    build, _inputs = flux(**SHAPE)
    with empty_weights():
        return build()


def _files() -> dict[str, Path]:
    """The pipeline folder and the three files, made once."""
    from safetensors.torch import save_file

    from support.ggml_blocks import gguf_type, random_blocks
    from support.gguf_diffusers import pipeline_class, transformer_pipeline

    folder = HERE / "pipe"
    files = {"bf16": HERE / "flux-bf16.safetensors", "q8_0": HERE / "flux-Q8_0.gguf", "q4_k": HERE / "flux-Q4_K.gguf"}
    if all(p.is_file() for p in files.values()) and (folder / "model_index.json").is_file():
        return files
    HERE.mkdir(parents=True, exist_ok=True)
    model = _model()
    transformer_pipeline(folder, model)
    assert pipeline_class() is not None
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    save_file({k: (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16) for k, s in shapes.items()}, files["bf16"])
    import gguf

    for name, qtype in (("q8_0", "Q8_0"), ("q4_k", "Q4_K")):
        w = gguf.GGUFWriter(str(files[name]), "flux")
        per = 256 if qtype.endswith("_K") else 32
        for i, (key, shape) in enumerate(shapes.items()):
            if len(shape) == 2 and shape[1] % 32 == 0:
                kind = qtype if shape[1] % per == 0 else "Q8_0"
                data = random_blocks(kind, shape[0], shape[1], seed=i, scale=3e-4)
                w.add_tensor(key, data, raw_shape=data.shape, raw_dtype=gguf_type(kind))
            else:
                w.add_tensor(key, np.random.default_rng(i).standard_normal(shape).astype(np.float32) * 0.02)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return files


def _inputs(tokens: int) -> dict[str, torch.Tensor]:
    from support.diffusion_models import flux

    return flux(**SHAPE, side=tokens)[1](torch.bfloat16)


def _timed(model: torch.nn.Module, x: dict[str, torch.Tensor], path: Path) -> tuple[float, int]:
    before = device_read_bytes(path)
    t = time.perf_counter()
    with torch.no_grad():
        model(**x)
    return time.perf_counter() - t, device_read_bytes(path) - before


def ours(files: dict[str, Path], fmt: str, x: dict[str, torch.Tensor], on_disk: bool) -> list[tuple[float, int]]:
    from support.gguf_diffusers import pipeline_class

    path = files[fmt]
    cold(path)
    ram = "1B" if on_disk else "1TB"
    pipe = trash_panda.diffusers.load_pipeline(
        pipeline_class(),
        HERE / "pipe",
        stream="transformer",
        files={"transformer": path},
        dtype=torch.bfloat16,
        vram="1TB",
        resident_blocks=0,
        device="cpu",
        ram=ram,
        min_free_ram=0,
    )
    try:
        return [_timed(pipe.transformer, x, path) for _ in range(2)]
    finally:
        trash_panda.diffusers.release_pipeline(pipe)


def diffusers_group_offload(
    files: dict[str, Path], fmt: str, x: dict[str, torch.Tensor]
) -> list[tuple[float, int]] | str:
    from diffusers import FluxTransformer2DModel, GGUFQuantizationConfig

    path = files[fmt]
    cold(path)
    spill = Path(tempfile.mkdtemp(dir=HERE))
    try:
        kwargs: dict[str, Any] = {
            "config": str(HERE / "pipe"),
            "subfolder": "transformer",
            "torch_dtype": torch.bfloat16,
        }
        if fmt != "bf16":
            kwargs["quantization_config"] = GGUFQuantizationConfig(compute_dtype=torch.bfloat16)
        model = FluxTransformer2DModel.from_single_file(str(path), **kwargs).eval()
        model.enable_group_offload(
            onload_device=torch.device("cpu"),
            offload_device=torch.device("cpu"),
            offload_type="block_level",
            num_blocks_per_group=1,
            offload_to_disk_path=str(spill),
        )
        runs = []
        for _ in range(2):
            for f in spill.glob("*"):
                cold(f)
            runs.append(_timed(model, x, path))
        return runs
    except Exception as e:  # a peer's failure is a result here, reported as such
        return f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    finally:
        shutil.rmtree(spill, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=16, help="the latent's side: side x side image tokens")
    args = ap.parse_args()
    files = _files()
    x = _inputs(args.tokens)
    results: dict[str, dict[str, list[Any]]] = {f: {"disk": [], "ram": [], "dd": [], "peer": []} for f in files}
    for r in range(args.rounds):
        for fmt in files:
            print(f"round {r + 1}: {fmt}", flush=True)
            results[fmt]["disk"].append(ours(files, fmt, x, on_disk=True))
            results[fmt]["ram"].append(ours(files, fmt, x, on_disk=False))
            cold(files[fmt])
            # O_DIRECT reads whole pages: the file cut to them.
            results[fmt]["dd"].append(dd_direct(files[fmt], 0, files[fmt].stat().st_size // 4096 * 4096))
            results[fmt]["peer"].append(diffusers_group_offload(files, fmt, x))
    rows = []
    med = statistics.median
    for fmt, res in results.items():
        size = files[fmt].stat().st_size
        disk1 = med(r[0][0] for r in res["disk"])
        disk2 = med(r[1][0] for r in res["disk"])
        read2 = med(r[1][1] for r in res["disk"])
        compute = med(r[1][0] for r in res["ram"])
        dd = med(res["dd"])
        floor = max(compute, size / (dd * 1e9)) if dd > 0 else compute
        peer = [p for p in res["peer"] if not isinstance(p, str)]
        peer_text = f"{med(p[1][0] for p in peer):.2f} s" if peer else str(res["peer"][0])
        rows.append(
            [
                fmt,
                f"{size / 1e9:.2f}",
                f"{read2 / 1e9:.2f}",
                f"{disk1:.2f}",
                f"{disk2:.2f}",
                f"{compute:.2f}",
                f"{dd:.2f}",
                f"{floor:.2f}",
                f"{disk2 / floor:.2f}",
                peer_text,
            ]
        )
    header = [
        "format",
        "file GB",
        "GB read per pass",
        "first pass s",
        "second pass s",
        "compute s (all in RAM)",
        "dd GB/s",
        "floor s",
        "x floor",
        "diffusers GGUF + group offload to disk, second pass",
    ]
    m = machine(HERE)
    text = (
        "# GGUF on the disk tier: bf16, Q8_0 and Q4_K of one Flux-shaped transformer\n\n"
        f"- date: {m['date']}; CPU: {m['cpu']}, {m['nproc']} cores, {m['ram']} RAM; torch {m['torch']}; {m['fs']}\n"
        f"- method: `bench/gguf_disk.py --rounds {args.rounds} --tokens {args.tokens}`; medians over the rounds; "
        "floor = max(compute alone, file bytes / the drive's dd rate measured right beside)\n\n"
        + md_table(header, rows)
        + "\n\n```json\n"
        + json.dumps({f: {k: v for k, v in r.items()} for f, r in results.items()}, default=str)
        + "\n```\n"
    )
    print(text)
    name = "gguf-disk.md" if args.tokens == 16 else f"gguf-disk-{args.tokens}.md"
    (RESULTS / name).write_text(text)


if __name__ == "__main__":
    main()
