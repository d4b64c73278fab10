"""plan(), Plan and Tier from Python, with injected memory figures so the plan is fixed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from support.models import Tiny, TwoLists, on_meta, save
from trash_panda import ArgumentError, Plan, PlanError, Tier, _core, plan
from trash_panda.blocks import find_blocks

# One block of Tiny(dim=64) in fp32: norm 2*64 + up 64*256+256 + down 256*64+64 floats.
BLOCK = (2 * 64 + 64 * 256 + 256 + 256 * 64 + 64) * 4


@pytest.fixture
def tiny_ckpt(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    return save(Tiny(), tmp_path / "tiny.safetensors")


def test_finds_blocks_on_meta_model() -> None:
    model = on_meta(Tiny)
    assert [b.prefix for b in find_blocks(model)] == [f"blocks.{i}." for i in range(6)]
    two = on_meta(TwoLists)
    assert [b.prefix for b in find_blocks(two)] == [f"double_blocks.{i}." for i in range(3)] + [
        f"single_blocks.{i}." for i in range(4)
    ]
    assert [b.prefix for b in find_blocks(two, ["single_blocks", "double_blocks.0."])] == [
        *(f"single_blocks.{i}." for i in range(4)),
        "double_blocks.0.",
    ]
    with pytest.raises(ArgumentError, match="single_blocks.9"):
        find_blocks(two, ["single_blocks.9."])


def test_plan_fills_device_then_ram_then_disk(tiny_ckpt: Path) -> None:
    model = on_meta(Tiny)
    fixed = {"headroom_vram": 0, "min_free_ram": 0, "compute_dtype": "f32", "lookahead": 1}
    # Every block on disk: the staging buffer the largest block needs there.
    probe = plan(model, tiny_ckpt, vram="1TB", ram=0, resident_blocks=0, **fixed)
    b = probe.budgets
    assert b is not None and b.staging_buffers == 2 and b.expansion == 0
    buffer = b.staging_buffer_bytes
    assert BLOCK <= buffer < BLOCK + 2 * 4096 and buffer % 4096 == 0
    outside = (100 * 64 + 2 * 64 + 100 * 64) * 4
    assert b.outside == outside
    # Room on the device for two blocks and a half beside two slots and the outside weights,
    # and in RAM for two and a half beside the two staging buffers and the loader's ring.
    assert b.loader_ring == _core.LOADER_RING_BYTES  # planned as a GPU
    p = plan(
        model,
        tiny_ckpt,
        vram=b.cuda_floor + outside + 2 * buffer + 2 * BLOCK + BLOCK // 2,  # no floor unless a GPU computes
        ram=2 * buffer + b.loader_ring + 2 * BLOCK + BLOCK // 2,
        **fixed,
    )
    assert [b.tier for b in p.blocks] == [Tier.DEVICE] * 2 + [Tier.RAM] * 2 + [Tier.DISK] * 2, str(p)
    assert all(b.stored_bytes == BLOCK for b in p.blocks)
    budgets = p.budgets
    assert budgets is not None
    assert (budgets.device_used, budgets.ram_used, budgets.disk_bytes) == (2 * BLOCK, 2 * BLOCK, 2 * BLOCK)
    assert (budgets.host_staging, budgets.device_slot_bytes) == (2 * buffer, 2 * buffer)
    text = str(p)
    assert "blocks.0-1" in text and "blocks.2-3" in text and "blocks.4-5" in text, text


def test_resident_blocks_and_warnings(tiny_ckpt: Path) -> None:
    p = plan(on_meta(Tiny), tiny_ckpt, vram="8GB", ram="8GB", resident_blocks=2, compute_dtype="f32")
    assert p.blocks_in("device") == ["blocks.0.", "blocks.1."]
    assert p.blocks_in(Tier.RAM) == [f"blocks.{i}." for i in range(2, 6)]
    assert any("activation" in w for w in p.warnings)
    measured = plan(on_meta(Tiny), tiny_ckpt, vram="8GB", ram="8GB", activation_vram="2.6GB")
    assert not any("not measured" in w for w in measured.warnings)


def test_no_room_anywhere_spills_to_disk(tiny_ckpt: Path) -> None:
    p = plan(on_meta(Tiny), tiny_ckpt, vram="1MB", ram=2 * BLOCK + 3 * BLOCK, min_free_ram=0, lookahead=1)
    assert p.blocks_in(Tier.DEVICE) == []
    assert p.blocks_in(Tier.DISK), str(p)
    assert any("nothing fits" in w for w in p.warnings)
    assert any("disk" in w for w in p.warnings)


def test_edits_and_their_errors(tiny_ckpt: Path) -> None:
    p = plan(on_meta(Tiny), tiny_ckpt, vram="8GB", ram="8GB")
    p.assign(Tier.DISK, indices=[5])
    assert p.tier_of("blocks.5.") == Tier.DISK
    p.assign("ram", prefixes=["blocks.3."])
    assert p.tier_of("blocks.3.") == Tier.RAM
    before = p.to_json()
    with pytest.raises(PlanError, match="6"):
        p.assign(Tier.DISK, indices=[6])
    with pytest.raises(PlanError, match="blocks.7"):
        p.assign(Tier.DISK, prefixes=["blocks.7."])
    with pytest.raises(PlanError, match="twice"):
        p.assign(Tier.DISK, indices=[1, 1])
    assert p.to_json() == before
    assert Plan.from_json(before) == p


def test_manual_plan() -> None:
    p = Plan.manual(resident=["blocks.0.", "blocks.1."], streamed=["blocks.2.", "blocks.3."])
    assert p.blocks_in(Tier.DEVICE) == ["blocks.0.", "blocks.1."]
    assert not p.resolved
    with pytest.raises(PlanError, match="blocks.1."):
        Plan.manual(resident=["blocks.1."], streamed=["blocks.1"])
    with pytest.raises(PlanError, match="overlap"):
        Plan.manual(resident=["blocks."], streamed=["blocks.1."])


def test_sizes_and_dtypes_are_checked(tiny_ckpt: Path) -> None:
    with pytest.raises(ArgumentError, match="max_vram.*9XB"):
        plan(on_meta(Tiny), tiny_ckpt, max_vram="9XB")
    with pytest.raises(ArgumentError, match="compute_dtype"):
        plan(on_meta(Tiny), tiny_ckpt, compute_dtype="float7")
    with pytest.raises(PlanError, match="version"):
        Plan.from_json('{"format": "trash-panda-plan", "version": 99}')


def test_same_inputs_same_plan(tiny_ckpt: Path) -> None:
    a = plan(on_meta(Tiny), tiny_ckpt, vram="1MB", ram="1GB")
    b = plan(on_meta(Tiny), tiny_ckpt, vram="1MB", ram="1GB")
    assert a.to_json() == b.to_json()


def test_lookahead_from_environment(tiny_ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRASH_PANDA_LOOKAHEAD", "5")
    assert '"lookahead": 5' in plan(on_meta(Tiny), tiny_ckpt, vram="1GB", ram="1GB").to_json()
    monkeypatch.setenv("TRASH_PANDA_LOOKAHEAD", "lots")
    with pytest.raises(ArgumentError, match="TRASH_PANDA_LOOKAHEAD"):
        plan(on_meta(Tiny), tiny_ckpt, vram="1GB", ram="1GB")


def test_the_table_names_the_device_that_computes(tiny_ckpt: Path) -> None:
    from trash_panda import _core
    from trash_panda.plan import planning_inputs

    model = on_meta(Tiny)
    cpu = plan(model, tiny_ckpt, device="cpu", ram="8GB")
    assert str(cpu).startswith("automatic plan: 6 blocks, device cpu (no GPU), "), str(cpu)
    # `make demo`'s plan: the CPU computes, with a device tier sized as a 2 GB GPU's.
    simulated = plan(model, tiny_ckpt, device="cpu", vram="2GB", ram="8GB")
    text = str(simulated)
    assert text.startswith("automatic plan: 6 blocks, device cpu (device tier planned as a GPU with 2.00 GB), "), text
    assert "device gpu" not in text and "free VRAM" not in text and " = vram 2.00 GB - " in text, text
    budgets = simulated.budgets
    assert budgets is not None and budgets.gpu and budgets.device_limit == 2_000_000_000
    assert '"device": "cpu"' in simulated.to_json()
    assert Plan.from_json(simulated.to_json()) == simulated
    # A plan made for a GPU (what plan() asks for on a CUDA device) says so.
    tensors, prefixes = planning_inputs(model, tiny_ckpt, None, None, None)
    gpu = _core.make_plan(tensors, prefixes, 2_000_000_000, True, ram=8_000_000_000)
    assert str(gpu).startswith("automatic plan: 6 blocks, device gpu, "), str(gpu)
    assert " = free VRAM 2.00 GB - " in str(gpu)
    assert '"device": "cpu"' not in gpu.to_json()


# Checkpoints on which hf.py's old copy of the compute-dtype rule (bytes, f64 ignored, f32 when no
# float) and the core's (elements) answered differently, and fp8 with f32 scales, on which the
# core's old rule (scales voting) picked f32.
COMPUTE_CASES = {
    # more f32 bytes (24 against 20) but more bf16 elements (10 against 6)
    "bytes_against_elements": ({"a": (torch.bfloat16, 10), "b": (torch.float32, 6)}, torch.bfloat16),
    "f64_only": ({"a": (torch.float64, 4)}, torch.float32),
    "f64_beside_bf16": ({"a": (torch.float64, 10), "b": (torch.bfloat16, 9)}, torch.float32),
    "no_float": ({"ids": (torch.int64, 9)}, torch.bfloat16),
    "empty": ({}, torch.bfloat16),
    "fp8_with_f32_scales": (
        {
            "l.0.w.weight": (torch.float8_e4m3fn, 64),
            "l.0.w.weight_scale": (torch.float32, 32),
            "l.0.norm.weight": (torch.bfloat16, 8),
            "l.0.router.weight": (torch.float32, 16),
        },
        torch.bfloat16,
    ),
}


@pytest.mark.parametrize("case", sorted(COMPUTE_CASES))
def test_compute_dtype_is_the_cores(tmp_path: Path, case: str) -> None:
    """from_pretrained and the diffusers path (hf.checkpoint_dtype) ask the core, and answer
    what the planner infers for the same tensors."""
    from safetensors.torch import save_file

    from trash_panda._dtypes import torch_dtype
    from trash_panda.checkpoint import Checkpoint
    from trash_panda.hf import checkpoint_dtype

    tensors, want = COMPUTE_CASES[case]
    path = tmp_path / "m.safetensors"
    save_file({k: torch.zeros(n).to(d) for k, (d, n) in tensors.items()}, str(path))
    ckpt = Checkpoint(path)
    assert checkpoint_dtype(ckpt) == want
    assert torch_dtype(_core.infer_compute_dtype(ckpt.tensors())) == want
    if tensors:
        planned = _core.make_plan([(t.name, t) for t in ckpt.tensors()], None, None, False, ram=1 << 30)
        assert torch_dtype(planned.compute_dtype) == want


def test_tier_names_are_the_cores(tiny_ckpt: Path) -> None:
    """Every name the core accepts works in the plan edits; a bad one gets the core's error."""
    p = plan(on_meta(Tiny), tiny_ckpt, vram="8GB", ram="8GB")
    for name, tier in [("gpu", Tier.DEVICE), ("CUDA", Tier.DEVICE), ("vram", Tier.DEVICE), ("cpu", Tier.RAM)]:
        p.assign(name, indices=[2])
        assert p.tier_of("blocks.2.") == tier
    p.assign("memory", prefixes=["blocks.4."])
    assert p.tier_of("blocks.4.") == Tier.RAM
    assert "blocks.4." in p.blocks_in("cpu")
    assert Plan.manual(["blocks.0."], ["blocks.1."], streamed_tier="disk").blocks_in("disk") == ["blocks.1."]
    assert Plan.manual(["blocks.0."], ["blocks.1."], streamed_tier="memory").blocks_in(Tier.RAM) == ["blocks.1."]
    before = p.to_json()
    with pytest.raises(
        PlanError,
        match=r"unknown tier \"tape\": expected device, ram or disk \(or an alias: gpu, cuda, vram, cpu, memory\)",
    ):
        p.assign("tape", indices=[0])
    with pytest.raises(PlanError, match="unknown tier"):
        Plan.manual(["blocks.0."], ["blocks.1."], streamed_tier="tape")
    with pytest.raises(ArgumentError, match="tier"):
        p.assign(3, indices=[0])  # type: ignore[arg-type]
    assert p.to_json() == before
    tiers = [Tier.DEVICE, Tier.RAM, Tier.DISK]
    assert [Tier(t.value) for t in tiers] == tiers and Tier("vram") == Tier.GPU == Tier.DEVICE


