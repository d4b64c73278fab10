"""Disk-tier blocks used in place on the CPU (Linux): the weights are the checkpoint's pages."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import trash_panda as tp
from support.models import Tiny, assert_writes_are_caught, save
from trash_panda import Plan

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
