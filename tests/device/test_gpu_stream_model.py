"""bench/gpu_stream.py predicts each setting's pass with the virtual-time model; the fill rate it
gives the model is read off the engine's own record of its stagings. The model shares one rate
among the fills under way, so the rate it takes is the workers' together: read from the model's
own stagings, the estimate gives back the rate the model ran with, and the same step."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from support.vtdevice import predict_step

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from gpu_stream import total_fill_rate

LINK = 50e9
SIZE = 256_000_000


def _one_worker(stagings: list[tuple[float, float, int]]) -> float:
    """What the benchmark took before: bytes over the sum of the stagings' times."""
    return sum(n for _a, _b, n in stagings) / sum(b - a for a, b, _n in stagings)


def test_the_union_of_the_workers_intervals_is_the_fill_time() -> None:
    # Two workers filling 1 GB each over the same second, then one alone for half a second.
    stagings = [(0.0, 1.0, 10**9), (0.0, 1.0, 10**9), (2.0, 2.5, 10**9)]
    assert total_fill_rate(stagings) == pytest.approx(3e9 / 1.5)
    assert _one_worker(stagings) == pytest.approx(3e9 / 2.5)
    assert total_fill_rate([]) is None


@pytest.mark.parametrize("workers", [1, 2])
def test_the_rate_read_off_the_model_s_stagings_predicts_its_own_step(workers: int) -> None:
    fill = LINK / 2  # the fills bound the step, so a wrong rate shows in it
    r = predict_step(SIZE, 0.1 * SIZE / LINK, 2, LINK, fill, workers=workers)
    stagings = [(s.start, s.end, s.bytes) for s in r["stagings"]]
    estimate = total_fill_rate(stagings)
    assert estimate == pytest.approx(fill, rel=0.02)
    again = predict_step(SIZE, 0.1 * SIZE / LINK, 2, LINK, estimate, workers=workers)
    assert again["step_s"] == pytest.approx(r["step_s"], rel=0.02)
    if workers == 2:  # one worker's rate: the prediction twice too slow
        wrong = predict_step(SIZE, 0.1 * SIZE / LINK, 2, LINK, _one_worker(stagings), workers=workers)
        assert wrong["step_s"] > 1.5 * r["step_s"]
