"""``trash-panda generate FOLDER --prompt TEXT``: a transformers causal LM streamed from its
folder, its tokens printed as they come, then where the bytes came from and how long it took.

This command needs torch and transformers, so it lives in the Python package's console script;
the native binary points here.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    from . import _core

    p = argparse.ArgumentParser(
        prog="trash-panda generate",
        description="Generate text with a transformers causal LM whose weights are streamed from FOLDER.",
    )
    p.add_argument("folder", type=Path, help="a model folder: config.json, tokenizer, safetensors (sharded or not)")
    p.add_argument(
        "--gguf-file",
        help="a GGUF file in the folder (or a path) to load the weights and config from, as transformers' gguf_file=",
    )
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate (default 32)")
    p.add_argument("--max-vram", help='cap on the device memory the plan uses, e.g. "2GB"')
    p.add_argument("--vram", help="free device memory to plan for instead of probing")
    p.add_argument("--ram", help="available RAM to plan for instead of probing (what does not fit goes to disk)")
    p.add_argument(
        "--headroom-vram",
        help=f'device memory kept free for activations (default "{_core.DEFAULT_HEADROOM_VRAM / 1e9:g}GB")',
    )
    p.add_argument("--resident-blocks", type=int, help="exactly this many blocks resident on the device")
    p.add_argument("--plan", type=Path, help="a plan as JSON (Plan.save / trash-panda plan --json) instead of planning")
    p.add_argument("--device", help="cpu or cuda (default: cuda when torch sees a GPU)")
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--seed", type=int, default=0, help="seed for --sample (default 0)")
    p.add_argument("--save-ids", type=Path, help="write the prompt and generated token ids to this JSON file")
    p.add_argument("--quiet", action="store_true", help="no plan or load summary on stderr")
    return p


@dataclass
class _Clock:
    """When the prompt went in and when each new token came out."""

    start: float = 0.0
    prompt_seen: bool = False
    stamps: list[float] = field(default_factory=list)


def main(argv: list[str]) -> int:
    """Runs the command with ``argv`` (without the program and command names); the exit code."""
    args = _parser().parse_args(argv)
    if args.max_new_tokens < 1:
        print("trash-panda generate: error: --max-new-tokens: expected 1 or more", file=sys.stderr)
        return 2
    if args.plan is not None and any(
        v is not None for v in (args.max_vram, args.vram, args.ram, args.headroom_vram, args.resident_blocks)
    ):
        print("trash-panda generate: error: --plan replaces the planning options; give one or the other",
              file=sys.stderr)  # fmt: skip
        return 2
    if not args.quiet:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log = logging.getLogger("trash_panda")
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    try:
        return _generate(args)
    except (OSError, ValueError, ImportError) as e:
        print(f"trash-panda generate: error: {e}", file=sys.stderr)
        return 1


def _plan_options(args: argparse.Namespace) -> dict[str, Any]:
    from .plan import Plan

    if args.plan is not None:
        return {"plan": Plan.load(args.plan)}
    names = ("max_vram", "vram", "ram", "headroom_vram", "resident_blocks")
    return {n: getattr(args, n) for n in names if getattr(args, n) is not None}


def _tokenizer(folder: Path, gguf_file: str | None) -> Any:
    """The folder's tokenizer, or with a GGUF file and no tokenizer in the folder, the file's."""
    from transformers import AutoTokenizer

    own = any((folder / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))
    if gguf_file is None or own:
        return AutoTokenizer.from_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)


def _generate(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoModelForCausalLM, TextStreamer

    from . import from_pretrained, release
    from .offload.state import get_state

    options = _plan_options(args)
    if args.gguf_file is not None:
        options["gguf_file"] = args.gguf_file
    tok = _tokenizer(args.folder, args.gguf_file)
    model: Any = from_pretrained(AutoModelForCausalLM, args.folder, device=args.device, **options)
    clock = _Clock()

    class Streamer(TextStreamer):
        def put(self, value: Any) -> None:
            if clock.prompt_seen:  # the first call carries the prompt, the others one token each
                clock.stamps.append(time.perf_counter())
            clock.prompt_seen = True
            super().put(value)  # type: ignore[no-untyped-call]

        def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
            print(text, end="\n" if stream_end else "", flush=True)

    try:
        inputs = tok(args.prompt, return_tensors="pt").to(model.device)
        gen: dict[str, Any] = {"max_new_tokens": args.max_new_tokens, "use_cache": True, "do_sample": args.sample}
        if args.sample:
            torch.manual_seed(args.seed)
        else:
            gen.update(temperature=None, top_p=None, top_k=None)
        print(args.prompt, end="", flush=True)
        clock.start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**inputs, streamer=Streamer(tok, skip_prompt=True), **gen)
        end = time.perf_counter()
        state = get_state(model)
        assert state is not None and state.handle is not None
        new = out[0, inputs["input_ids"].shape[1] :].tolist()
        if args.save_ids is not None:
            args.save_ids.write_text(json.dumps({"prompt": inputs["input_ids"][0].tolist(), "generated": new}))
        print(_summary(model, clock, end, len(new)), file=sys.stderr)
    finally:
        release(model)
    return 0


def _summary(model: nn.Module, clock: _Clock, end: float, tokens: int) -> str:
    from .offload.state import get_state
    from .plan import Tier

    state = get_state(model)
    assert state is not None and state.handle is not None
    stats = state.handle.stats()
    first = (clock.stamps[0] if clock.stamps else end) - clock.start
    rest = (end - clock.stamps[0]) / max(len(clock.stamps) - 1, 1) if len(clock.stamps) > 1 else 0.0
    total = end - clock.start
    resident = sum(s.info.nbytes for b in state.blocks if b.tier == Tier.DEVICE for s in b.tensors)
    lines = [
        f"\n{tokens} tokens in {total:.2f} s: first token {first:.2f} s (the prompt), then {rest:.2f} s per token",
        f"  device-resident blocks: {resident / 1e9:.2f} GB held, read once at load",
    ]
    if stats is not None:
        lines.append(f"  RAM tier: {stats.ram_bytes / 1e9:.2f} GB staged, {stats.ram_bytes / 1e9 / total:.2f} GB/s")
        mode = state.report.disk_mode if state.report is not None else None
        rate = stats.disk_bytes / 1e9 / total
        disk_line = (
            f"  disk tier ({mode or '-'} reads): {stats.disk_bytes / 1e9:.2f} GB read, {rate:.2f} GB/s over the run"
        )
        drive = _drive_speed(state) if stats.disk_bytes else None
        if drive is not None:
            disk_line += (
                f", {rate / drive:.2f}x the drive's direct-read speed ({drive:.2f} GB/s, same file, just after)"
            )
            if mode == "buffered":
                disk_line += "; buffered reads come from the page cache where the file's pages are there"
        lines.append(disk_line)
        lines.append(
            f"  waited for blocks: {stats.compute_waited_seconds:.2f} s of {total:.2f} s"
            f" ({stats.hits} staged in time, {stats.misses} not)"
        )
    return "\n".join(lines)


def _drive_speed(state: Any, limit: int = 1 << 30) -> float | None:
    """GB/s of plain O_DIRECT reads of (up to ``limit`` bytes of) the disk tier's tensors, into
    one reused buffer: the drive's direct-read speed on the same file, for comparison."""
    import torch

    from . import _core
    from .plan import Tier

    ranges = [(s.info.file, s.info.start, s.info.end) for b in state.blocks if b.tier == Tier.DISK for s in b.tensors]
    if not ranges:
        return None
    piece = 64 << 20
    raw = torch.empty(piece + 8192, dtype=torch.uint8)
    raw.fill_(0)  # touched once: first-touch memory would be measured otherwise
    done, t = 0, time.perf_counter()
    for path, start, stop in ranges:
        pos = start - start % 4096
        while pos < stop and done < limit:
            n = min(piece, (stop - pos) // 4096 * 4096)  # whole pages inside the range: no read past the end
            if n == 0:
                break
            shift = (pos - raw.data_ptr()) % 4096
            try:
                _core.read_tensors(os.fspath(path), [(pos, raw[shift : shift + n])], threads=4, direct=True)
            except OSError:
                return None  # a file system without O_DIRECT: no reference to give
            done += n
            pos += n
        if done >= limit:
            break
    seconds = time.perf_counter() - t
    return done / seconds / 1e9 if seconds > 0 else None
