"""Shared fixtures: small checkpoints written on the fly with the official safetensors writer."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from support import faults, sanitizer
from support.models import Tiny, save
from support.simdevice import SimulatedDevice
from trash_panda.offload import overlap

# What the loader_reads fixture gives: put reads in (block=, outside=, now=) until the test ends.
ReadsWith = Callable[..., overlap.LoaderReads]


def _tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {
        "embed.weight": torch.randn(64, 32, generator=g),
        "norm.weight": torch.randn(32, generator=g).to(torch.bfloat16),
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "empty": torch.zeros(0, 4, dtype=torch.float16),
        "ids": torch.arange(10, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "bytes": torch.arange(7, dtype=torch.uint8),
    }
    for i in range(3):
        w = torch.randn(48, 32, generator=g)
        out[f"blocks.{i}.attn.weight"] = w.to(torch.bfloat16)
        out[f"blocks.{i}.mlp.weight"] = w.to(torch.float16)
        out[f"blocks.{i}.fp8.weight"] = (w * 8).to(torch.float8_e4m3fn)
        out[f"blocks.{i}.fp8.weight_scale"] = torch.tensor(0.125)
        out[f"blocks.{i}.e5m2.weight"] = w.to(torch.float8_e5m2)
    return out


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _faults(monkeypatch: pytest.MonkeyPatch) -> None:
    """The defects TRASH_PANDA_FAULT puts back (tests/support/faults.py), for every test; under
    TORCH_CUDA_SANITIZER, the sanitizer made to see views and the loader's thread (sanitizer.py)."""
    faults.from_environment(monkeypatch)
    if sanitizer.wanted():
        sanitizer.install(monkeypatch)


@pytest.fixture
def tensors() -> dict[str, torch.Tensor]:
    return _tensors()


@pytest.fixture
def single_file(tmp_path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


@pytest.fixture
def sharded(tmp_path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    """Two shards and their index; returns the index path."""
    names = sorted(tensors)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:])):
        shard = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, str(tmp_path / shard))
        weight_map.update({n: shard for n in part})
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a tensor, for bit-for-bit comparisons (NaN compares equal to itself)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


@pytest.fixture
def sim() -> Iterator[SimulatedDevice]:
    """The simulated asynchronous device of the CPU test suite (see simdevice.py)."""
    dev = SimulatedDevice(seed=1)
    yield dev
    dev.stop()


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Path, Tiny]:
    """A small causal LM of six blocks saved as safetensors, and the plain model it was saved from."""
    torch.manual_seed(0)
    ref = Tiny().eval()
    return save(ref, tmp_path / "tiny.safetensors"), ref


@pytest.fixture
def loader_reads() -> Iterator[ReadsWith]:
    """Puts reads of a test's own in for the loaders it makes (``block=``, ``outside=``, ``now=``:
    see :func:`trash_panda.offload.overlap.reading_with`), until the test ends."""
    with contextlib.ExitStack() as stack:
        yield lambda **replaced: stack.enter_context(overlap.reading_with(**replaced))
