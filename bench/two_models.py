"""Two models at once under one RAM budget, against the plain pipelines and the peers' offloading
on the same models (not a test):

    PYTHONPATH=python:tests .venv/bin/python bench/two_models.py --case experts|controlnet|assisted [--rounds 2]

``experts``: a Wan-2.2-shaped text-to-video pipeline (diffusers' WanPipeline) whose two experts
are Wan 1.3B-shaped transformers (dim 1536, 30 layers, 1.42 B parameters, 2.84 GB in bf16 each),
``boundary_ratio`` 0.875, 8 steps with guidance (two calls a step), a 32 x 32 latent, one frame;
its text encoder and VAE are tiny (they are not what is measured). Budget 4.5 GB, below the two
experts together (5.7 GB). The peers' experts are cast wholly to bf16 after diffusers' load (it
keeps a Wan transformer's norms and time embedding in fp32, as trash-panda does not yet), so
that every way computes the same arithmetic.
``controlnet``: StableDiffusionControlNetPipeline with an SD 1.5-shaped UNet (block widths
320-1280, 0.86 B parameters) and ControlNet (0.36 B), bf16, 6 steps with guidance, a 32 x 32
latent; tiny text encoder and VAE. Budget 1.8 GB, below the two together (2.4 GB).
``assisted``: transformers' assisted generation, a Llama target of 1.1 B parameters (2.2 GB,
hidden 2048, 22 layers) and a draft of 0.16 B (4 layers of the same width), bf16, greedy, 32 new
tokens. Budget 1.8 GB for both, below them together (2.5 GB). Random weights: the draft's
tokens are rarely accepted (the acceptance is in the table); the engine is what is measured.

Ways, each in a process of its own started with every file dropped from the page cache, the
order rotated from round to round; each process calls the pipeline three times (the first call
cold, then steady):
  plain           every model loaded in RAM (diffusers' or transformers' from_pretrained): the
                  compute alone once loaded, and the reference output
  model_offload   diffusers' enable_model_cpu_offload(device="cpu"): on a machine without a GPU
                  every model stays in RAM (what it would hold)
  group_offload   diffusers' enable_group_offload to a disk folder, block level, on the large
                  models (the peers' only way on the CPU to hold less than the models)
  accelerate      (assisted) the target with accelerate's device_map and max_memory, the rest
                  offloaded to a disk folder; the draft in RAM
  target_alone    (assisted) the target alone, plain: tokens per second without a draft
  trash_panda     load_pipeline(chain=True, ram=budget) (the experts a group that takes turns, a
                  ControlNet and its UNet a group loaded together), or from_pretrained for the
                  draft and then the target beside it (ram=budget)

The ways that hold less than the models (group_offload, accelerate, trash_panda) each run in a
memory cgroup (v1) limited to the budget and 1 GB (the interpreter, torch, the small
components and the activations), the page cache included: on a machine with RAM to spare a way
would otherwise keep its offloaded weights in the page cache, where a machine short of RAM
could not. The others hold every model in RAM and run without a limit.

Per way: the first call, the steady call (mean of calls 2 and 3), the peak RSS less the RSS
before the models were loaded, the cgroup's peak (RSS and page cache), whether the output
equals plain's bit for bit, and for the experts the switch step's stall (the low-noise
expert's first call of a steady call, less its median call). The ideal beside them: the plain
compute, and the reads the budget forces per call (the models' bytes beyond the budget, at the
drive's speed measured by dd iflag=direct before and after the ways). Writes
bench/results/two-models-<case>.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import torch
from _common import DATA, RESULTS, cold, dd_direct, machine, md_table

HERE = DATA / "two-models"
CALLS = 3
STEPS = {"experts": 8, "controlnet": 6}
BUDGETS = {"experts": 4_500_000_000, "controlnet": 1_800_000_000, "assisted": 1_800_000_000}
WAYS = {
    "experts": ["plain", "model_offload", "group_offload", "trash_panda"],
    "controlnet": ["plain", "model_offload", "group_offload", "trash_panda"],
    "assisted": ["target_alone", "plain", "accelerate", "trash_panda"],
}
LARGE = {"experts": ["transformer", "transformer_2"], "controlnet": ["controlnet", "unet"]}


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# -- the models, written once ------------------------------------------------------------------


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Random weights that keep activations in range: a matrix or kernel scaled by its fan-in, a
    norm's scale near 1, a bias near 0."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.dim() > 1:
                value = noise * (0.5 / max(p[0].numel(), 1) ** 0.5)
            elif name.endswith("weight"):
                value = 1.0 + 0.02 * noise
            else:
                value = 0.02 * noise
            p.copy_(value.to(p.dtype))


def _make_experts(folder: Path) -> None:
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    from support.two_models import _letters_tokenizer

    tokenizer = _letters_tokenizer()
    text = UMT5EncoderModel(
        UMT5Config(vocab_size=len(tokenizer), d_model=4096, d_kv=16, d_ff=64, num_layers=1, num_heads=4)
    ).eval()
    vae = AutoencoderKLWan(
        base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
    ).eval()
    experts = []
    for i in range(2):
        expert = WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
            text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024,
        ).to(torch.bfloat16).eval()  # fmt: skip
        _randomize(expert, 10 + i)
        experts.append(expert)
    for i, m in enumerate((text, vae)):
        _randomize(m, 20 + i)
    pipe = WanPipeline(
        tokenizer=tokenizer, text_encoder=text, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0),
        transformer=experts[0], transformer_2=experts[1], boundary_ratio=0.875,
    )  # fmt: skip
    pipe.save_pretrained(folder, safe_serialization=True)


def _make_controlnet(folder: Path) -> None:
    from diffusers import (
        ControlNetModel,
        StableDiffusionControlNetPipeline,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )

    from support.hf_folders import make_sd

    tiny = StableDiffusionPipeline.from_pretrained(make_sd(Path(tempfile.mkdtemp()) / "sd"))
    shape: dict[str, Any] = {
        "block_out_channels": (320, 640, 1280, 1280),
        "layers_per_block": 2,
        "in_channels": 4,
        "down_block_types": ("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        "cross_attention_dim": 32,
        "attention_head_dim": 8,
    }
    unet = UNet2DConditionModel(
        **shape, out_channels=4, sample_size=32, up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3
    ).to(torch.bfloat16)
    controlnet = ControlNetModel(**shape, conditioning_embedding_out_channels=(16, 32)).to(torch.bfloat16)
    _randomize(unet, 30)
    _randomize(controlnet, 31)
    pipe = StableDiffusionControlNetPipeline(
        vae=tiny.vae, text_encoder=tiny.text_encoder, tokenizer=tiny.tokenizer, unet=unet, controlnet=controlnet,
        scheduler=tiny.scheduler, safety_checker=None, feature_extractor=None, requires_safety_checker=False,
    )  # fmt: skip
    pipe.save_pretrained(folder, safe_serialization=True)


def _make_assisted(folder: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    for name, layers, seed in (("target", 22, 40), ("draft", 4, 41)):
        config = LlamaConfig(
            hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers, num_attention_heads=32,
            num_key_value_heads=4, vocab_size=32000, max_position_embeddings=512, tie_word_embeddings=False,
            pad_token_id=0, bos_token_id=1, eos_token_id=2,
        )  # fmt: skip
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
        _randomize(model, seed)
        model.save_pretrained(folder / name)


MAKERS: dict[str, Callable[[Path], None]] = {
    "experts": _make_experts,
    "controlnet": _make_controlnet,
    "assisted": _make_assisted,
}


def folder_of(case: str) -> Path:
    folder = HERE / case
    if not (folder / "done").is_file():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        MAKERS[case](folder)
        (folder / "done").write_text("")
    return folder


def files_of(case: str) -> list[Path]:
    return sorted(p for p in folder_of(case).rglob("*.safetensors"))


def large_bytes(case: str) -> int:
    folder = folder_of(case)
    names = LARGE.get(case, ["target", "draft"])
    return sum(p.stat().st_size for n in names for p in (folder / n).glob("*.safetensors"))


# -- one way, in a process of its own ----------------------------------------------------------


def _timed_calls(models: dict[str, torch.nn.Module]) -> list[tuple[str, float, float]]:
    """Notes each top-level call of ``models`` (name, start, end)."""
    calls: list[tuple[str, float, float]] = []
    depth = dict.fromkeys(models, 0)
    starts: dict[str, float] = {}
    for name, model in models.items():

        def pre(_m: Any, _a: Any, name: str = name) -> None:
            depth[name] += 1
            if depth[name] == 1:
                starts[name] = time.perf_counter()

        def post(_m: Any, _a: Any, _o: Any, name: str = name) -> None:
            depth[name] -= 1
            if depth[name] == 0:
                calls.append((name, starts[name], time.perf_counter()))

        model.register_forward_pre_hook(pre)
        model.register_forward_hook(post)
    return calls


def _diffusers_child(case: str, way: str, ram: int) -> dict[str, Any]:
    import trash_panda as tp
    from trash_panda.diffusers import load_pipeline, pipeline_report

    folder = folder_of(case)
    if case == "experts":
        from diffusers import WanPipeline

        cls: Any = WanPipeline

        def call(p: Any) -> torch.Tensor:
            with torch.no_grad():
                out = p(
                    prompt="a raccoon in the snow", negative_prompt="blur", max_sequence_length=16, height=256,
                    width=256, num_frames=1, num_inference_steps=STEPS["experts"], guidance_scale=4.0,
                    output_type="pt",
                    generator=torch.Generator().manual_seed(0),
                )  # fmt: skip
            return out.frames

        stream = ["transformer", "transformer_2"]
    else:
        from diffusers import StableDiffusionControlNetPipeline

        cls = StableDiffusionControlNetPipeline

        guide = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(3))

        def call(p: Any) -> torch.Tensor:
            with torch.no_grad():
                out = p(
                    "a raccoon at night", image=guide, num_inference_steps=STEPS["controlnet"], height=64, width=64,
                    guidance_scale=3.0,
                    output_type="pt", generator=torch.Generator().manual_seed(0),
                )  # fmt: skip
            return out.images

        stream = ["controlnet", "unet"]
    base = _rss()
    started = time.perf_counter()
    report = ""
    scratch: Path | None = None
    if way == "trash_panda":
        # Every component streamed and computed in bf16, as the peers' from_pretrained casts
        # them (a component left to diffusers would load in fp32 beside them).
        every = ["text_encoder", *stream, "vae"]
        pipe = load_pipeline(cls, folder, stream=every, chain=True, dtype=torch.bfloat16, ram=ram, min_free_ram=0)
    else:
        pipe = cls.from_pretrained(folder, torch_dtype=torch.bfloat16)
        for name in stream:
            # Wholly in bf16, as the checkpoint is and trash-panda computes it: diffusers keeps a
            # Wan transformer's norms and time embedding in fp32 (_keep_in_fp32_modules).
            getattr(pipe, name).to(torch.bfloat16)
        if way == "model_offload":
            pipe.enable_model_cpu_offload(device="cpu")
        elif way == "group_offload":
            scratch = Path(tempfile.mkdtemp(dir=HERE))
            for name in stream:
                getattr(pipe, name).enable_group_offload(
                    onload_device=torch.device("cpu"), offload_device=torch.device("cpu"), offload_type="block_level",
                    num_blocks_per_group=1, offload_to_disk_path=str(scratch / name),
                )  # fmt: skip
    load_s = time.perf_counter() - started
    calls = _timed_calls({n: getattr(pipe, n) for n in stream})
    times, outs = [], []
    for _ in range(CALLS):
        t = time.perf_counter()
        outs.append(call(pipe))
        times.append(time.perf_counter() - t)
    if way == "trash_panda":
        report = pipeline_report(pipe)
        tp.diffusers.release_pipeline(pipe)
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)  # a copy of the models each time
    result = _result(case, way, load_s, times, base, outs[-1], calls, stream)
    result["report"] = report
    return result


def _assisted_child(way: str, ram: int) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    import trash_panda as tp

    folder = folder_of("assisted")
    ids = torch.randint(3, 32000, (1, 24), generator=torch.Generator().manual_seed(0))
    base = _rss()
    started = time.perf_counter()
    draft: Any = None
    scratch: Path | None = None
    if way == "trash_panda":
        draft = tp.from_pretrained(AutoModelForCausalLM, folder / "draft", ram=ram, min_free_ram=0)
        target = tp.from_pretrained(AutoModelForCausalLM, folder / "target", ram=ram, min_free_ram=0, beside=[draft])
    elif way == "accelerate":
        draft = AutoModelForCausalLM.from_pretrained(folder / "draft", dtype=torch.bfloat16)
        left = ram - sum(p.stat().st_size for p in (folder / "draft").glob("*.safetensors"))
        scratch = Path(tempfile.mkdtemp(dir=HERE))
        target = AutoModelForCausalLM.from_pretrained(
            folder / "target", dtype=torch.bfloat16, device_map="auto", max_memory={"cpu": left},
            offload_folder=str(scratch),
        )  # fmt: skip
    else:
        target = AutoModelForCausalLM.from_pretrained(folder / "target", dtype=torch.bfloat16)
        if way == "plain":
            draft = AutoModelForCausalLM.from_pretrained(folder / "draft", dtype=torch.bfloat16)
    load_s = time.perf_counter() - started
    calls = _timed_calls({"target": target})
    times, outs = [], []
    for _ in range(CALLS):
        t = time.perf_counter()
        with torch.no_grad():
            kw: dict[str, Any] = {} if draft is None else {"assistant_model": draft}
            generate: Any = target.generate
            outs.append(generate(ids, max_new_tokens=32, do_sample=False, pad_token_id=0, **kw))
        times.append(time.perf_counter() - t)
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)
    result = _result("assisted", way, load_s, times, base, outs[-1], [], [])
    result["tokens_per_s"] = 32 / statistics.mean(times[1:])
    result["target_calls"] = len(calls) / CALLS
    if way == "trash_panda":
        state = tp.offload.state.get_state(draft)
        result["draft_tiers"] = sorted({str(b.tier) for b in state.plan.blocks}) if state is not None else []
        tstate = tp.offload.state.get_state(target)
        result["plans"] = {
            "draft": str(state.plan.table()) if state else "",
            "target": str(tstate.plan.table()) if tstate else "",
        }
    return result


def _result(
    case: str,
    way: str,
    load_s: float,
    times: list[float],
    base: int,
    out: torch.Tensor,
    calls: list[Any],
    stream: list[str],
) -> dict[str, Any]:
    reference = HERE / f"{case}-reference.pt"
    if way == "plain":
        torch.save(out, reference)
    equal = bool(reference.is_file() and torch.equal(torch.load(reference), out))
    stall = None
    if len(stream) == 2 and calls:
        # The last (steady) pipeline call's calls of the second model: its first, less their median.
        seconds = [c[2] - c[1] for c in calls[-(len(calls) // CALLS) :] if c[0] == stream[1]]
        if len(seconds) > 1:
            stall = seconds[0] - statistics.median(seconds[1:])
    return {
        "way": way,
        "load_s": load_s,
        "first_s": times[0],
        "steady_s": statistics.mean(times[1:]),
        "peak_gb": (_peak() - base) / 1e9,
        "equal": equal,
        "stall_s": stall,
    }


def child(case: str, way: str, ram: int) -> None:
    torch.manual_seed(0)
    out = _assisted_child(way, ram) if case == "assisted" else _diffusers_child(case, way, ram)
    print("RESULT " + json.dumps(out))


# -- the rounds --------------------------------------------------------------------------------


# The ways that hold less than the models: each runs in a memory cgroup of the budget and
# OVERHEAD (the interpreter, torch, the small components, activations), page cache included,
# so that a way cannot hold its offloaded weights in the page cache of a machine with RAM to spare.
LIMITED = {"group_offload", "accelerate", "trash_panda"}
OVERHEAD = 1_000_000_000
TIMEOUT_S = 420  # a way that thrashes at the limit is stopped: its three calls took longer than this
CGROUP = Path("/sys/fs/cgroup/memory/trash-panda-bench")


def _limit(nbytes: int) -> bool:
    """Makes the cgroup with its limit; False where the machine has no cgroup v1 memory
    controller we may use."""
    try:
        CGROUP.mkdir(exist_ok=True)
        (CGROUP / "memory.limit_in_bytes").write_text(str(nbytes))
        (CGROUP / "memory.max_usage_in_bytes").write_text("0")
        return True
    except OSError:
        return False


def run_way(case: str, way: str, ram: int) -> dict[str, Any]:
    for f in files_of(case):
        cold(f)
    python = Path(__file__).resolve().parent.parent / "python"
    env = {**os.environ, "PYTHONPATH": f"{python}:{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, __file__, "--child", case, way, str(ram)]
    limited = way in LIMITED and _limit(ram + OVERHEAD)
    if limited:
        # The shell joins the cgroup, then becomes the child: all its memory is charged there.
        cmd = ["sh", "-c", f'echo $$ > {CGROUP / "cgroup.procs"} && exec "$0" "$@"', *cmd]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        for scratch in HERE.glob("tmp*"):
            shutil.rmtree(scratch, ignore_errors=True)
        return {
            "way": way,
            "failed": f"not done in {TIMEOUT_S} s",
            "limit_gb": (ram + OVERHEAD) / 1e9 if limited else None,
        }
    for scratch in HERE.glob("tmp*"):  # a way stopped before it cleaned up
        shutil.rmtree(scratch, ignore_errors=True)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        # A way that cannot run in the budget (killed at the cgroup's limit) is a result too.
        print(f"{case} {way} failed ({proc.returncode}):\n{proc.stderr[-2000:]}", file=sys.stderr)
        why = "killed at the memory limit" if proc.returncode in (-9, 137) else f"failed ({proc.returncode})"
        return {"way": way, "failed": why, "limit_gb": (ram + OVERHEAD) / 1e9 if limited else None}
    result: dict[str, Any] = json.loads(line[len("RESULT ") :])
    result["limit_gb"] = (ram + OVERHEAD) / 1e9 if limited else None
    if limited:
        result["cgroup_peak_gb"] = int((CGROUP / "memory.max_usage_in_bytes").read_text()) / 1e9
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", choices=list(WAYS), required=False)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ram", type=int, default=None, help="the budget in bytes (default: the case's)")
    ap.add_argument("--child", nargs=3, metavar=("CASE", "WAY", "RAM"))
    ap.add_argument("--table", action="store_true", help="write the table again from the last run's figures")
    args = ap.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return
    if args.table:
        case = args.case or "experts"
        raw = json.loads((RESULTS / f"two-models-{case}.json").read_text())
        write(case, folder_of(case), raw["ram"], raw["drive"], raw["rows"])
        return
    case = args.case or "experts"
    ram = args.ram or BUDGETS[case]
    folder = folder_of(case)
    big = max(files_of(case), key=lambda p: p.stat().st_size)
    cold(big)
    whole = big.stat().st_size // 4096 * 4096  # O_DIRECT reads whole pages
    drive = [dd_direct(big, 0, whole)]
    ways = WAYS[case]
    rows: dict[str, list[dict[str, Any]]] = {w: [] for w in ways}
    # The reference first (the output every other way is compared with), then rotated rounds.
    first = "plain"
    rows[first].append(run_way(case, first, ram))
    for r in range(args.rounds):
        order = ways[r % len(ways) :] + ways[: r % len(ways)]
        for way in order:
            if way == first and r == 0:
                continue
            rows[way].append(run_way(case, way, ram))
            print(case, way, json.dumps({k: v for k, v in rows[way][-1].items() if k not in ("report", "plans")}))
    cold(big)
    drive.append(dd_direct(big, 0, whole))
    raw = RESULTS / f"two-models-{case}.json"
    raw.write_text(json.dumps({"ram": ram, "drive": drive, "rows": rows}, indent=1))
    write(case, folder, ram, drive, rows)


def _fmt(values: list[float | None], unit: str = "", digits: int = 2) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    return " / ".join(f"{v:.{digits}f}" for v in vals) + unit


def write(case: str, folder: Path, ram: int, drive: list[float], rows: dict[str, list[dict[str, Any]]]) -> None:
    big = large_bytes(case)
    plain = rows["plain"]
    compute = statistics.mean(r["steady_s"] for r in plain)
    drive_gbps = max(drive)  # the faster of the two: the ideal is not to flatter
    # What the budget forces to be read per call, at least: experts that take turns and fit
    # alone, what the two hold beyond the budget, once; members that run at every step (a
    # ControlNet and its UNet), that much at every step; a target beside its draft, that much at
    # each of its calls (as many as the plain run made).
    repeat = {"experts": 1.0, "controlnet": float(STEPS["controlnet"])}.get(case)
    if repeat is None:
        repeat = statistics.mean(r.get("target_calls", 1.0) for r in plain)
    forced = max(0, big - ram) * repeat
    forced_s = forced / 1e9 / drive_gbps
    header = [
        "way",
        "first call s",
        "steady call s",
        "steady / plain",
        "peak RSS GB (less base)",
        "cgroup peak GB (limit)",
        "bit-equal",
    ]
    if case == "experts":
        header.append("switch stall s")
    if case == "assisted":
        header.append("tokens/s")
    table = []
    for way, all_results in rows.items():
        failed = [r["failed"] for r in all_results if "failed" in r]
        results = [r for r in all_results if "failed" not in r]
        if not results:
            table.append([way, "-", "; ".join(failed), *(["-"] * (len(header) - 3))])
            continue
        steady = [r["steady_s"] for r in results]
        row = [
            way,
            _fmt([r["first_s"] for r in results]),
            _fmt(steady),
            f"{statistics.mean(steady) / compute:.2f}",
            _fmt([r["peak_gb"] for r in results]),
            _fmt([r.get("cgroup_peak_gb") for r in results])
            + (f" ({results[0]['limit_gb']:.2f})" if results[0].get("limit_gb") else ""),
            ("yes" if all(r["equal"] for r in results) else "no") + (f"; {', '.join(failed)}" if failed else ""),
        ]
        if case == "experts":
            row.append(_fmt([r["stall_s"] for r in results]))
        if case == "assisted":
            row.append(_fmt([r.get("tokens_per_s") for r in results], digits=1))
        table.append(row)
    m = machine(folder)
    ours = [r for r in rows["trash_panda"] if "failed" not in r][-1]
    text = [
        f"# Two models at once: {case}",
        "",
        f"Machine: {m['cpu']}, {m['nproc']} CPUs, {m['ram']} RAM, {m['fs']}; torch {m['torch']}; {m['date']}.",
        f"Command: `PYTHONPATH=python:tests .venv/bin/python bench/two_models.py --case {case} --rounds "
        f"{len(rows['trash_panda'])}` (method: the module's docstring).",
        "",
        f"Budget {ram / 1e9:.2f} GB for models of {big / 1e9:.2f} GB; the drive (dd iflag=direct, before and "
        f"after): {' / '.join(f'{d:.2f}' for d in drive)} GB/s. Ideal per steady call: the plain compute "
        f"{compute:.2f} s, and {forced / 1e9:.2f} GB the budget forces to be read per call, at least "
        f"({forced_s:.2f} s at "
        f"the faster drive's speed): {max(compute, forced_s):.2f} s with the reads all behind the compute, "
        f"{compute + forced_s:.2f} s with none. trash-panda's steady call: {ours['steady_s']:.2f} s, "
        f"{ours['steady_s'] / max(compute, forced_s):.2f}x the first, {ours['steady_s'] / (compute + forced_s):.2f}x "
        "the second.",
        "",
        "Each cell lists the rounds' values.",
        "",
        md_table(header, table),
        "",
    ]
    if ours.get("report"):
        text += ["trash-panda's report (its last process):", "", "```", ours["report"].rstrip(), "```", ""]
    if ours.get("plans"):
        text += ["trash-panda's plans (its last process):", "", "```"]
        text += [f"{k}:\n{v}" for k, v in ours["plans"].items()]
        text += ["```", ""]
    out = RESULTS / f"two-models-{case}.md"
    out.write_text("\n".join(text))
    print(out.read_text())


if __name__ == "__main__":
    main()
