"""The activation memory a stage remembers is its own: other stages' loads and releases while it
runs are not in it (the device's peak counter is one for everybody), nor, on the CPU, the pages
of the checkpoint's map that its blocks touch."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import trash_panda as tp
from support.models import Tiny, on_meta, save
from trash_panda import _core
from trash_panda.offload.meter import Meter
from trash_panda.options import remembered_activation

IDS = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(6))


class FakeGauge:
    """A device's memory counter: one peak for the whole device, restarted at each of the
    meter's marks (every window's event restarts it, so the meter must keep each window's peak
    across the others' events)."""

    exact = True

    def __init__(self) -> None:
        self.now = 0
        self.top = 0

    def set(self, n: int) -> None:
        self.now = n
        self.top = max(self.top, n)

    def current(self) -> int:
        return self.now

    def peak(self) -> int:
        return self.top

    def reset(self) -> None:
        self.top = self.now

    def close(self) -> None:
        pass


def test_overlapping_windows_keep_their_own_peaks() -> None:
    gauge = FakeGauge()
    meter = Meter(gauge)
    gauge.set(1000)  # stage A's weights
    a = meter.start()
    gauge.set(1500)  # A computes
    gauge.set(1000)
    with meter.paused():  # stage B loads its weights
        gauge.set(9000)
        gauge.set(5000)
    b = meter.start()  # B's window restarts the device's peak: A's 500 must survive it
    gauge.set(5200)  # B computes
    gauge.set(5000)
    gauge.set(5300)  # A computes again, with B loaded
    gauge.set(5000)
    with meter.paused():  # B is released
        gauge.set(1000)
    gauge.set(1100)
    assert meter.stop(b) == 300
    assert meter.stop(a) == 500


def test_weights_moved_in_beside_the_windows_are_not_activations() -> None:
    """stage(overlap=True)'s loader puts tensors on the device while the windows are open."""
    gauge = FakeGauge()
    meter = Meter(gauge)

    def put(n: int) -> Callable[[], int]:
        def go() -> int:
            gauge.set(gauge.now + n)
            return n

        return go

    assert meter.moved_in(put(1000)) == 1000  # no window open yet
    a = meter.start()  # its baseline holds those 1000: they are not taken off again
    gauge.set(1400)  # A computes: 400
    meter.moved_in(put(2000))  # arrives while A's 400 are held
    b = meter.start()  # B opens with the 2000 and A's 400 in its baseline
    gauge.set(3100)
    with meter.paused():  # another model loads 5000 while a tensor arrives: moved once
        gauge.set(8100)
        meter.moved_in(put(500))
    gauge.set(9000)  # A and B compute 400 more
    assert meter.stop(b) == 100
    assert meter.stop(a) == 500


def test_a_put_waiting_for_the_drive_does_not_hold_up_the_windows() -> None:
    """A loader's put may wait behind the running model's reads: opening, closing and pausing
    windows meanwhile does not wait for it, and what it brings is counted once it is in, or
    counted more (never less) in a window that closes while it arrives."""
    import threading

    gauge = FakeGauge()
    meter = Meter(gauge)
    a = meter.start()
    half, go = threading.Event(), threading.Event()

    def put() -> int:
        gauge.set(gauge.now + 1000)  # the first half of 2000 is in
        half.set()
        assert go.wait(60)
        gauge.set(gauge.now + 1000)
        return 2000

    loader = threading.Thread(target=meter.moved_in, args=(put,))
    loader.start()
    assert half.wait(60)
    got: list[int] = []

    def during() -> None:  # each of these waited for the whole put when it held the lock
        b = meter.start()
        gauge.set(gauge.now + 300)  # B computes 300
        got.append(meter.stop(b))
        got.append(id(meter.start()))

    events = threading.Thread(target=during)
    events.start()
    events.join(10)
    go.set()  # on a failure, lets both threads end rather than hang the run
    assert not events.is_alive() and len(got) == 2, "a window's event waited for the put"
    assert got[0] == 300
    c = next(w for w in meter.windows if id(w) == got[1])
    loader.join(60)
    assert not loader.is_alive()
    gauge.set(gauge.now + 50)
    assert meter.stop(c) == 1050  # opened with half of it in: the other half counts, never less
    # Open from before the put to after: the 2000 are taken off its readings after the put,
    # but B's and C's events read the peak while half of it was in: that half stays counted.
    assert meter.stop(a) == 1300
    d = meter.start()
    assert meter.moved_in(lambda: gauge.set(gauge.now + 500) or 500) == 500
    gauge.set(gauge.now + 20)
    assert meter.stop(d) == 20  # nothing happened during the put: exact


def test_a_window_knows_when_another_thread_paused_it() -> None:
    """A load or release on the window's own thread comes between its calls; one on another
    thread (a pipeline setting its next stage up) may hide a peak of the window's: the window
    says so, and the pipeline then keeps the larger of that peak and the one remembered."""
    import threading

    from trash_panda.offload.meter import measured, meter_for

    meter = Meter(FakeGauge())
    a = meter.start()
    with meter.paused():
        pass
    assert not a.overlapped
    held: list[Any] = []

    def load() -> None:  # a pause begun on another thread, left open
        held.append(meter.paused())
        held[0].__enter__()

    other = threading.Thread(target=load)
    other.start()
    other.join()
    assert a.overlapped
    b = meter.start()  # opened inside that pause
    assert b.overlapped
    held[0].__exit__(None, None, None)
    with measured(torch.device("cpu")) as out:
        pass
    assert out[1] == 0 and meter_for(torch.device("cpu")) is not meter


