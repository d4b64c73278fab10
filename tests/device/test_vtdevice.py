"""The virtual-time device's rules, each against CUDA's semantics as documented (the CUDA
programming guide on streams, events and pageable copies; PyTorch's notes on the caching
allocator and ``Tensor.record_stream``), not against the code the device is used to prove: a rule
here changes only when CUDA's does."""

from __future__ import annotations

import gc
import threading

import pytest
import torch
from torch.utils.dlpack import from_dlpack

from support.vtdevice import VEvent, VirtualDevice, VirtualEngine

NS = 1e-9  # at 1 GB/s, a byte takes 1 ns


def _dev(**kw: object) -> VirtualDevice:
    return VirtualDevice(link_bps=1e9, launch_s=0.0, call_s=0.0, **kw)  # type: ignore[arg-type]


def _host(n: int = 1000) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.uint8)


# -- streams and events -----------------------------------------------------------------------


def test_the_host_queues_and_goes_on_while_each_stream_runs_in_order() -> None:
    dev = _dev()
    a, b = dev.empty(1000), dev.empty(1000)
    first = dev.copy(a, _host(), None)
    second = dev.copy(b, _host(), None)
    assert (first.start.t, first.done.t, second.start.t) == (0.0, 1e-6, 1e-6)
    mark = dev.compute_waits(first)
    run = dev.run_compute(5e-6, reads=a)
    assert (mark.t, run.start, run.end, dev.now) == (0.0, 1e-6, 6e-6, 0.0)  # the host did not wait
    done = dev.compute_done()
    assert not dev.ready(done) and dev.ready(VEvent(0.0))
    third = dev.copy(a, _host(), after=done)  # waits for the compute that read the slot
    assert third.start.t == 6e-6 and dev.now == 0.0
    dev.wait(third)
    assert dev.now == third.done.t == 7e-6 and dev.violations == []


def test_a_stream_made_to_wait_for_an_event_runs_nothing_queued_after_the_wait_before_it() -> None:
    dev = _dev()
    other = dev.new_stream("other")
    with dev.use(other):
        dev.run_compute(1e-3)
        late = dev.compute_done()
    dev.compute_waits(late)
    after = dev.run_compute(1e-6)
    assert after.start == pytest.approx(1e-3) and after.stream == "default"


def test_synchronize_waits_for_every_stream() -> None:
    dev = _dev()
    other = dev.new_stream("other")
    with dev.use(other):
        dev.run_compute(2e-3)
    dev.run_compute(1e-3)
    dev.synchronize()
    assert dev.now == pytest.approx(2e-3)


# -- the current stream of each host thread ---------------------------------------------------


def test_each_thread_has_its_own_current_stream() -> None:
    dev = _dev()
    mine = dev.new_stream("mine")
    seen: list[str] = []

    def other_thread() -> None:
        seen.append(dev.current_stream().name)
        seen.append(dev.run_compute(1e-6).stream)

    with dev.use(mine):
        assert dev.current_stream() is mine
        assert dev.run_compute(1e-3).stream == "mine"
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
    assert seen == ["default", "default"], "another thread's work went to the caller's stream"
    assert dev.current_stream() is dev.default_stream
    # The other thread's compute did not wait behind the caller's stream.
    assert dev.computes[-1].start == 0.0


def test_a_wait_on_another_thread_moves_only_that_thread_s_clock() -> None:
    dev = _dev()
    dev.run_compute(5e-3)
    done = dev.compute_done()
    seen: list[float] = []

    def side() -> None:
        seen.append(dev.clock())
        done.synchronize()
        seen.append(dev.clock())

    t = threading.Thread(target=side)
    t.start()
    t.join()
    assert seen == [0.0, 5e-3] and dev.now == 0.0


# -- one copy engine --------------------------------------------------------------------------


def test_copies_on_every_stream_share_one_copy_engine() -> None:
    dev = _dev()
    loader = dev.side()
    a, b = dev.empty(1000), dev.empty(1000)
    mine = dev.copy(a, _host(), None)
    theirs = loader.copy(b, _host(), None)  # ready at once, on a stream of its own
    assert theirs.stream != mine.stream
    assert theirs.start.t == pytest.approx(mine.done.t), "two copies ran on the link at once"


def test_a_copy_waiting_for_its_event_leaves_the_engine_to_one_that_can_run() -> None:
    dev = _dev()
    loader = dev.side()
    a, b = dev.empty(1000), dev.empty(1000)
    dev.run_compute(1e-3)
    late = dev.compute_done()
    waiting = dev.copy(a, _host(), late)
    ready = loader.copy(b, _host(), None)
    assert waiting.start.t == pytest.approx(1e-3) and ready.start.t == 0.0


# -- pageable memory --------------------------------------------------------------------------


def test_a_copy_from_pageable_memory_holds_the_host_until_it_is_done() -> None:
    dev = _dev(pinned=False)
    slot = dev.empty(1000)
    dev.run_compute(1e-3)
    busy = dev.compute_done()
    copied = dev.copy(slot, _host(), busy)  # it waits for the compute, and the host with it
    assert dev.now == pytest.approx(copied.done.t) == pytest.approx(1e-3 + 1000 * NS)
    host = _host()
    registration = dev.pin(host, [(host.data_ptr(), host.numel())], "")
    before = dev.now
    fast = dev.copy(slot, host, None)
    assert dev.now == before < fast.done.t, "a copy from pinned memory held the host"
    registration.close()
    dev.copy(slot, host, None)
    assert dev.now > fast.done.t


