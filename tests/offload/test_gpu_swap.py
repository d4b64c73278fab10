"""handle.release_gpu() / handle.restore_gpu(): the weights in device memory go to host memory
and come back bit for bit.

Without a GPU the moves run through the simulated asynchronous device (simdevice.py) as the
"device", with host buffers it does not count as its own: its copies land late and it poisons
every destination when a copy is queued, so a swap that used a side before its copies ended
would compute on poison. The streamed blocks run through the device bookkeeping on the same
device, as in test_device_pipeline.py. The last test runs the real path on a GPU.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import trash_panda as tp
from conftest import ReadsWith, bits
from support.checkpoints import every_tier, fp8_checkpoint, ids, reference
from support.cudart import FakeCudart
from support.models import Tiny, on_meta, save
from support.simdevice import SimMemory, SimulatedDevice
from trash_panda import Tier
from trash_panda.errors import ArgumentError, StreamError
from trash_panda.offload import gpu_swap, overlap
from trash_panda.offload.backends.cuda import DeviceBackend
from trash_panda.offload.gpu_swap import GPU_RELEASED, CudaMemory, HostCopy, weights_on_device
from trash_panda.offload.handle import OffloadHandle, _install
from trash_panda.offload.state import ModelState, get_state

LAYERS = 6


class PinnedSim(SimMemory):
    """The simulated device, with the CUDA path's own host side: one buffer registered as pinned
    (through a fake cudart)."""

    def host_buffer(self, nbytes: int) -> HostCopy:
        host = CudaMemory.host_buffer(self, nbytes)  # type: ignore[arg-type]
        self.hosts.append((host.data.data_ptr(), host.data.data_ptr() + max(nbytes, 1)))
        return host


def _loaded(tmp_path: Path, fp8: bool = False) -> tuple[nn.Module, nn.Module]:
    """A model with resident, RAM and disk blocks under a GPU plan, computed on the CPU; and the
    reference it must equal."""
    ref = reference(torch.float32)
    if fp8:
        want = fp8_checkpoint(ref, tmp_path / "m.safetensors")
        path = tmp_path / "m.safetensors"
    else:
        want = ref.to(torch.bfloat16)
        path = save(want, tmp_path / "m.safetensors", torch.bfloat16)
    model = on_meta(Tiny)
    p = tp.plan(model, path, vram="1TB", ram="1TB", resident_blocks=2, lookahead=2)
    p.assign(Tier.DISK, indices=[4, 5])
    tp.stream_load(model, path, plan=p, device="cpu")
    return model, want


def _hooked(model: nn.Module, sim: SimulatedDevice) -> OffloadHandle:
    state = get_state(model)
    assert state is not None

    def backend(s: ModelState) -> DeviceBackend:
        return DeviceBackend(s, sim)

    return _install(model, state, state.blocks, None, backend)


def _held(model: nn.Module) -> dict[int, torch.Tensor]:
    """Every real tensor the model and its hooks hold (parameters, buffers, resident stored
    forms), found here on their own."""
    state = get_state(model)
    assert state is not None
    found = [*model.parameters(), *model.buffers()]
    found += [t for b in state.blocks for s in b.tensors for t in (s.resident, s.resident_scale) if t is not None]
    return {id(t): t for t in found if not t.is_meta}


def _resident_and_outside_bytes(model: nn.Module) -> int:
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in _held(model).values()}
    return sum(storages.values())


def _snapshot(model: nn.Module) -> dict[int, tuple[torch.dtype, tuple[int, ...], torch.Tensor]]:
    return {i: (t.dtype, tuple(t.shape), bits(t).clone()) for i, t in _held(model).items()}


def _same(model: nn.Module, snap: dict[int, tuple[torch.dtype, tuple[int, ...], torch.Tensor]]) -> bool:
    now = _held(model)
    return set(now) == set(snap) and all(
        (t.dtype, tuple(t.shape)) == snap[i][:2] and torch.equal(bits(t), snap[i][2]) for i, t in now.items()
    )


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_release_and_restore_move_every_tensor_and_keep_the_output(
    tmp_path: Path, sim: SimulatedDevice, fp8: bool
) -> None:
    model, ref = _loaded(tmp_path, fp8)
    handle = _hooked(model, sim)
    mem = SimMemory(sim)
    x = ids()
    with torch.no_grad():
        want = ref(x)
        assert torch.equal(model(x), want)
    held = _resident_and_outside_bytes(model)
    assert weights_on_device(model, mem) == held > 0
    snap, layout = _snapshot(model), _layout(model)
    stored = {i: t.dtype for i, t in _held(model).items()}
    if fp8:
        assert torch.float8_e4m3fn in stored.values()  # resident blocks keep their stored form

    out = gpu_swap.release_gpu(handle, mem)
    assert out.changed and out.action == "release_gpu" and handle.gpu_released
    assert out.bytes == held and out.device_bytes == 0 and weights_on_device(model, mem) == 0
    assert out.host_bytes >= held and out.pinned and out.seconds >= 0 and mem.gave_back == 1
    assert out.kept_device_bytes == handle.backend.device_bytes() > 0  # the slots stay
    assert not any(mem.holds(t) for t in _held(model).values())  # every tensor is on the host
    assert _same(model, snap)  # ... with its bytes, dtype and shape, and the same objects

    back = handle.restore_gpu()
    assert back.changed and back.bytes == held and back.device_bytes == held and back.host_bytes == 0
    assert not handle.gpu_released and GPU_RELEASED not in handle.hooks
    assert mem.allocated == held
    assert all(mem.holds(t) for t in _held(model).values())
    assert {i: t.dtype for i, t in _held(model).items()} == stored
    assert {i: v[:3] for i, v in _layout(model).items()} == {i: v[:3] for i, v in layout.items()}
    assert _same(model, snap)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(model(x), want)
    tp.release(model, handle)


def _layout(model: nn.Module) -> dict[int, tuple[Any, ...]]:
    """Where each tensor lies in its storage, and the storage's size."""
    return {
        i: (t.stride(), t.storage_offset(), t.untyped_storage().nbytes(), t.untyped_storage().data_ptr())
        for i, t in _held(model).items()
    }


