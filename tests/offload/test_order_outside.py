"""The weights outside the blocks in the order file: a run records where each outside module is
first needed, trace_order() records the same, and stage(overlap=True) with such a file loads the
ones needed after the first block on its loader thread, at their place, with the same output.
An order file written before the field existed still reads, and outside weights are then all
loaded before the first call, as before."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import trash_panda as tp
from conftest import ReadsWith
from support.models import Tiny, save
from support.outside_loads import OutsideLoads
from trash_panda import _core
from trash_panda.errors import StreamError

IDS = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(7))
BLOCKS = [f"blocks.{i}" for i in range(6)]
# Tiny: the embedding before the first block, the final norm and the head after the last.
RECORDED = {"embed": 0, "head": 6, "norm": 6}
ALL = ["embed.weight", "head.weight", "norm.bias", "norm.weight"]


def build() -> Tiny:
    with tp.empty_weights():
        return Tiny()


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Path, Tiny]:
    torch.manual_seed(0)
    ref = Tiny().eval()
    folder = tmp_path / "ckpt"
    folder.mkdir()
    return save(ref, folder / "tiny.safetensors"), ref


def run(path: Path, **kwargs: Any) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a usable file (old or new) warns about nothing
        with tp.stage(build, path, device="cpu", resident_blocks=6, **kwargs) as (model, _p, _h), torch.no_grad():
            out: torch.Tensor = model(IDS)
    return out


def order_file(path: Path) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((path.parent / "tiny_order.json").read_text())
    return found


class Loads(OutsideLoads):
    """The watch of :mod:`outside_loads`, for this file's models."""

    def watch(self, model: torch.nn.Module) -> None:
        model.blocks[0].register_forward_pre_hook(lambda _m, _a: self.first_block.set())


def test_a_real_run_writes_the_outside_positions_and_a_traced_run_the_same_file(
    tiny: tuple[Path, Tiny], tmp_path: Path
) -> None:
    path, _ref = tiny
    run(path)
    written = order_file(path)
    assert written["outside"] == RECORDED
    assert written["version"] == _core.ORDER_VERSION == 1
    traced = tmp_path / "traced"
    traced.mkdir()
    assert tp.trace_order(build(), IDS, write_to=path, order_file_destination=traced) == [f"{b}." for b in BLOCKS]
    assert (traced / "tiny_order.json").read_bytes() == (path.parent / "tiny_order.json").read_bytes()


def test_an_old_order_file_without_outside_weights_still_reads(
    loader_reads: ReadsWith, tiny: tuple[Path, Tiny], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, ref = tiny
    # What the writer before outside positions wrote: a run order and nothing else.
    old = {"blocks": BLOCKS, "checkpoint": "tiny.safetensors", "format": "trash-panda-order", "version": 1}
    (path.parent / "tiny_order.json").write_text(json.dumps(old, indent=2) + "\n")
    read = _core.read_order_file(path.parent / "tiny_order.json", [f"{b}." for b in BLOCKS])
    assert read.usable and read.blocks == [f"{b}." for b in BLOCKS]
    assert read.outside == {} and read.outside_for(["embed", "norm", "head"]) == {}

    loads = Loads(loader_reads)
    out = _staged_overlap(path, loads)
    # Today's behaviour: every outside weight is read before the first call, in one go.
    assert loads.calls == [(None, ALL, False)]
    with torch.no_grad():
        assert torch.equal(out, ref(IDS))
    # The run's release adds the positions it recorded to the blocks' order, which was right.
    assert order_file(path) == {**old, "outside": RECORDED}


def _staged_overlap(path: Path, loads: Loads) -> torch.Tensor:
    with tp.stage(build, path, device="cpu", resident_blocks=6, overlap=True) as (model, _p, _h):
        loads.watch(model)
        with torch.no_grad():
            out: torch.Tensor = model(IDS)
    return out


def test_with_overlap_the_weights_after_the_last_block_load_after_the_first_starts(
    loader_reads: ReadsWith, tiny: tuple[Path, Tiny], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, ref = tiny
    eager = run(path)  # writes the file with the positions
    assert order_file(path)["outside"] == RECORDED
    loads = Loads(loader_reads)
    out = _staged_overlap(path, loads)
    # The embedding before the first call; the norm and the head at position 6 (after the last
    # block), on the loader, after the first block started.
    assert loads.calls == [(None, ["embed.weight"], False), (6, ["head.weight", "norm.bias", "norm.weight"], True)]
    assert torch.equal(out, eager)
    with torch.no_grad():
        assert torch.equal(out, ref(IDS))


def test_without_overlap_nothing_changes(
    loader_reads: ReadsWith, tiny: tuple[Path, Tiny], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, ref = tiny
    run(path)
    loads = Loads(loader_reads)
    out = run(path)
    assert loads.calls == []  # stream_load read them all, before the first call
    with torch.no_grad():
        assert torch.equal(out, ref(IDS))


def test_a_file_placing_a_module_the_model_lacks_loads_everything_first(
    loader_reads: ReadsWith, tiny: tuple[Path, Tiny], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, ref = tiny
    run(path)
    text = order_file(path)
    text["outside"] = {"head": 6, "norm": 6, "lm_head": 6}
    (path.parent / "tiny_order.json").write_text(json.dumps(text))
    loads = Loads(loader_reads)
    out = _staged_overlap(path, loads)
    assert loads.calls == [(None, ALL, False)]
    with torch.no_grad():
        assert torch.equal(out, ref(IDS))
    assert order_file(path)["outside"] == RECORDED  # replaced by what the run recorded


def test_a_failed_later_load_raises_naming_the_module(
    loader_reads: ReadsWith, tiny: tuple[Path, Tiny], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ref = tiny
    run(path)

    def fail(*_args: Any) -> None:
        raise OSError("the drive went away")

    loader_reads(outside=fail)
    with (
        pytest.raises(StreamError, match=r"module (norm|head) could not be loaded.*drive went away"),
        tp.stage(build, path, device="cpu", resident_blocks=6, overlap=True) as (model, _p, _h),
        torch.no_grad(),
    ):
        model(IDS)
