"""Adapter files read and mapped onto a model's layers (trash_panda.adapters): PEFT's and kohya's
namings, the config's alpha, other components' tensors skipped, and files that do not fit
refused with the tensor named and the model left as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from trash_panda.adapters import read_adapter
from trash_panda.errors import ArgumentError, CheckpointError


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"proj": nn.Linear(8, 16), "conv": nn.Conv2d(4, 6, 3)}) for _ in range(2)
        )
        self.norm = nn.LayerNorm(16)


def _peft(folder: Path, rank: int = 4, alpha: float = 8.0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for i in range(2):
        base = f"base_model.model.blocks.{i}.proj"
        tensors[f"{base}.lora_A.weight"] = torch.randn(rank, 8)
        tensors[f"{base}.lora_B.weight"] = torch.randn(16, rank)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"r": rank, "lora_alpha": alpha, "use_rslora": False}))
    return folder


def test_a_peft_folder_maps_onto_the_layers_with_its_config_s_alpha(tmp_path: Path) -> None:
    model = Net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    got = read_adapter(model, _peft(tmp_path / "peft"))
    assert [layer.layer for layer in got.layers] == ["blocks.0.proj", "blocks.1.proj"]
    assert all(layer.kind == "lora" and layer.rank == 4 and layer.scale == 2.0 for layer in got.layers)
    assert set(got.layers[0].parts) == {"down", "up"}
    assert got.layers[0].parts["down"] == "base_model.model.blocks.0.proj.lora_A.weight"
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_a_kohya_file_maps_by_joined_names_with_its_alphas_and_skips_the_text_encoder(tmp_path: Path) -> None:
    model = Net()
    file = tmp_path / "style.safetensors"
    save_file(
        {
            "lora_unet_blocks_1_conv.lora_down.weight": torch.randn(2, 4, 3, 3),
            "lora_unet_blocks_1_conv.lora_up.weight": torch.randn(6, 2, 1, 1),
            "lora_unet_blocks_1_conv.alpha": torch.tensor(1.0),
            "lora_te1_text_model_q_proj.lora_down.weight": torch.randn(2, 8),
        },
        str(file),
    )
    got = read_adapter(model, file, component="unet")
    assert [(layer.layer, layer.rank, layer.scale) for layer in got.layers] == [("blocks.1.conv", 2, 0.5)]
    assert got.skipped == ["lora_te1_text_model_q_proj.lora_down.weight"]


def test_files_that_do_not_fit_are_refused_naming_the_tensor(tmp_path: Path) -> None:
    model = Net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    wrong = tmp_path / "wrong.safetensors"
    save_file(
        {"blocks.0.prj.lora_A.weight": torch.randn(4, 8), "blocks.0.prj.lora_B.weight": torch.randn(16, 4)}, str(wrong)
    )
    with pytest.raises(CheckpointError, match=r'"blocks\.0\.prj".*nearest: blocks\.0\.proj'):
        read_adapter(model, wrong)
    rank = tmp_path / "rank.safetensors"
    save_file(
        {"blocks.0.proj.lora_A.weight": torch.randn(4, 8), "blocks.0.proj.lora_B.weight": torch.randn(16, 3)}, str(rank)
    )
    with pytest.raises(CheckpointError, match=r"blocks\.0\.proj\.lora_B\.weight.*shape \[16, 3\]"):
        read_adapter(model, rank)
    cut = tmp_path / "cut.safetensors"
    data = (_peft(tmp_path / "whole") / "adapter_model.safetensors").read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="cut.safetensors"):
        read_adapter(model, cut)
    plain = tmp_path / "plain.safetensors"
    save_file(dict(model.state_dict()), str(plain))
    with pytest.raises(CheckpointError, match="no tensor of the file is a LoRA"):
        read_adapter(model, plain)
    bad_config = _peft(tmp_path / "badcfg")
    (bad_config / "adapter_config.json").write_text(json.dumps({"lora_alpha": "eight"}))
    with pytest.raises(CheckpointError, match="lora_alpha is 'eight'"):
        read_adapter(model, bad_config)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_arguments_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ArgumentError, match="model"):
        read_adapter("not a model", tmp_path)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="not an adapter file"):
        read_adapter(Net(), tmp_path / "missing")
    with pytest.raises(ArgumentError, match="component"):
        read_adapter(Net(), tmp_path, component="")
