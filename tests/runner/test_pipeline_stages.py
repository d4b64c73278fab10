"""A diffusers-style pipeline folder run as three chained stages (examples/pipeline_stages.py):
the image equals the plain pipeline's, and the memory goes back after the chain."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest
import torch

from trash_panda import _core

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import pipeline_stages as pipe

# About 35 MB of text encoder, 135 MB of denoiser and 25 MB of VAE (fp32).
CONFIGS = {
    "text_encoder": {"dim": 512, "layers": 4},
    "transformer": {"dim": 1024, "layers": 8, "text_dim": 512},
    "vae": {"dim": 512, "layers": 3},
}


def test_the_runner_example_equals_the_plain_pipeline(tmp_path: Path) -> None:
    folder = pipe.save_pipeline(tmp_path / "pipe")
    want = pipe.plain(folder)
    images = pipe.with_runner(folder, runs=2)
    assert len(images) == 2 and all(torch.equal(i, want) for i in images)


def test_the_small_pipeline_equals_the_plain_one(tmp_path: Path) -> None:
    folder = pipe.save_pipeline(tmp_path / "pipe")
    assert torch.equal(pipe.staged(folder), pipe.plain(folder))
    for name in pipe.COMPONENTS:  # each stage wrote its order file next to its checkpoint
        assert (folder / name / f"{name}_order.json").exists()


@pytest.mark.slow
def test_chained_stages_equal_the_plain_pipeline_and_give_memory_back(tmp_path: Path) -> None:
    folder = pipe.save_pipeline(tmp_path / "pipe", configs=CONFIGS)
    want = pipe.plain(folder)
    gc.collect()
    _core.trim_heap()
    start = _core.current_rss()
    # The denoiser streams: three blocks resident, the rest from a map of the file.
    image = pipe.staged(folder, "cpu", resident_blocks=3)
    gc.collect()
    _core.trim_heap()
    end = _core.current_rss()
    assert torch.equal(image, want)
    assert abs(end - start) <= 0.05 * start, (start, end)
