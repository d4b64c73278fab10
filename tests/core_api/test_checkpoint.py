"""Reading checkpoints through the binding: every dtype, shards, zero-copy views, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import trash_panda
from conftest import bits
from trash_panda import Checkpoint, CheckpointError


def test_reads_every_tensor_bit_for_bit(single_file: Path, tensors: dict[str, torch.Tensor]) -> None:
    ckpt = Checkpoint(single_file)
    assert len(ckpt) == len(tensors)
    assert sorted(ckpt.names()) == sorted(tensors)
    for name, expected in tensors.items():
        got = ckpt.read(name)
        assert got.dtype == expected.dtype, name
        assert got.shape == expected.shape, name
        assert torch.equal(bits(got), bits(expected)), name


def test_index_entries(single_file: Path, tensors: dict[str, torch.Tensor]) -> None:
    ckpt = Checkpoint(single_file)
    info = ckpt.info("blocks.1.fp8.weight")
    assert info.dtype == "F8_E4M3"
    assert info.shape == [48, 32]
    assert info.nbytes == 48 * 32
    assert info.end - info.start == info.nbytes
    assert str(info.file) == str(single_file)
    raw = single_file.read_bytes()[info.start : info.end]
    assert raw == bits(tensors["blocks.1.fp8.weight"]).numpy().tobytes()


@pytest.mark.parametrize("how", ["index", "folder"])
def test_sharded(sharded: Path, tensors: dict[str, torch.Tensor], how: str) -> None:
    ckpt = Checkpoint(sharded if how == "index" else sharded.parent)
    assert len(ckpt.files) == 2
    for name, expected in tensors.items():
        assert torch.equal(bits(ckpt.read(name)), bits(expected)), name


def test_view_is_private(single_file: Path, tensors: dict[str, torch.Tensor]) -> None:
    before = single_file.read_bytes()
    ckpt = Checkpoint(single_file)
    t = ckpt.read("embed.weight")
    t.fill_(42.0)  # writes land in private pages, never in the file
    assert single_file.read_bytes() == before
    assert torch.equal(Checkpoint(single_file).read("embed.weight"), tensors["embed.weight"])


def test_view_outlives_checkpoint(single_file: Path, tensors: dict[str, torch.Tensor]) -> None:
    ckpt = Checkpoint(single_file)
    t = ckpt.read("blocks.2.attn.weight")
    ckpt.close()
    del ckpt
    assert torch.equal(t, tensors["blocks.2.attn.weight"])


def test_missing_tensor_names_it(single_file: Path) -> None:
    ckpt = Checkpoint(single_file)
    with pytest.raises(CheckpointError, match="blocks.9.attn.weight"):
        ckpt.read("blocks.9.attn.weight")
    assert "blocks.9.attn.weight" not in ckpt


def test_truncated_file(tmp_path: Path, single_file: Path) -> None:
    bad = tmp_path / "truncated.safetensors"
    bad.write_bytes(single_file.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="truncated.safetensors") as err:
        Checkpoint(bad)
    assert isinstance(err.value, ValueError)
    assert isinstance(err.value, trash_panda.TrashPandaError)


def test_lying_header_length(tmp_path: Path) -> None:
    bad = tmp_path / "liar.safetensors"
    bad.write_bytes((10**12).to_bytes(8, "little") + b"{}")
    with pytest.raises(CheckpointError, match="liar.safetensors"):
        Checkpoint(bad)


def test_unknown_dtype(tmp_path: Path) -> None:
    header = json.dumps({"w": {"dtype": "F7", "shape": [1], "data_offsets": [0, 1]}}).encode()
    bad = tmp_path / "f7.safetensors"
    bad.write_bytes(len(header).to_bytes(8, "little") + header + b"\0")
    with pytest.raises(CheckpointError, match="F7"):
        Checkpoint(bad)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(trash_panda.TrashPandaError, match="nope.safetensors"):
        Checkpoint(tmp_path / "nope.safetensors")


def test_index_naming_missing_shard(tmp_path: Path, sharded: Path) -> None:
    index = json.loads(sharded.read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = "model-00003-of-00002.safetensors"
    sharded.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="model-00003-of-00002.safetensors"):
        Checkpoint(sharded)