# -- the caching allocator --------------------------------------------------------------------


def test_freed_memory_goes_to_the_next_allocation_on_its_stream_at_once() -> None:
    """Queued kernels may still read it: the allocator does not wait for them, since work on
    the same stream runs after them anyway."""
    dev = _dev()
    x = dev.empty(4096)
    addr = x.data_ptr()
    dev.run_compute(1e-3, reads=x)
    del x
    y = dev.empty(4096)
    assert y.data_ptr() == addr
    dev.run_compute(1e-6, writes=y)  # the same stream: after the reads
    assert dev.violations == []


def test_a_fresh_allocation_carries_the_pending_reads_of_its_stream() -> None:
    dev = _dev()
    x = dev.empty(4096)
    dev.run_compute(1e-3, reads=x, what="block running")
    del x
    slot = dev.empty(4096)
    dev.copy(slot, _host(4096), None)  # the copy stream does not wait for the default one
    assert any("refilled" in v and "block running" in v for v in dev.violations), dev.violations


def test_an_event_after_the_allocation_orders_another_stream_after_those_reads() -> None:
    dev = _dev()
    x = dev.empty(4096)
    dev.run_compute(1e-3, reads=x)
    del x
    slot = dev.empty(4096)
    made = dev.compute_done()
    copied = dev.copy(slot, _host(4096), made)
    assert copied.start.t == pytest.approx(1e-3) and dev.violations == []


def test_memory_freed_on_one_stream_is_not_handed_to_another() -> None:
    dev = _dev()
    other = dev.new_stream("other")
    x = dev.empty(4096)
    addr = x.data_ptr()
    del x
    with dev.use(other):
        y = dev.empty(4096)
    assert y.data_ptr() != addr
    assert dev.empty(4096).data_ptr() == addr


def test_record_stream_keeps_freed_memory_until_that_stream_s_work_has_run() -> None:
    dev = _dev()
    side = dev.new_stream("side")
    x = dev.empty(4096)
    addr = x.data_ptr()
    with dev.use(side):
        dev.run_compute(1e-3, reads=x)
    dev.record_stream(x, side)
    del x
    early = dev.empty(4096)
    assert early.data_ptr() != addr, "handed out while the side stream still reads it"
    dev.wait(VEvent(1e-3))
    assert dev.empty(4096).data_ptr() == addr


def test_without_record_stream_memory_read_on_another_stream_is_handed_out_at_once() -> None:
    dev = _dev()
    side = dev.new_stream("side")
    x = dev.empty(4096)
    with dev.use(side):
        dev.run_compute(1e-3, reads=x, what="on side")
    del x
    y = dev.empty(4096)
    dev.run_compute(1e-6, writes=y)
    assert any("on side" in v and "writes" in v for v in dev.violations), dev.violations


def test_a_copy_records_its_stream_on_its_destination() -> None:
    dev = _dev()
    x = dev.empty(4096)
    addr = x.data_ptr()
    dev.run_compute(1e-3)
    dev.copy(x, _host(4096), dev.compute_done())  # runs at 1 ms, on the copy stream
    del x
    assert dev.empty(4096).data_ptr() != addr


def test_memory_is_freed_only_when_every_view_and_dlpack_tensor_is_gone() -> None:
    dev = _dev()
    x = dev.empty(4096)
    a = dev.allocation(x)
    assert a is not None
    view = x[100:200].view(torch.int16)
    shared = from_dlpack(x[:10])
    del x
    gc.collect()
    assert a.live
    del view
    assert a.live
    del shared
    assert not a.live


# -- hazards ----------------------------------------------------------------------------------


def test_reads_after_writes_on_other_streams_need_an_event() -> None:
    dev = _dev()
    slot = dev.empty(1000)
    dev.copy(slot, _host(), None)
    dev.run_compute(1e-6, reads=slot)  # the compute stream never waited for the copy
    assert "the copy into it lands at" in dev.violations[-1]


def test_two_reads_on_different_streams_are_no_hazard() -> None:
    dev = _dev()
    other = dev.new_stream("other")
    x = dev.empty(1000)
    dev.run_compute(1e-3, reads=x)
    with dev.use(other):
        dev.run_compute(1e-3, reads=x)
    assert dev.violations == []


def test_a_staging_buffer_returned_while_a_copy_reads_it_is_recorded() -> None:
    dev = _dev(poison=False)
    slot, host = dev.empty(1000), _host()
    dev.copy(slot, host, None)
    dev.released(host, None)
    assert "returned to the engine while a copy reads it" in dev.violations[-1]


# -- the engine's leases ----------------------------------------------------------------------


def test_a_lease_s_buffer_goes_back_only_when_every_view_of_it_is_gone() -> None:
    dev = _dev()
    eng = VirtualEngine(dev, blocks=4, block_bytes=1000, lookahead=1, buffers=1, fill_bps=None)
    lease = eng.acquire(0)
    view = from_dlpack(lease.block_bytes())
    lease.release()
    assert eng.buffers[0].state == "leased", "the buffer went back while a view of it was alive"
    part = view[10:20]
    del view
    assert eng.buffers[0].state == "leased"
    del part
    assert eng.buffers[0].state != "leased"
    nxt = eng.acquire(1)  # the one buffer stages the next block
    assert nxt.block == 1
