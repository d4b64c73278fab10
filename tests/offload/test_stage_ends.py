"""How a stage and a release end when something fails on the way: the release always completes
(hooks off, weights on meta, files closed), and the first error is the one raised."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import trash_panda as tp
from support.models import Tiny, on_meta, save
from trash_panda.offload import order, profile
from trash_panda.offload.backends import cpu
from trash_panda.offload.state import get_state

IDS = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(2))


def build() -> Tiny:
    return on_meta(Tiny)  # type: ignore[return-value]


@pytest.fixture
def path(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    return save(Tiny(), tmp_path / "tiny.safetensors")


def assert_released(model: torch.nn.Module) -> None:
    assert get_state(model) is None
    assert all(p.is_meta for p in model.parameters())
    hooked = [n for n, m in model.named_modules() if m._forward_pre_hooks or m._forward_hooks]
    assert hooked == [""]  # only the refusal to run a released model
    with pytest.raises(tp.TrashPandaError, match="released"):
        model(IDS)


def test_an_order_file_write_that_raises_still_releases(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object) -> bool:
        raise RuntimeError("the order file write broke")

    monkeypatch.setattr(order, "write_order", broken)
    with (
        pytest.raises(RuntimeError, match="order file write broke"),
        tp.stage(build, path, device="cpu", resident_blocks=2) as (model, _p, _h),
        torch.no_grad(),
    ):
        model(IDS)
    assert_released(model)


def test_a_failing_profile_snapshot_does_not_stop_the_release(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object) -> None:
        raise RuntimeError("the snapshot broke")

    monkeypatch.setenv("TRASH_PANDA_PROFILE", "1")
    monkeypatch.setattr(profile, "snapshot", broken)
    model = build()
    tp.stream_load(model, path, offload_prefixes=["blocks."], resident_prefixes=["blocks.0."], device="cpu")
    handle = tp.install_offload(model)
    with torch.no_grad():
        model(IDS)
    with pytest.raises(RuntimeError, match="snapshot broke"):
        tp.release(model, handle)
    assert handle.removed
    assert_released(model)


@pytest.fixture
def broken_close(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU backend's close does its work, then raises."""
    real = cpu.CpuBackend.close

    def broken(self: cpu.CpuBackend) -> None:
        real(self)
        raise OSError("close broke")

    monkeypatch.setattr(cpu.CpuBackend, "close", broken)


@pytest.mark.usefixtures("broken_close")
def test_a_failing_backend_close_does_not_stop_the_release(path: Path) -> None:
    model = build()
    tp.stream_load(model, path, offload_prefixes=["blocks."], device="cpu")
    tp.install_offload(model)
    with pytest.raises(OSError, match="close broke"):
        tp.release(model)
    assert_released(model)


@pytest.mark.usefixtures("broken_close")
def test_the_blocks_error_wins_over_a_failing_release(path: Path) -> None:
    with (
        pytest.warns(UserWarning, match="close broke"),
        pytest.raises(ValueError, match="the block's own error"),
        tp.stage(build, path, device="cpu", resident_blocks=2) as (model, _p, _h),
    ):
        raise ValueError("the block's own error")
    assert_released(model)