def test_tied_weights_and_views_of_one_storage_come_back_as_they_were(tmp_path: Path, sim: SimulatedDevice) -> None:
    model, ref = _loaded(tmp_path)
    # The head shares the embedding's weight (as tied language models do), and the final norm's
    # weight and bias are views of one storage (as fused weights are): each storage moves once.
    model.head.weight = model.embed.weight
    ref.head.weight = ref.embed.weight
    fused = torch.cat([model.norm.weight.detach(), model.norm.bias.detach()])
    model.norm.weight, model.norm.bias = nn.Parameter(fused[:64], False), nn.Parameter(fused[64:], False)
    del fused
    handle = _hooked(model, sim)
    mem = SimMemory(sim)
    x = ids()
    with torch.no_grad():
        want = ref(x)
    held = _resident_and_outside_bytes(model)
    layout = _layout(model)
    snap = _snapshot(model)
    out = gpu_swap.release_gpu(handle, mem)
    assert out.bytes == held and out.storages == len({v[3] for v in layout.values()})
    assert model.head.weight is model.embed.weight and not mem.holds(model.head.weight)
    assert model.norm.bias.untyped_storage().data_ptr() == model.norm.weight.untyped_storage().data_ptr()
    handle.restore_gpu()
    assert model.head.weight is model.embed.weight and mem.holds(model.head.weight)
    # Same strides, offsets and storage sizes (only the addresses changed), same bytes.
    assert {i: v[:3] for i, v in _layout(model).items()} == {i: v[:3] for i, v in layout.items()}
    assert _same(model, snap)
    with torch.no_grad():
        assert torch.equal(model(x), want)
    tp.release(model, handle)


@pytest.mark.parametrize("pin_fails", [False, True], ids=["pinned", "pageable"])
def test_the_host_copy_is_pinned_in_one_range_and_unpinned_once_back(
    tmp_path: Path, sim: SimulatedDevice, monkeypatch: pytest.MonkeyPatch, pin_fails: bool
) -> None:
    fake = FakeCudart(fail_register={1} if pin_fails else None)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    model, ref = _loaded(tmp_path)
    handle = _hooked(model, sim)
    mem = PinnedSim(sim)
    if pin_fails:
        with pytest.warns(UserWarning, match=r"could not pin .*copies them back more slowly"):
            out = gpu_swap.release_gpu(handle, mem)
        assert fake.registered == set() and fake.last_error == 0  # the error was cleared
    else:
        out = gpu_swap.release_gpu(handle, mem)
        (addr,) = fake.registered
        assert addr % 4096 == 0 and out.host_bytes >= out.bytes
    assert out.pinned == (not pin_fails) and fake.calls == 1
    handle.restore_gpu()
    assert fake.registered == set() and fake.last_error == 0
    with torch.no_grad():
        assert torch.equal(model(ids()), ref(ids()))
    tp.release(model, handle)