def test_float_dtypes_and_scale_pairing_are_the_cores(tmp_path: Path) -> None:
    """matching.py and planning_inputs ask the core which dtypes are floats and which scale
    tensor a weight pairs with; the planner counts exactly the scale the loader reads."""
    from safetensors.torch import save_file

    from trash_panda._dtypes import _HEADER_TO_TORCH
    from trash_panda.plan import planning_inputs

    for header, attr in _HEADER_TO_TORCH.items():
        if hasattr(torch, attr):
            assert _core.is_float_dtype(header) == getattr(torch, attr).is_floating_point, header
    names = {"l.weight_scale_inv": 1, "l.scale_weight": 2, "l.input_scale": 3}
    assert _core.paired_scale("l.weight", names) == "l.scale_weight"  # first in the core's order
    assert _core.paired_scale("l.weight", {"l.input_scale"}) is None  # scales activations only
    assert _core.paired_scale("l.bias", {"l.bias_scale", "l.weight_scale"}) is None
    # A block whose weight has two scale tensors: the planner counts the one the loader pairs.
    model = on_meta(Tiny)
    sd = {k: torch.zeros(v.shape) for k, v in model.state_dict().items()}
    sd["blocks.0.up.weight_scale"] = torch.ones(1)
    sd["blocks.0.up.weight_scale_inv"] = torch.ones(1)
    sd["blocks.0.up.input_scale"] = torch.ones(1)
    save_file(sd, str(tmp_path / "m.safetensors"))
    tensors, _prefixes = planning_inputs(model, tmp_path / "m.safetensors", None, None, None)
    got = {n for n, _info in tensors if n.startswith("blocks.0.up.")}
    assert got == {"blocks.0.up.weight", "blocks.0.up.bias", "blocks.0.up.weight_scale"}
