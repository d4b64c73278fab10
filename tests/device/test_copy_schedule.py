"""The schedule of the device bookkeeping, proven on a device that runs ahead like a real one
(vtdevice.py: CUDA's semantics in virtual time). For every RAM-tier form and lookahead, the steady
step of a streamed block is within 1.05x of max(copy, compute, fill), and the link is busy at least
95% of the time whenever copies are the bottleneck. ``bench/schedule_sweep.py`` runs the full grid
and writes the table in BENCHMARK.md."""

from __future__ import annotations

import itertools

import pytest

from support.vtdevice import VirtualDevice, predict_step
from trash_panda.offload.backends.copies import SlotCopies

LINK = 50e9  # bytes/s: pinned host-to-device copies on PCIe 5 x16 (an H100 or H200 host)
# fill_bps of each RAM-tier form: None, the private tier in pinned memory copied directly; a
# rate, every block staged first (a mapped tier or the disk tier) at that fill rate.
FORMS = {
    "direct": None,
    "staged, fill 2x link": 2 * LINK,
    "staged, fill = link": LINK,
    "staged, fill = link/2": LINK / 2,
}
SIZES = (64_000_000, 1_000_000_000)  # block bytes; only the host's fixed costs tell sizes apart
RATIOS = (0.1, 0.5, 0.9, 1.0, 1.1, 2.0, 10.0)  # compute / copy
STEP_BOUND = 1.05
BUSY_BOUND = 0.95


@pytest.mark.parametrize("lookahead", [1, 2, 4])
@pytest.mark.parametrize("form", list(FORMS))
def test_the_steady_step_is_the_slowest_of_copy_compute_and_fill(form: str, lookahead: int) -> None:
    misses = []
    for size, ratio in itertools.product(SIZES, RATIOS):
        r = predict_step(size, ratio * size / LINK, lookahead, LINK, FORMS[form])
        assert r["violations"] == []
        copy_bound = r["copy_s"] >= max(r["compute_s"], r["fill_s"], r["host_s"])
        if r["ratio"] > STEP_BOUND or (copy_bound and r["link_busy"] < BUSY_BOUND):
            misses.append(
                f"{size / 1e6:.0f} MB, compute {ratio}x copy: step {r['ratio']:.3f}x ideal, "
                f"link busy {r['link_busy']:.1%}"
            )
    assert not misses, "\n".join(misses)


@pytest.mark.parametrize("compute_ms", [5, 15])
def test_copies_overlap_compute_with_1_gb_blocks(compute_ms: int) -> None:
    """The case that started the schedule: without the overlap, 1 GB blocks at 5 ms of compute kept the link
    busy 80% of the time (57% at 15 ms), each block costing copy + compute."""
    r = predict_step(1_000_000_000, compute_ms / 1000, 2, LINK, 2 * LINK)
    assert r["step_s"] == pytest.approx(0.020, rel=0.01)
    assert r["link_busy"] >= BUSY_BOUND


def test_fewer_blocks_than_buffers_never_lease_a_block_twice() -> None:
    """With fewer streamed blocks than staging buffers the host comes round to a block while its
    last copy may still be in flight; the pipeline waits for that copy rather than ask the engine
    for a second lease of the block (which the engine refuses)."""
    for blocks, lookahead in [(2, 2), (3, 4), (2, 1)]:
        r = predict_step(64_000_000, 0.0001, lookahead, LINK, 2 * LINK, blocks=blocks)
        assert r["violations"] == []


@pytest.mark.parametrize(
    ("broken", "symptom"),
    [
        ("_may_return", "returned to the engine while a copy reads it"),
        ("compute_waits", "the copy into it lands at"),
        ("_free_slot", "refilled"),
    ],
)
def test_the_pipeline_breaking_a_rule_is_caught(monkeypatch: pytest.MonkeyPatch, broken: str, symptom: str) -> None:
    if broken == "_may_return":  # a lease goes back before its copy completed
        monkeypatch.setattr(SlotCopies, "_may_return", lambda self, copy: True)
    elif broken == "compute_waits":  # the compute stream does not wait for the copy
        monkeypatch.setattr(VirtualDevice, "compute_waits", lambda self, event: None)
    else:  # the slot choice forgets which slots are held
        monkeypatch.setattr(SlotCopies, "_free_slot", lambda self: 0)
    r = predict_step(64_000_000, 0.002, 2, LINK, 2 * LINK)
    assert any(symptom in v for v in r["violations"]), r["violations"][:3]
