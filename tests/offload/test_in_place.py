"""Disk-tier blocks used in place on the CPU (Linux): the weights are the checkpoint's pages."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import trash_panda as tp
from support.models import Tiny, assert_writes_are_caught, save
from trash_panda import Plan, PlanError

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="blocks are used in place on Linux only")


def _load(tmp_path: Path, dtype: torch.dtype, tier: str = "disk") -> tuple[Tiny, Tiny, Any]:
    torch.manual_seed(0)
    with torch.device("cpu"):
        ref = Tiny(dim=64, layers=4, vocab=50).to(dtype).eval()
    path = save(ref, tmp_path / "m.safetensors", dtype)
    with torch.device("meta"):
        model = Tiny(dim=64, layers=4, vocab=50).to(dtype).eval()
    plan = Plan.manual(resident=["blocks.0."], streamed=["blocks.1.", "blocks.2.", "blocks.3."], streamed_tier=tier)
    tp.stream_load(model, path, plan=plan, device="cpu")
    return ref, model, tp.install_offload(model)


def _leases_in_place(ref: Tiny, model: Tiny) -> list[bool]:
    """Three passes, each equal to the plain model's; whether each lease was used in place."""
    state = model._trash_panda_state
    engine = state.engine
    acquire = engine.acquire
    seen: list[bool] = []

    def spy(index: int) -> Any:
        lease = acquire(index)
        seen.append(lease.in_place)
        return lease

    state.engine = _Spy(engine, spy)
    x = torch.randint(0, 50, (2, 5))
    try:
        with torch.no_grad():
            want = ref(x)
            for _ in range(3):
                assert torch.equal(model(x), want)
    finally:
        state.engine = engine
    return seen


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sixteen_bit_blocks_run_from_the_map_and_equal_the_plain_model(tmp_path: Path, dtype: torch.dtype) -> None:
    ref, model, handle = _load(tmp_path, dtype)
    state = model._trash_panda_state
    budgets = state.plan.budgets
    assert budgets is not None and budgets.mapped_window > 0
    # Nothing is staged for blocks used in place: one page per buffer paces the look-ahead.
    assert state.config.staging_buffer_bytes == 4096
    seen = _leases_in_place(ref, model)
    assert seen and all(seen)
    tp.release(model, handle)


@pytest.mark.parametrize("tier", ["disk", "ram"])
def test_a_write_to_a_weight_used_in_place_is_an_error_and_undone(tmp_path: Path, tier: str) -> None:
    ref, model, handle = _load(tmp_path, torch.bfloat16, tier)
    x = torch.randint(0, 50, (1, 3))
    with torch.no_grad():
        want = ref(x)
        assert torch.equal(model(x), want)
        # The write goes to this process's copy of the page, dropped with the block's mapping
        # after its run: the file's values (the page cache's, a RAM tier's) come back.
        assert_writes_are_caught(model, 2, x, want)
    tp.release(model, handle)


class _Spy:
    """The engine, with acquire() replaced."""

    def __init__(self, engine: Any, acquire: Any) -> None:
        self._engine = engine
        self.acquire = acquire

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


def test_ram_tier_blocks_of_a_mapped_ram_tier_run_where_they_lie(tmp_path: Path) -> None:
    """A warm pass over the RAM tier copies nothing: its blocks' leases are the file's pages
    (the page cache the RAM tier is), every pass, and the outputs are the plain model's."""
    ref, model, handle = _load(tmp_path, torch.bfloat16, "ram")
    seen = _leases_in_place(ref, model)
    assert len(seen) == 9 and all(seen), seen
    tp.release(model, handle)


@pytest.mark.parametrize("in_memory", [False, True])
def test_the_plan_counts_staging_only_for_ram_tier_blocks_that_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_memory: bool
) -> None:
    """A mapped RAM tier's blocks run in place: the plan counts no staging buffer for them (one
    page per buffer paces the look-ahead), and the engine holds what the plan counted. Read
    into memory (TRASH_PANDA_RAM_IN_MEMORY), they are staged, and counted so."""
    if in_memory:
        monkeypatch.setenv("TRASH_PANDA_RAM_IN_MEMORY", "1")
    ref, model, handle = _load(tmp_path, torch.bfloat16, "ram")
    state = model._trash_panda_state
    budgets = state.plan.budgets
    assert budgets is not None
    block = max(b.stored_bytes for b in state.plan.blocks)
    if in_memory:
        assert budgets.staging_buffer_bytes >= block
    else:
        assert budgets.staging_buffer_bytes == 4096
    assert state.config.staging_buffer_bytes == budgets.staging_buffer_bytes
    assert state.engine.staging_bytes() == budgets.host_staging
    seen = _leases_in_place(ref, model)
    assert seen and seen == [not in_memory] * len(seen)
    tp.release(model, handle)


def test_a_plan_made_for_a_mapped_ram_tier_refuses_to_read_it_into_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    ref = Tiny(dim=64, layers=4, vocab=50).to(torch.bfloat16).eval()
    path = save(ref, tmp_path / "m.safetensors", torch.bfloat16)

    def meta() -> Tiny:
        with torch.device("meta"):
            return Tiny(dim=64, layers=4, vocab=50).to(torch.bfloat16).eval()

    streamed = ["blocks.1.", "blocks.2.", "blocks.3."]
    manual = Plan.manual(resident=["blocks.0."], streamed=streamed, streamed_tier="ram")
    model = meta()
    tp.stream_load(model, path, plan=manual, device="cpu")
    made = model._trash_panda_state.plan  # resolved without the setting
    tp.release(model)
    monkeypatch.setenv("TRASH_PANDA_RAM_IN_MEMORY", "1")
    model = meta()
    with pytest.raises(PlanError, match=r"TRASH_PANDA_RAM_IN_MEMORY=1 .*\(3 RAM-tier block\(s\) run in place"):
        tp.stream_load(model, path, plan=made, device="cpu")
    # A plan made with the setting in place stages them.
    tp.stream_load(model, path, plan=manual, device="cpu")
    handle = tp.install_offload(model)
    x = torch.randint(0, 50, (1, 3))
    with torch.no_grad():
        assert torch.equal(model(x), ref(x))
    tp.release(model, handle)


def test_a_ram_tier_with_a_storage_dtype_is_staged(tmp_path: Path) -> None:
    """Converted to a storage dtype, the RAM tier's bytes are not the file's: staged as before."""
    torch.manual_seed(0)
    ref = Tiny(dim=64, layers=4, vocab=50).eval()
    path = save(ref, tmp_path / "m.safetensors")
    with torch.device("meta"):
        model = Tiny(dim=64, layers=4, vocab=50).eval()
    plan = Plan.manual(resident=[], streamed=[f"blocks.{i}." for i in range(4)], streamed_tier="ram")
    tp.stream_load(model, path, plan=plan, device="cpu", storage_dtype="bf16")
    handle = tp.install_offload(model)
    engine = model._trash_panda_state.engine
    assert not any(engine.in_place(i) for i in range(4))
    tp.release(model, handle)
