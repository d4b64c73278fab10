"""stage(overlap=True) reads each resident block by one call of the core, through the model's read
lane it shares with the engine, and keeps the weights bit for bit as a load without overlap does."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import trash_panda as tp
from support.checkpoints import fp8_checkpoint
from support.models import Tiny, on_meta
from trash_panda import _core
from trash_panda.offload.overlap import OverlapWait
from trash_panda.offload.state import get_state

IDS = torch.randint(0, 100, (3, 11), generator=torch.Generator().manual_seed(7))


def build() -> Tiny:
    return on_meta(Tiny)  # type: ignore[return-value]


def test_the_loader_reads_each_block_in_one_call_in_run_order(
    tiny: tuple[Path, Tiny], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, ref = tiny
    real = _core.read_block
    calls: list[tuple[str, int | None, int, bool]] = []

    def counted(requests: list[Any], **kwargs: Any) -> tuple[int, float]:
        lane = kwargs.get("lane")
        calls.append((threading.current_thread().name, kwargs.get("position"), len(requests), lane is not None))
        return real(requests, **kwargs)

    monkeypatch.setattr(_core, "read_block", counted)
    with (
        pytest.warns(UserWarning, match=r"blocks\.0\. ran before the order given"),
        tp.stage(build, path, device="cpu", resident_blocks=3, overlap=True, order=["blocks.2"]) as (model, _p, h),
    ):
        with torch.no_grad():
            assert torch.equal(model(IDS), ref(IDS))
        hook = h.hooks.get("overlap_wait")
        assert isinstance(hook, OverlapWait)
        lane = hook.loader.lane
        assert lane is not None
        # The hooks moved the lane's current block as the blocks ran: blocks.5 ran last.
        assert lane.current == 5
        grants, _waits, _seconds = lane.stats()
        assert grants >= 3
        state = get_state(model)
        assert state is not None and state.engine is not None
        assert state.lane is lane  # the model's lane: the loader made none of its own
    tensors = len(list(ref.blocks[0].parameters()))
    # Run order blocks.2, 0, 1, 3, ...: block 2 is at position 0, block 0 at 1, block 1 at 2.
    # (The main thread's reads, of the weights outside the blocks and the buffers, are needed now.)
    assert all(position is None and through for name, position, _n, through in calls if name != "trash-panda-loader")
    calls = [c for c in calls if c[0] == "trash-panda-loader"]
    assert calls == [
        ("trash-panda-loader", 0, tensors, True),
        ("trash-panda-loader", 1, tensors, True),
        ("trash-panda-loader", 2, tensors, True),
    ]


@pytest.mark.parametrize("storage", [None, "bf16", "fp8"])
def test_overlap_keeps_the_weights_bit_for_bit(tiny: tuple[Path, Tiny], storage: str | None) -> None:
    path, _ref = tiny
    outs = []
    for overlap in (False, True):
        with (
            tp.stage(build, path, device="cpu", resident_blocks=4, overlap=overlap, storage_dtype=storage) as (
                model,
                _p,
                _h,
            ),
            torch.no_grad(),
        ):
            outs.append(model(IDS))
    assert outs[0].dtype == outs[1].dtype
    assert torch.equal(outs[0].reshape(-1).view(torch.uint8), outs[1].reshape(-1).view(torch.uint8))


def test_overlap_reads_fp8_weights_with_their_scales(tmp_path: Path) -> None:
    torch.manual_seed(1)
    expected = fp8_checkpoint(Tiny().eval(), tmp_path / "fp8.safetensors")
    with (
        tp.stage(build, tmp_path / "fp8.safetensors", device="cpu", resident_blocks=3, overlap=True) as (model, _p, _h),
        torch.no_grad(),
    ):
        assert torch.equal(model(IDS), expected(IDS))


def test_reads_for_another_device_hold_at_most_the_largest_tensor_in_host_memory() -> None:
    from types import SimpleNamespace

    from trash_panda.offload.reads import block_groups

    mib = 1 << 20

    def spec(n: int, scale: int | None = None) -> SimpleNamespace:
        return SimpleNamespace(
            info=SimpleNamespace(nbytes=n * mib), scale=None if scale is None else SimpleNamespace(nbytes=scale)
        )

    specs = [spec(30), spec(40), spec(100, 4096), spec(10), spec(90), spec(5)]
    block = SimpleNamespace(tensors=specs)
    assert block_groups(block, None) == [specs]  # type: ignore[arg-type]
    groups = block_groups(block, SimpleNamespace())  # type: ignore[arg-type]  # copies to a device
    assert [s for g in groups for s in g] == specs  # every tensor once, in order
    bound = 100 * mib + 4096  # the largest tensor with its scale
    held = [sum(s.info.nbytes + (s.scale.nbytes if s.scale else 0) for s in g) for g in groups]
    assert max(held) <= bound and len(groups) == 4, held  # 30+40, 100, 10+90, 5
