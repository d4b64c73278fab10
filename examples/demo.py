"""The main job of `make demo`: generate text with a 6 GB model under a device budget far below
its size, part of it read from disk on every token, and check the tokens against the plain model.

    make demo                                  the embedded default (created once under target/)
    make demo ARGS="--model FOLDER --prompt 'Once upon a time' --max-vram 4GB"

The default is a transformers Llama (30 layers, 6.07 GB in bf16) with random weights and a
tokenizer trained on the spot (examples/demo_model.py). The reference tokens come from the same
folder loaded plainly with transformers (a separate process, so its memory is given back) and are
cached next to the model. Then `trash-panda generate` runs with the plan printed, the tokens
printed as they come, and the summary; the demo ends by comparing the tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import demo_model

PROMPT = "The raccoon streams the weights of a model"


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="a transformers causal LM folder (default: the embedded 6 GB Llama)")
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--max-new-tokens", type=int, default=8)
    # A simulated device of 2 GB (on the CPU the device tier is memory too) and 5 GB of RAM: about
    # 1.4 GB resident, 2.6 GB in the RAM tier and 2 GB read from disk on every pass.
    p.add_argument("--vram", default="2GB", help="device memory to plan for (default 2GB)")
    p.add_argument("--ram", default="5GB", help="RAM to plan for; what does not fit is read from disk (default 5GB)")
    p.add_argument("--max-vram", help="cap on the device memory the plan uses")
    p.add_argument("--headroom-vram", default="0.3GB")
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-check", action="store_true", help="skip the plain model's reference (it needs the RAM)")
    p.add_argument("--reference-to", type=Path, help=argparse.SUPPRESS)  # the child that runs the plain model
    return p.parse_args()


def reference(folder: Path, prompt: str, new: int, out: Path) -> None:
    """Greedy tokens of the plain model: transformers' own from_pretrained, everything in RAM."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    loaded = time.perf_counter() - t0
    inputs = tok(prompt, return_tensors="pt")
    with torch.no_grad():
        t0 = time.perf_counter()
        ids = model.generate(**inputs, max_new_tokens=new, do_sample=False, use_cache=True)
        ran = time.perf_counter() - t0
    generated = ids[0, inputs["input_ids"].shape[1] :].tolist()
    out.write_text(json.dumps({"prompt": inputs["input_ids"][0].tolist(), "generated": generated}))
    print(f"plain model: loaded in {loaded:.1f} s, {new} tokens in {ran:.1f} s", file=sys.stderr)


def _reference_file(folder: Path, prompt: str, new: int) -> Path:
    cache = folder / ".trash-panda-reference" if os.access(folder, os.W_OK) else Path("target") / "demo-references"
    cache.mkdir(parents=True, exist_ok=True)
    return cache / f"{_digest(prompt)}-{new}.json"


def _digest(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:16]


def main() -> None:
    args = _args()
    if args.reference_to is not None:
        reference(args.model, args.prompt, args.max_new_tokens, args.reference_to)
        return
    t_start = time.perf_counter()
    folder = args.model or demo_model.create()
    print(f"model folder: {folder}", flush=True)
    ref = None
    if not args.no_check:
        ref = _reference_file(folder, args.prompt, args.max_new_tokens)
        if not ref.is_file():
            print("reference: running the plain model once (cached for next time) ...", flush=True)
            cmd = [sys.executable, __file__, "--model", str(folder), "--prompt", args.prompt]
            cmd += ["--max-new-tokens", str(args.max_new_tokens), "--reference-to", str(ref)]
            subprocess.run(cmd, check=True)
    setup = time.perf_counter() - t_start

    ids = Path("target") / "demo-generated.json"
    cmd = [sys.executable, "-m", "trash_panda.cli", "generate", str(folder), "--prompt", args.prompt]
    cmd += ["--max-new-tokens", str(args.max_new_tokens), "--device", args.device, "--save-ids", str(ids)]
    for flag in ("vram", "ram", "max_vram", "headroom_vram"):
        value = getattr(args, flag)
        if value is not None:
            cmd += [f"--{flag.replace('_', '-')}", value]
    print(f"\n$ trash-panda generate {' '.join(cmd[4:])}", flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    ran = time.perf_counter() - t0

    got = json.loads(ids.read_text())
    if ref is not None:
        want = json.loads(ref.read_text())
        if got != want:
            raise SystemExit(f"demo: the tokens differ from the plain model's:\n  streamed {got}\n  plain    {want}")
        print(f"\ntokens equal to the plain model's ({len(got['generated'])} generated, greedy, KV cache on)")
    print(f"demo: set-up {setup:.0f} s, generate {ran:.0f} s (load included)")


if __name__ == "__main__":
    main()