def test_a_call_restores_a_released_model(tmp_path: Path, sim: SimulatedDevice) -> None:
    model, ref = _loaded(tmp_path)
    handle = _hooked(model, sim)
    mem = SimMemory(sim)
    x = ids()
    with torch.no_grad():
        want = ref(x)
        gpu_swap.release_gpu(handle, mem)
        assert torch.equal(model(x), want)
        assert not handle.gpu_released and mem.allocated == weights_on_device(model, mem)
        # A block called on its own restores the whole model too.
        gpu_swap.release_gpu(handle, mem)
        h = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
        block = model.blocks[0]
        block(h)
        assert not handle.gpu_released
        assert torch.equal(model(x), want)
    # Restored by a call under inference_mode, the weights are still normal tensors.
    gpu_swap.release_gpu(handle, mem)
    with torch.inference_mode():
        assert torch.equal(model(x), want)
    assert not any(t.is_inference() for t in _held(model).values())
    tp.release(model, handle)


def test_release_and_restore_twice_are_no_ops(tmp_path: Path, sim: SimulatedDevice) -> None:
    model, _ref = _loaded(tmp_path)
    handle = _hooked(model, sim)
    mem = SimMemory(sim)
    first = gpu_swap.release_gpu(handle, mem)
    again = gpu_swap.release_gpu(handle, mem)
    assert not again.changed and again.bytes == 0 and again.host_bytes == first.host_bytes
    assert len(mem.hosts) == 1
    assert handle.restore_gpu().changed
    again = handle.restore_gpu()
    assert not again.changed and again.bytes == 0
    assert mem.allocations == first.storages
    tp.release(model, handle)


def test_on_the_cpu_both_are_no_ops(tmp_path: Path) -> None:
    ref = reference(torch.float32)
    path = save(ref, tmp_path / "m.safetensors")
    model = on_meta(Tiny)
    tp.stream_load(model, path, plan=every_tier(), device="cpu")
    handle = tp.install_offload(model)
    before = {i: t.data_ptr() for i, t in _held(model).items()}
    for call in (handle.release_gpu, handle.restore_gpu):
        out = call()
        assert not out.changed and out.bytes == 0 and not handle.gpu_released
    assert {i: t.data_ptr() for i, t in _held(model).items()} == before
    with torch.no_grad():
        assert torch.equal(model(ids()), ref(ids()))
    tp.release(model, handle)


def test_a_restore_that_does_not_fit_leaves_the_model_released(tmp_path: Path, sim: SimulatedDevice) -> None:
    model, ref = _loaded(tmp_path)
    handle = _hooked(model, sim)
    x = ids()
    with torch.no_grad():
        want = ref(x)
    snap = _snapshot(model)
    full = SimMemory(sim, fail_after=3)
    gpu_swap.release_gpu(handle, full)
    with pytest.raises(StreamError, match=r"Tiny cannot go back to the GPU.*restore_gpu\(\) again"):
        handle.restore_gpu()
    with torch.no_grad(), pytest.raises(StreamError, match="Tiny cannot go back"):
        model(x)  # the call's own restore raises the same
    assert handle.gpu_released and not any(full.holds(t) for t in _held(model).values())
    assert _same(model, snap)
    full.fail_after = None  # memory was freed elsewhere
    assert handle.restore_gpu().changed
    with torch.no_grad():
        assert torch.equal(model(x), want)
    tp.release(model, handle)


