"""The `trash-panda` console command (the CLI's Rust code, run through the binding)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import trash_panda
from support.models import Tiny, save

# The package as this test process imports it, for the child process too.
ENV = {**os.environ, "PYTHONPATH": str(Path(trash_panda.__file__).parent.parent)}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trash_panda.cli", *args], capture_output=True, text=True, timeout=120, env=ENV
    )


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    return save(Tiny(layers=12), tmp_path / "tiny.safetensors", torch.bfloat16)


def test_inspect_groups_by_block(ckpt: Path) -> None:
    r = run("inspect", str(ckpt))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(line.startswith("blocks.11.") for line in lines)
    assert any(line.startswith("blocks.2. ") for line in lines)
    assert "(outside blocks)" in r.stdout
    assert "total (12 blocks)" in r.stdout


def test_inspect_json_adds_up(ckpt: Path) -> None:
    r = run("inspect", "--json", "--tensors", str(ckpt))
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["blocks"] == 12
    assert sum(g["bytes"] for g in report["groups"]) == report["bytes"]
    assert report["bytes"] == sum(v.numel() * 2 for v in Tiny(layers=12).state_dict().values())
    block0 = next(g for g in report["groups"] if g["block"] == "blocks.0.")
    assert {t["name"] for t in block0["list"]} == {
        f"blocks.0.{n}" for n in ("norm.weight", "norm.bias", "up.weight", "up.bias", "down.weight", "down.bias")
    }
    assert report["dtypes"] == {"BF16": len(Tiny(layers=12).state_dict())}


def test_plan_command(ckpt: Path) -> None:
    r = run("plan", str(ckpt), "--vram", "0.2MB", "--ram", "8GB", "--headroom-vram", "0", "--json")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    assert p["format"] == "trash-panda-plan" and p["version"] == 2
    assert len(p["blocks"]) == 12


def test_errors_are_one_line_and_nonzero(tmp_path: Path) -> None:
    r = run("inspect", str(tmp_path / "missing.safetensors"))
    assert r.returncode == 1
    assert "missing.safetensors" in r.stderr and "Traceback" not in r.stderr
    r = run("plan", str(tmp_path / "x.safetensors"), "--max-vram", "lots")
    assert r.returncode != 0 and "lots" in r.stderr


def test_doctor_runs() -> None:
    r = run("doctor", "--no-probe")
    assert r.returncode == 0, r.stderr
    assert "RAM" in r.stdout or "ram" in r.stdout
