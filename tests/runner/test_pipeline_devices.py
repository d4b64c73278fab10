"""The pipeline runner on each device it runs on: the CPU here, and a real GPU where one is (the
`cuda` cases, which scripts/gpu-check.sh runs). The tiny pipeline of
examples/pipeline_stages.py, its denoiser streaming (two blocks resident), runs on the device
several times: each image equals the plain pipeline's on the same device bit for bit, the
denoiser's final pass hands every block it frees to the VAE read ahead, and once the pipeline is
closed the device's memory is back where it started."""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import trash_panda as tp
from trash_panda._core import Arrival, Departure

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import pipeline_stages as ps

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]

# About 35 MB of text encoder, 135 MB of denoiser and 25 MB of VAE (fp32): blocks large enough
# for the device's copies to take a while.
CONFIGS = {
    "text_encoder": {"dim": 512, "layers": 4},
    "transformer": {"dim": 1024, "layers": 8, "text_dim": 512},
    "vae": {"dim": 512, "layers": 3},
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ps.save_pipeline(tmp_path_factory.mktemp("devices") / "pipe", configs=CONFIGS)


def stages(folder: Path) -> list[tp.Stage]:
    def options(name: str) -> dict[str, Any]:
        return {"resident_blocks": 2} if name == "transformer" else {}

    return [tp.Stage(n, (lambda n=n: ps.build(folder, n)), folder / n, options=options(n)) for n in ps.COMPONENTS]


def one_run(pipe: tp.Pipeline, device: str) -> torch.Tensor:
    ids, latents = ps.inputs()
    with torch.no_grad(), pipe.run() as run:
        with run.stage("text_encoder") as encoder:
            text = encoder(ids.to(device))
        with run.stage("transformer") as denoiser:
            latents = latents.to(device)
            for step in range(ps.STEPS - 1):
                latents = ps.denoise_step(denoiser, latents, text, step)
            with run.final_pass():
                latents = ps.denoise_step(denoiser, latents, text, ps.STEPS - 1)
        with run.stage("vae") as vae:
            return vae(latents).cpu()


def device_memory(device: str) -> int:
    """Bytes the device's allocator holds for tensors (0 on the CPU, whose memory the RSS tests
    of test_pipeline.py look after)."""
    if device != "cuda":
        return 0
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


@pytest.mark.parametrize("device", DEVICES)
def test_runs_equal_the_plain_pipeline_on_the_device(folder: Path, device: str) -> None:
    want = ps.plain(folder, device)
    gc.collect()
    start = device_memory(device)
    # keep=False: nothing stays for the next run, so each run reads every stage again and the
    # denoiser's final pass frees every block it holds.
    with tp.Pipeline(stages(folder), device=device, keep=False) as pipe:
        held: list[int] = []
        for _ in range(2):
            image = one_run(pipe, device)
            assert torch.equal(image, want)
        for run in (1, 2):
            records = {r.stage: r for r in pipe.records if r.run == run}
            assert records["transformer"].departure == Departure.FINAL_PASS
            assert records["vae"].arrival == Arrival.READ_AHEAD
            held.append(records["transformer"].holds)
        assert all(h > 0 for h in held)
        report = pipe.report()
        assert "run 2 vae: read ahead" in report
    assert pipe.loaded == []
    gc.collect()
    end = device_memory(device)
    assert end <= start + 0.05 * max(start, 1 << 20), (start, end)


@pytest.mark.parametrize("device", DEVICES)
def test_kept_stages_run_again_equal_on_the_device(folder: Path, device: str) -> None:
    """With the machine's memory, every stage stays loaded after the first run; the runs after
    use them as they are."""
    want = ps.plain(folder, device)
    with tp.Pipeline(stages(folder), device=device) as pipe:
        for _ in range(3):
            assert torch.equal(one_run(pipe, device), want)
        assert [r.arrival for r in pipe.records if r.run == 3] == [Arrival.KEPT, Arrival.KEPT, Arrival.KEPT]
        assert pipe.loaded == list(ps.COMPONENTS)
    assert pipe.loaded == []
