"""plan(), Plan and Tier from Python, with injected memory figures so the plan is fixed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from models import Tiny, TwoLists, on_meta, save
from trash_panda import ArgumentError, Plan, PlanError, Tier, plan
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
    # and in RAM for two and a half beside the two staging buffers.
    p = plan(
        model,
        tiny_ckpt,
        vram=b.cuda_floor + outside + 2 * buffer + 2 * BLOCK + BLOCK // 2,  # no floor unless a GPU computes
        ram=2 * buffer + 2 * BLOCK + BLOCK // 2,
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
    gpu = Plan(_core.make_plan(tensors, prefixes, 2_000_000_000, True, ram=8_000_000_000))
    assert str(gpu).startswith("automatic plan: 6 blocks, device gpu, "), str(gpu)
    assert " = free VRAM 2.00 GB - " in str(gpu)
    assert '"device": "cpu"' not in gpu.to_json()