def test_a_swap_that_does_not_wait_for_its_copies_is_caught(
    tmp_path: Path, sim: SimulatedDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The simulated device's copies land late and poison their destination when queued: a
    swap that did not wait for them would leave poison where the weights should be."""
    model, _ref = _loaded(tmp_path)
    handle = _hooked(model, sim)
    snap = _snapshot(model)
    sim.max_delay = 0.02
    monkeypatch.setattr(SimulatedDevice, "synchronize", lambda self: None)
    gpu_swap.release_gpu(handle, SimMemory(sim))
    assert not _same(model, snap)
    monkeypatch.undo()
    sim.synchronize()
    tp.release(model, handle)


def test_release_waits_for_an_overlap_load(
    loader_reads: ReadsWith, tmp_path: Path, sim: SimulatedDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks an ``overlap=True`` loader had not read yet would land on the device after the
    move: release_gpu() waits for them, then moves them too."""
    ref = reference(torch.float32)
    path = save(ref, tmp_path / "m.safetensors")
    real = overlap.load_block
    first_read, go_on = threading.Event(), threading.Event()

    def held(block, *args):  # type: ignore[no-untyped-def]
        real(block, *args)
        first_read.set()
        go_on.wait(10)

    loader_reads(block=held)
    with tp.stage(lambda: on_meta(Tiny), path, device="cpu", resident_blocks=4, overlap=True) as (model, _p, handle):
        assert first_read.wait(10)
        assert any(model.blocks[i].up.weight.is_meta for i in range(4))
        threading.Timer(0.2, go_on.set).start()
        mem = SimMemory(sim)
        out = gpu_swap.release_gpu(handle, mem)
        assert not any(model.blocks[i].up.weight.is_meta for i in range(4))
        assert out.bytes == _resident_and_outside_bytes(model) and weights_on_device(model, mem) == 0
        with torch.no_grad():
            assert torch.equal(model(ids()), ref(ids()))
        assert not handle.gpu_released


def test_remove_restores_first_and_release_drops_the_host_copy(tmp_path: Path, sim: SimulatedDevice) -> None:
    model, ref = _loaded(tmp_path)
    handle = _hooked(model, sim)
    mem = SimMemory(sim)
    gpu_swap.release_gpu(handle, mem)
    handle.remove()
    assert not handle.gpu_released and all(mem.holds(t) for t in _held(model).values())
    with torch.no_grad():
        assert torch.equal(model(ids()), ref(ids()))
    with pytest.raises(ArgumentError, match="hooks were removed"):
        handle.release_gpu()
    with pytest.raises(ArgumentError, match="hooks were removed"):
        handle.restore_gpu()
    tp.release(model)

    model, _ref = _loaded(tmp_path)
    handle = _hooked(model, sim)
    gpu_swap.release_gpu(handle, SimMemory(sim))
    hook: Any = handle.hooks.get(GPU_RELEASED)
    tp.release(model, handle)
    assert hook.host is None and hook.storages == []
    assert all(p.is_meta for p in model.parameters())
    assert GPU_RELEASED not in handle.hooks


@pytest.mark.cuda
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_release_and_restore_on_gpu(tmp_path: Path, fp8: bool) -> None:
    """The real path: pinned host memory, copies on the copy stream, torch's cache emptied."""
    ref = reference(torch.float32)
    if fp8:
        want_model = fp8_checkpoint(ref, tmp_path / "m.safetensors")
        path = tmp_path / "m.safetensors"
    else:
        want_model = ref.to(torch.bfloat16)
        path = save(want_model, tmp_path / "m.safetensors", torch.bfloat16)
    model = on_meta(Tiny)
    tp.stream_load(model, path, plan=every_tier(), device="cuda")
    handle = tp.install_offload(model)
    x = ids().cuda()
    with torch.no_grad():
        want = want_model.cuda()(x)
        assert torch.equal(model(x), want)
    held = weights_on_device(model)
    snap = _snapshot(model)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()

    out = handle.release_gpu()
    assert out.changed and out.bytes == held > 0 and out.pinned and weights_on_device(model) == 0
    assert all(t.device.type == "cpu" for t in _held(model).values())
    freed = before - torch.cuda.memory_allocated()
    assert held <= freed <= held + 512 * out.storages  # the allocator rounds to 512 bytes
    assert _same(model, snap)

    back = handle.restore_gpu()
    assert back.changed and back.bytes == held and weights_on_device(model) == held
    assert torch.cuda.memory_allocated() == before
    assert all(t.is_cuda for t in _held(model).values()) and _same(model, snap)
    with torch.no_grad():
        assert torch.equal(model(x), want)
        handle.release_gpu()
        assert torch.equal(model(x), want)  # restored by the call
    tp.release(model, handle)