def test_weights_freed_beside_a_window_are_taken_off_its_baseline_only() -> None:
    """An idle stage gives back blocks while another computes: the window's baseline moves
    down by the bytes freed, and what the window allocates meanwhile stays its own (a pause
    would move the baseline by both)."""
    gauge = FakeGauge()
    meter = Meter(gauge)
    gauge.set(5000)
    a = meter.start()
    gauge.set(5200)  # 200 of activations

    def free() -> int:
        gauge.set(gauge.now - 1000)  # the idle stage's blocks
        gauge.set(gauge.now + 300)  # the running stage allocates 300 meanwhile
        return 1000

    assert meter.freed_beside(free) == 1000
    gauge.set(gauge.now + 100)
    assert meter.stop(a) == 600


def test_a_window_opened_while_weights_are_freed_beside_it_keeps_its_activations() -> None:
    """The next stage's set-up gives back an idle stage's blocks while the running stage opens
    its window: the window's baseline is read after the drop, not before it, which would hide
    the activations under the bytes freed."""
    import threading

    gauge = FakeGauge()
    meter = Meter(gauge)
    gauge.set(1000)
    freeing = threading.Event()

    def free() -> int:
        freeing.set()
        time.sleep(0.05)  # the window opens now, on the other thread
        gauge.set(gauge.now - 600)
        return 600

    beside = threading.Thread(target=meter.freed_beside, args=(free,))
    beside.start()
    assert freeing.wait(10)
    window = meter.start()
    gauge.set(gauge.now + 200)  # the running stage's activations
    beside.join()
    assert meter.stop(window) == 200


def test_a_put_that_reuses_freed_heap_pages_moves_the_baseline_by_what_grew() -> None:
    """On the CPU a tensor read may land in pages glibc kept from earlier frees: private memory
    grows by less than its bytes, and the baseline moves by what grew, so the activations are
    not short by the difference."""
    gauge = FakeGauge()
    gauge.exact = False
    meter = Meter(gauge)
    a = meter.start()
    gauge.set(200)  # activations

    def put() -> int:
        gauge.set(gauge.now + 400)  # 1000 bytes read, 600 of them into reused pages
        return 1000

    assert meter.moved_in(put) == 1000
    gauge.set(gauge.now + 100)
    assert meter.stop(a) == 300


@pytest.fixture
def big(tmp_path: Path) -> tuple[Path, Tiny]:
    torch.manual_seed(0)
    ref = Tiny(dim=512, layers=6).eval()  # 8 MB of fp32 weights a block
    return save(ref, tmp_path / "big.safetensors"), ref


def build_big() -> Tiny:
    return on_meta(Tiny, dim=512, layers=6)  # type: ignore[return-value]


def test_a_stage_does_not_count_another_stages_load(big: tuple[Path, Tiny], tmp_path: Path) -> None:
    path, ref = big
    torch.manual_seed(1)
    small = save(Tiny().eval(), tmp_path / "small.safetensors")
    with tp.stage(lambda: on_meta(Tiny), small, device="cpu", key="small") as (a, _pa, _ha), torch.no_grad():
        a(IDS)
        # A second model opened inside the first's block, as load_pipeline(chain=False) does:
        # its 32 MB of resident weights are loaded and released while the first's window is open.
        with tp.stage(build_big, path, device="cpu", resident_blocks=4, key="big") as (b, _pb, _hb):
            assert torch.equal(b(IDS), ref(IDS))
        a(IDS)
    first = remembered_activation("small")
    assert first is not None and first < 8 << 20, first


def test_mapped_pages_are_not_activation_memory(big: tuple[Path, Tiny]) -> None:
    path, ref = big
    resident = _core.RssSampler(1)
    with tp.stage(build_big, path, device="cpu", resident_blocks=0, key="mapped") as (m, p, _h), torch.no_grad():
        assert p.blocks_in("ram") == [f"blocks.{i}." for i in range(6)]
        assert torch.equal(m(IDS), ref(IDS))
    start, top, _end = resident.stop()
    # The pass did touch the checkpoint's map: the resident set rose by the blocks' pages.
    assert top - start > 24 << 20, (start, top)
    got = remembered_activation("mapped")
    assert got is not None and got < 8 << 20, got


@pytest.mark.skipif(not hasattr(__import__("mmap"), "MAP_PRIVATE"), reason="POSIX maps")
def test_the_cpu_gauge_sees_a_large_read_arrive_and_leave(tmp_path: Path) -> None:
    """Tensors read into pages of their own (from 1 MiB on) are private memory: the CPU gauge
    sees them arrive and, once freed, leave. Pages it could not see (a shared map is shmem)
    would make a block given back beside a running stage look like that stage's activations."""
    from safetensors.torch import save_file

    from trash_panda.checkpoint import Checkpoint
    from trash_panda.offload.materialize import FRESH_BYTES, read_many

    n = 64 * FRESH_BYTES
    path = tmp_path / "big.safetensors"
    save_file({"w": torch.ones(n // 4)}, str(path))
    info = Checkpoint(path).info("w")
    before = _core.private_memory()
    (t,) = read_many([info], threads=1)
    assert bool(t[-1] == 1)
    grown = _core.private_memory() - before
    del t
    shrunk = _core.private_memory() - before
    # Other threads may allocate meanwhile: a margin of 16 MiB on 64.
    assert grown > n - 16 * 2**20, (grown, n)
    assert shrunk < 16 * 2**20, (shrunk, n)
