"""Broken variants of the CUDA path: each puts back one defect a check must catch.

``TRASH_PANDA_FAULT=name[,name...]`` applies them to every test of a run (conftest.py's autouse
fixture), so ``scripts/gpu-check.sh`` can run a GPU check once as it is (it must pass) and once
with the defect it names put back (it must fail). The CPU tests use the same variants to show
that their own checks fail on the old behaviour. Each variant patches the code at a seam named
for what it decides, through ``monkeypatch``, so it is undone at the end of the test.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

Fault = Callable[[pytest.MonkeyPatch], None]

# name -> (what it puts back, how)
FAULTS: dict[str, tuple[str, Fault]] = {}


def fault(name: str, what: str) -> Callable[[Fault], Fault]:
    def register(apply: Fault) -> Fault:
        FAULTS[name] = (what, apply)
        return apply

    return register


def apply(monkeypatch: pytest.MonkeyPatch, names: str | list[str]) -> None:
    """Puts back the defects ``names`` (a list, or names separated by commas)."""
    wanted = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
    for name in [n for n in wanted if n]:
        if name not in FAULTS:
            known = ", ".join(sorted(FAULTS))
            raise pytest.UsageError(f"TRASH_PANDA_FAULT: no fault named {name!r}; the faults are {known}")
        FAULTS[name][1](monkeypatch)


def from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    names = os.environ.get("TRASH_PANDA_FAULT", "")
    if names:
        apply(monkeypatch, names)


# The old code each variant puts back, kept here so the library holds only the fixed one.


@fault("first-copy-wait", "the first copy into each device slot waits for nothing")
def _first_copy_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    from trash_panda.offload.backends.copies import SlotCopies

    monkeypatch.setattr(SlotCopies, "_allocated", lambda self: None)


@fault("retire-current-stream", "a freed block's memory waits only for the stream current at its free")
def _retire_current_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    from trash_panda.offload.backends.cuda import DeviceBackend

    def retire(self: DeviceBackend, block: object, t: object) -> None:
        self.device.record_stream(t, self.device.current_stream())  # type: ignore[arg-type]

    monkeypatch.setattr(DeviceBackend, "retire", retire)


@fault("close-no-sync", "a backend without slots frees its expansion buffer without waiting for the device")
def _close_no_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    from trash_panda.offload.backends.cuda import DeviceBackend

    monkeypatch.setattr(DeviceBackend, "_close_wait", lambda self: None)


@fault("loader-default-stream", "the loader copies with .to(device), on its thread's current stream, blocking")
def _loader_default_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from trash_panda.offload.backends.loader_copies import LoaderCopies

    def put(self: LoaderCopies, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        main = getattr(self.device, "main", None)
        if main is None:  # a GPU: what the loader did before
            return [t.to(self.device.device) for t in tensors]  # type: ignore[attr-defined]
        out = []
        for t in tensors:  # the virtual device: the same, on the thread's current stream
            dst = main.empty(t.numel() * t.element_size())
            if t.numel():
                copied = main.copy_on(main.current_stream(), dst, t.reshape(-1).view(torch.uint8), None)
                main.wait(copied)  # .to() without non_blocking holds the host until it is done
            out.append(dst.view(t.dtype).reshape(t.shape))
        return out

    monkeypatch.setattr(LoaderCopies, "put", put)


@fault("ram-tier-on-arrival", "a RAM tier read after the backend was made is never pinned")
def _ram_tier_on_arrival(monkeypatch: pytest.MonkeyPatch) -> None:
    from trash_panda.offload.backends.cuda import DeviceBackend

    monkeypatch.setattr(DeviceBackend, "ram_tier_arrived", lambda self: None)


@fault("lease-views", "a copy waiting for its block keeps the view of its staging buffer")
def _lease_views(monkeypatch: pytest.MonkeyPatch) -> None:
    from trash_panda.offload.backends.copies import SlotCopies

    def return_leases(self: SlotCopies) -> None:
        keep = []
        for copy in self.returning:
            if self._may_return(copy):
                assert copy.host is not None
                self.device.released(copy.host, copy.lease)
                copy.lease.release()
            else:
                keep.append(copy)
        self.returning = keep

    monkeypatch.setattr(SlotCopies, "_return_leases", return_leases)


@fault("pageable-prefetch", "with pinning declined, the copies ahead are queued before the block's kernels")
def _pageable_prefetch(monkeypatch: pytest.MonkeyPatch) -> None:
    from trash_panda.offload.backends.copies import SlotCopies

    monkeypatch.setattr(SlotCopies, "_prefetch_after_kernels", lambda self: False)


@fault("staging-unpinned", "the staging buffers are not registered as pinned")
def _staging_unpinned(monkeypatch: pytest.MonkeyPatch) -> None:
    from trash_panda.offload.backends import cuda
    from trash_panda.offload.backends.copies import CudaDevice

    real = CudaDevice.pin

    def pin(self: CudaDevice, owner: object, ranges: list[tuple[int, int]], fallback: str) -> object:
        return None if fallback == cuda.STAGING_FALLBACK else real(self, owner, ranges, fallback)

    monkeypatch.setattr(CudaDevice, "pin", pin)


# The device meter's gauge as it was: each reading waited for the device, and each window event
# reset torch's one peak counter (the user's) to read the window's peak from it.


def _old_current(self: Any) -> int:
    import torch

    torch.cuda.synchronize(self.device)
    return int(torch.cuda.memory_allocated(self.device))


def _old_peak(self: Any, settle: bool = True) -> int:
    import torch

    if settle:
        torch.cuda.synchronize(self.device)
    grown = int(torch.cuda.max_memory_reserved(self.device)) - getattr(self, "_reserved_at_reset", 0)
    return max(int(torch.cuda.max_memory_allocated(self.device)), getattr(self, "_allocated_at_reset", 0) + grown)


def _old_reset(self: Any, settle: bool = True) -> None:
    import torch

    if settle:
        torch.cuda.synchronize(self.device)
    torch.cuda.reset_peak_memory_stats(self.device)
    self._allocated_at_reset = int(torch.cuda.memory_allocated(self.device))
    self._reserved_at_reset = int(torch.cuda.memory_reserved(self.device))


def _old_close(self: Any) -> None:
    pass


@fault("meter-reset", "the device meter resets torch's peak counter at each window event and waits for the device")
def _meter_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    from trash_panda.offload.meter import CudaGauge

    for name, old in {"current": _old_current, "peak": _old_peak, "reset": _old_reset, "close": _old_close}.items():
        monkeypatch.setattr(CudaGauge, name, old)


@fault("compute-no-wait", "a block's kernels do not wait for the copy into its slot")
def _compute_no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    from trash_panda.offload.backends.copies import CudaDevice

    def mark_only(self: CudaDevice, event: object) -> object:
        import torch

        mark = torch.cuda.Event(enable_timing=True)
        mark.record(torch.cuda.current_stream(self.device))
        return mark

    monkeypatch.setattr(CudaDevice, "compute_waits", mark_only)


@fault("loader-no-event-wait", "a block read ahead computes without waiting for its loader's copies")
def _loader_no_event_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    from trash_panda.offload.backends.loader_copies import LoaderCopies

    monkeypatch.setattr(LoaderCopies, "waits", lambda self, key: None)
