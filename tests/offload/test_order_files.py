"""Order files through stage(): one test per rule of the spec's "Running a stage"."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import trash_panda as tp
from support.models import Block, save
from trash_panda.offload.state import get_state

RUN = [3, 4, 5, 0, 1, 2]  # the order forward() runs the blocks in


class Reordered(nn.Module):
    """Defines six blocks and runs the last three first (as a model with text blocks defined
    after its main blocks does)."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in RUN:
            x = self.blocks[i](x)
        return x


def build() -> nn.Module:
    with torch.device("meta"):
        return Reordered()


@pytest.fixture
def ckpt(tmp_path: Path) -> tuple[Path, nn.Module]:
    torch.manual_seed(0)
    ref = Reordered().eval()
    return save(ref, tmp_path / "model.safetensors"), ref


X = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(1))
REAL = [f"blocks.{i}" for i in RUN]


def run_stage(path: Path, ref: nn.Module, **kw: object) -> tuple[list[str], list[int]]:
    """Runs one stage (two calls); returns the warnings and the engine's starting order."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tp.stage(build, path, device="cpu", resident_blocks=2, **kw) as (model, _p, _h):
            state = get_state(model)
            assert state is not None and state.engine is not None
            start = state.engine.order()
            with torch.no_grad():
                for _ in range(2):
                    assert torch.equal(model(X), ref(X))
    return [str(w.message) for w in caught], start


def order_warnings(messages: list[str]) -> list[str]:
    return [m for m in messages if "ran before the order given" in m]


def file_blocks(path: Path) -> list[str]:
    return list(json.loads(path.read_text())["blocks"])


def test_the_first_run_writes_the_real_order_and_the_next_starts_with_it(ckpt: tuple[Path, nn.Module]) -> None:
    path, ref = ckpt
    order_file = path.parent / "model_order.json"
    msgs, start = run_stage(path, ref)
    assert len(order_warnings(msgs)) == 1  # the first run, without a file, warns once
    assert start == [0, 1, 2, 3]  # engine indices of blocks 2..5, in definition order
    # Every block that ran, resident blocks 0 and 1 too, in the order they ran.
    assert file_blocks(order_file) == REAL
    msgs, start = run_stage(path, ref)
    assert order_warnings(msgs) == []  # read before the first call: no warning
    assert start == [1, 2, 3, 0]  # blocks 3, 4, 5, then 2: prefetched in the real order


def test_a_right_file_is_not_rewritten(ckpt: tuple[Path, nn.Module]) -> None:
    path, ref = ckpt
    order_file = path.parent / "model_order.json"
    run_stage(path, ref)
    content = json.loads(order_file.read_text())
    content["note"] = "kept"  # other fields are allowed; a rewrite would drop it
    order_file.write_text(json.dumps(content))
    run_stage(path, ref)
    assert json.loads(order_file.read_text())["note"] == "kept"


def test_a_wrong_order_is_replaced(ckpt: tuple[Path, nn.Module]) -> None:
    path, ref = ckpt
    order_file = path.parent / "model_order.json"
    tp._core.write_order_file(order_file, path, [f"blocks.{i}" for i in range(6)])
    msgs, _ = run_stage(path, ref)
    assert len(order_warnings(msgs)) == 1
    assert file_blocks(order_file) == REAL


def test_a_file_naming_an_unknown_block_is_ignored_and_replaced(ckpt: tuple[Path, nn.Module]) -> None:
    path, ref = ckpt
    order_file = path.parent / "model_order.json"
    tp._core.write_order_file(order_file, path, ["blocks.9", "blocks.0"])
    msgs, start = run_stage(path, ref)
    ignored = [m for m in msgs if "ignored" in m and "blocks.9" in m]
    assert len(ignored) == 1
    assert start == [0, 1, 2, 3]
    assert file_blocks(order_file) == REAL


@pytest.mark.parametrize("text", ['{"format": "trash-panda-order", "version": 1, "blocks": ["blo', "", "not json"])
def test_a_torn_or_non_json_file_counts_as_absent(ckpt: tuple[Path, nn.Module], text: str) -> None:
    path, ref = ckpt
    order_file = path.parent / "model_order.json"
    order_file.write_text(text)
    msgs, start = run_stage(path, ref)
    assert start == [0, 1, 2, 3]
    assert len([m for m in msgs if "ignored" in m]) == 1
    assert file_blocks(order_file) == REAL


def test_an_unwritable_folder_gives_one_warning(ckpt: tuple[Path, nn.Module], tmp_path: Path) -> None:
    path, ref = ckpt
    missing = tmp_path / "missing"  # read: absent; write: fails
    msgs, _ = run_stage(path, ref, order_file_destination=missing)
    assert len([m for m in msgs if "order file was not written" in m and "missing" in m]) == 1
    assert not missing.exists()  # the folder is not created
    blocker = tmp_path / "not-a-folder"  # a file in the folder's place: cannot be read either
    blocker.write_text("a file where the folder should be")
    msgs, _ = run_stage(path, ref, order_file_destination=blocker)
    assert len([m for m in msgs if "not-a-folder" in m]) == 1
    assert blocker.read_text() == "a file where the folder should be"
    assert not (path.parent / "model_order.json").exists()


def test_order_file_destination_holds_the_file(ckpt: tuple[Path, nn.Module], tmp_path: Path) -> None:
    path, ref = ckpt
    dest = tmp_path / "orders"
    dest.mkdir()
    run_stage(path, ref, order_file_destination=dest)
    assert file_blocks(dest / "model_order.json") == REAL
    msgs, start = run_stage(path, ref, order_file_destination=dest)
    assert order_warnings(msgs) == [] and start == [1, 2, 3, 0]


def test_order_argument_skips_the_file(ckpt: tuple[Path, nn.Module]) -> None:
    path, ref = ckpt
    order_file = path.parent / "model_order.json"
    msgs, start = run_stage(path, ref, order=["blocks.3", "blocks.4", "blocks.5"])
    assert order_warnings(msgs) == [] and start == [1, 2, 3, 0]
    assert not order_file.exists()  # not written
    order_file.write_text("garbage")
    msgs, _ = run_stage(path, ref, order=["blocks.3", "blocks.4", "blocks.5"])
    assert [m for m in msgs if "ignored" in m] == []  # not read
    assert order_file.read_text() == "garbage"


def test_a_wrong_order_argument_warns_once(ckpt: tuple[Path, nn.Module]) -> None:
    path, ref = ckpt
    msgs, _ = run_stage(path, ref, order=["blocks.2", "blocks.5"])
    assert len(order_warnings(msgs)) == 1


def test_the_check_runs_again_after_remove_and_a_new_install(ckpt: tuple[Path, nn.Module]) -> None:
    path, ref = ckpt
    with tp.stage(build, path, device="cpu", resident_blocks=2, order=[]) as (model, _p, handle):
        with warnings.catch_warnings(record=True) as first:
            warnings.simplefilter("always")
            with torch.no_grad():
                model(X)
        handle.remove()
        again = tp.install_offload(model)
        with warnings.catch_warnings(record=True) as second:
            warnings.simplefilter("always")
            with torch.no_grad():
                assert torch.equal(model(X), ref(X))
        assert len(order_warnings([str(w.message) for w in first])) == 1
        assert len(order_warnings([str(w.message) for w in second])) == 1
        assert again.recorded_order == ["blocks.3.", "blocks.4.", "blocks.5.", "blocks.2."]


def test_a_sharded_folder_works_like_one_file(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = Reordered().eval()
    folder = tmp_path / "transformer"
    folder.mkdir()
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    shards: list[dict[str, torch.Tensor]] = [{}, {}]
    for k, v in sd.items():
        shards[int(k.split(".")[1]) % 2][k] = v
    weight_map = {}
    for n, shard in enumerate(shards):
        name = f"diffusion_pytorch_model-0000{n + 1}-of-00002.safetensors"
        save_file(shard, str(folder / name))
        weight_map.update(dict.fromkeys(shard, name))
    index = folder / "diffusion_pytorch_model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    for where in (folder, index):
        run_stage(where, ref)
    assert file_blocks(folder / "transformer_order.json") == REAL
    assert file_blocks(folder / "diffusion_pytorch_model_order.json") == REAL
    assert sorted(os.listdir(folder))[-1] == "transformer_order.json"


@pytest.mark.parametrize("stop", [KeyboardInterrupt, RuntimeError])
def test_a_stopped_run_leaves_a_good_file_alone(ckpt: tuple[Path, nn.Module], stop: type[BaseException]) -> None:
    path, ref = ckpt
    order_file = path.parent / "model_order.json"
    run_stage(path, ref)  # writes the real order
    good = order_file.read_bytes()

    def interrupt(*_: object) -> None:
        raise stop("stopped after three blocks")

    with pytest.raises(stop), tp.stage(build, path, device="cpu", resident_blocks=2) as (model, _p, _h):
        model.blocks[0].register_forward_pre_hook(interrupt)  # the fourth block to run
        with torch.no_grad():
            model(X)
    assert order_file.read_bytes() == good
    # A stopped run without a file writes none either: it knows only the blocks it reached.
    order_file.unlink()
    with pytest.raises(stop), tp.stage(build, path, device="cpu", resident_blocks=2) as (model, _p, _h):
        model.blocks[0].register_forward_pre_hook(interrupt)
        with torch.no_grad():
            model(X)
    assert not order_file.exists()


def test_a_partial_pass_is_merged_into_the_file(ckpt: tuple[Path, nn.Module]) -> None:
    path, ref = ckpt
    order_file = path.parent / "model_order.json"
    run_stage(path, ref)
    good = order_file.read_bytes()
    # A block that calls a part of the model only: what ran agrees with the file.
    with tp.stage(build, path, device="cpu", resident_blocks=2) as (model, _p, _h), torch.no_grad():
        model.blocks[4](model.blocks[3](X))
    assert order_file.read_bytes() == good
    # Two blocks run the other way round: they swap places, the others keep theirs.
    with (
        pytest.warns(UserWarning, match=r"blocks\.4\. ran before the order given"),
        tp.stage(build, path, device="cpu", resident_blocks=2) as (model, _p, _h),
        torch.no_grad(),
    ):
        model.blocks[3](model.blocks[4](X))
    assert file_blocks(order_file) == ["blocks.4", "blocks.3", "blocks.5", "blocks.0", "blocks.1", "blocks.2"]
