"""diffusers' model-level LoRA calls on a streamed Flux-shaped transformer (every tier: a
resident block, blocks in RAM and on disk, the weights outside the blocks), in fp32 and bf16:
load_lora_adapter, a second adapter, set_adapters with new weights, fuse_lora (also run as a
final pass), unfuse_lora and unload_lora each give the outputs of the plain transformer after
the same calls; and the same LoRA saved in kohya's naming through trash_panda.load_adapter."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file, save_model

import trash_panda
from support.diffusion_models import flux
from support.hf_folders import randomize
from trash_panda import Plan, Tier
from trash_panda.offload.merges import merged_layers

diffusers = pytest.importorskip("diffusers")
peft = pytest.importorskip("peft")

from peft import LoraConfig, get_peft_model_state_dict, inject_adapter_in_model  # noqa: E402

# In the blocks (attention, the single blocks' MLP and output) and outside them (the input
# embedder and the output projection).
TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "proj_mlp", "proj_out", "x_embedder"]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _lora(build: Callable[[], torch.nn.Module], dtype: torch.dtype, rank: int, seed: int) -> dict[str, torch.Tensor]:
    """A LoRA of the transformer made by PEFT (random B, so it changes the output), under
    diffusers' ``transformer.`` prefix."""
    model = build().to(dtype)
    torch.manual_seed(seed)
    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS, init_lora_weights=False)
    inject_adapter_in_model(cfg, model, adapter_name="x")
    state = get_peft_model_state_dict(model, adapter_name="x")
    return {f"transformer.{k}": v.contiguous() for k, v in state.items()}


def _kohya(state: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    """The same LoRA in kohya's naming: ``lora_unet_<path with _>.lora_down/lora_up/alpha``."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        path, part = key.removeprefix("transformer.").rsplit(".lora_", 1)
        stem = "lora_unet_" + path.replace(".", "_")
        out[f"{stem}.{'lora_down' if part.startswith('A') else 'lora_up'}.weight"] = value
        out[f"{stem}.alpha"] = torch.tensor(float(rank))  # diffusers loads a PEFT LoRA with alpha = rank
    return out


def _steps(loras: dict[str, dict[str, torch.Tensor]]) -> list[tuple[str, Callable[[Any], None]]]:
    return [
        ("load a", lambda m: m.load_lora_adapter(dict(loras["a"]), adapter_name="a")),
        ("load b", lambda m: m.load_lora_adapter(dict(loras["b"]), adapter_name="b")),
        ("set_adapters", lambda m: m.set_adapters(["a", "b"], weights=[0.7, -0.5])),
        ("unload", lambda m: m.unload_lora()),
        ("load a again", lambda m: m.load_lora_adapter(dict(loras["a"]), adapter_name="a")),
        ("fuse_lora", lambda m: m.fuse_lora(lora_scale=0.8, adapter_names=["a"])),
        ("unfuse_lora", lambda m: m.unfuse_lora()),
    ]


def _streamed(build: Callable[[], torch.nn.Module], dtype: torch.dtype, path: Path) -> Any:
    with trash_panda.empty_weights():
        model = build().to(dtype).eval()
    names = [b.prefix for b in trash_panda.blocks.find_blocks(model)]
    plan = Plan.manual(resident=names[:1], streamed=names[1:], streamed_tier="ram")
    plan.assign(Tier.DISK, indices=list(range(2, len(names), 2)))
    assert all(plan.blocks_in(t) for t in (Tier.DEVICE, Tier.RAM, Tier.DISK))
    trash_panda.stream_load(model, path, plan=plan, device="cpu")
    return model, trash_panda.install_offload(model)


@pytest.mark.parametrize(("dtype", "final"), [("fp32", False), ("bf16", False), ("fp32", True)])
def test_flux_lora_calls_equal_plain(tmp_path: Path, dtype: str, final: bool) -> None:
    torch_dtype = DTYPES[dtype]
    build, inputs = flux()
    plain = build().to(torch_dtype).eval()
    randomize(plain)
    path = tmp_path / "diffusion_pytorch_model.safetensors"
    save_model(plain, str(path))
    loras = {"a": _lora(build, torch_dtype, 4, 10), "b": _lora(build, torch_dtype, 2, 11)}
    x = inputs(torch_dtype)

    def out(m: Any) -> torch.Tensor:
        with torch.no_grad():
            result: torch.Tensor = m(**x).sample
        return result

    none = out(plain)
    want = {}
    for name, step in _steps(loras):
        step(plain)
        want[name] = out(plain)
    assert not torch.equal(want["load a"], none) and not torch.equal(want["set_adapters"], want["load b"])

    model, handle = _streamed(build, torch_dtype, path)
    try:
        assert torch.equal(out(model), none)
        for name, step in _steps(loras):
            step(model)
            got = out(model)
            if name == "unfuse_lora":
                # The plain model subtracts what it added, which is not always the bits it had;
                # the streamed layers hold the checkpoint's again (the layers held in memory are
                # PEFT's on both), so the output is at least as near the one never fused.
                never = want["load a again"]
                assert (got - never).abs().max() <= (want[name] - never).abs().max()
                assert not any(merged_layers(m) for m in model.modules())
                continue
            assert torch.equal(got, want[name]), name
            if name == "load a":
                q = model.single_transformer_blocks[-1].attn.to_q
                assert q.base_layer.weight.is_meta and q.lora_A["a"].weight.dtype == torch_dtype
            if name == "fuse_lora":
                assert torch.equal(out(model), want[name])  # on the kept merges
                if final:  # the last call: each block is freed after its run
                    with handle.final_pass():
                        assert torch.equal(out(model), want[name])
                    break
    finally:
        trash_panda.release(model, handle)


def test_flux_lora_in_kohya_naming_through_load_adapter(tmp_path: Path) -> None:
    """The same LoRA saved in kohya's naming, put on with trash_panda.load_adapter: unmerged it
    gives the plain transformer carrying it unmerged; merged where the plan keeps merges (auto),
    the plain one with PEFT's merge on those layers."""
    build, inputs = flux()
    plain = build().eval()
    randomize(plain)
    path = tmp_path / "diffusion_pytorch_model.safetensors"
    save_model(plain, str(path))
    lora = _lora(build, torch.float32, 4, 10)
    kohya = tmp_path / "flux-kohya.safetensors"
    save_file(_kohya(lora, 4), str(kohya))
    x = inputs(torch.float32)
    plain.load_lora_adapter(dict(lora), adapter_name="a")
    assert plain.transformer_blocks[0].attn.to_q.scaling["a"] == 1.0
    with torch.no_grad():
        unmerged = plain(**x).sample
    model, handle = _streamed(build, torch.float32, path)
    try:
        with torch.no_grad():
            adapter = trash_panda.load_adapter(model, kohya, name="a", mode="unmerged")
            assert sorted(adapter.layers) == sorted(n for n, m in plain.named_modules() if hasattr(m, "lora_A"))
            assert torch.equal(model(**x).sample, unmerged)
            trash_panda.release(model, handle)
            model, handle = _streamed(build, torch.float32, path)
            adapter = trash_panda.load_adapter(model, kohya, name="a")
            merged = [n for n, why in adapter.modes.items() if why.startswith("merged")]
            assert merged and len(merged) < len(adapter.layers)  # the resident block is held in memory
            by_name = dict(plain.named_modules())
            for n in merged:
                by_name[n].merge(adapter_names=["a"])
            want = plain(**x).sample
            assert torch.equal(model(**x).sample, want)
            assert torch.equal(model(**x).sample, want)
    finally:
        trash_panda.release(model, handle)
