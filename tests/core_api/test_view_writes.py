"""Every view of the core's memory the binding gives torch is either memory torch may write
(a staging buffer a lease owns alone, or this process's copy-on-write pages of a privately mapped
file) or marked read-only (the in-memory RAM tier, which the engine keeps copying from): a write
through a view reaches neither the checkpoint file nor any other view."""

from __future__ import annotations

import ctypes
import hashlib
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.dlpack import from_dlpack

import trash_panda as tp
from support.models import Tiny, on_meta, save
from trash_panda import Plan, Tier, _core
from trash_panda.offload.state import get_state


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _loaded(
    tmp_path: Path, dtype: torch.dtype = torch.float32, all_on_disk: bool = False
) -> tuple[Any, Any, Path, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    ref = Tiny(dim=64, layers=4, vocab=50).to(dtype).eval()
    path = save(ref, tmp_path / "m.safetensors", dtype)
    model = on_meta(Tiny, dim=64, layers=4, vocab=50).to(dtype)
    plan = Plan.manual(resident=["blocks.0."], streamed=["blocks.1.", "blocks.2.", "blocks.3."])
    plan = plan.assign(Tier.DISK, prefixes=["blocks.1.", "blocks.2.", "blocks.3."] if all_on_disk else ["blocks.3."])
    tp.stream_load(model, path, plan=plan, device="cpu")
    handle = tp.install_offload(model)
    x = torch.randint(0, 50, (2, 5))
    with torch.no_grad():
        want = ref(x)
        assert torch.equal(model(x), want)
    return model, handle, path, x, want


def _file_view(path: Path, name: str) -> torch.Tensor:
    """The tensor's bytes through a Checkpoint of its own (its own private map)."""
    return from_dlpack(_core.Checkpoint(path).view(name)).clone()


def _writable_views_stay_their_own(engine: Any, block: int, path: Path) -> None:
    layout = engine.layout(block)
    lease = engine.acquire(block)
    name = layout[0].name
    before = _digest(path)
    others = [from_dlpack(lease.view(i)).clone() for i in range(1, len(layout))]
    view = from_dlpack(lease.view(0))
    original = view.clone()
    view.fill_(0xA5)  # the write, through torch
    assert torch.all(from_dlpack(lease.view(0)) == 0xA5)  # it landed in the lease's memory
    assert _digest(path) == before, "a write through a lease's view reached the checkpoint file"
    assert torch.equal(_file_view(path, name), original), "a write reached another map's view"
    for i, other in enumerate(others, start=1):
        assert torch.equal(from_dlpack(lease.view(i)), other), f"the write reached tensor #{i}"
    del view
    lease.discard()
    lease.release()
    again = engine.acquire(block)
    assert torch.equal(from_dlpack(again.view(0)), original), "a later lease saw the write"
    again.release()


def test_a_staged_leases_view_write_stays_in_its_buffer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRASH_PANDA_RAM_IN_MEMORY", "0")
    model, handle, path, x, want = _loaded(tmp_path)
    engine = get_state(model).engine
    staged = [b for b in range(len(engine.order())) if not engine.in_place(b)]
    assert staged
    _writable_views_stay_their_own(engine, staged[0], path)
    block_bytes = engine.acquire(staged[0])
    whole = from_dlpack(block_bytes.block_bytes())
    assert not block_bytes.block_bytes().read_only and len(whole) > 0
    del whole
    block_bytes.release()
    with torch.no_grad():
        assert torch.equal(model(x), want)
    tp.release(model, handle)


@pytest.mark.skipif(sys.platform != "linux", reason="blocks are used in place on Linux only")
def test_an_in_place_view_write_stays_in_private_pages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRASH_PANDA_RAM_IN_MEMORY", "0")
    model, handle, path, x, want = _loaded(tmp_path, torch.bfloat16, all_on_disk=True)
    engine = get_state(model).engine
    in_place = [b for b in range(len(engine.order())) if engine.in_place(b)]
    assert in_place, "no block is used in place"
    _writable_views_stay_their_own(engine, in_place[0], path)
    with torch.no_grad():
        assert torch.equal(model(x), want)
    tp.release(model, handle)


def test_a_write_through_a_checkpoint_view_never_reaches_the_file(tmp_path: Path) -> None:
    torch.manual_seed(0)
    path = save(Tiny(dim=64, layers=2, vocab=50), tmp_path / "m.safetensors")
    before = _digest(path)
    ckpt = _core.Checkpoint(path)
    names = [t.name for t in ckpt.tensors()]
    other = from_dlpack(ckpt.view(names[1])).clone()
    bytes_ = ckpt.view(names[0])
    assert not bytes_.read_only
    view = from_dlpack(bytes_)
    original = view.clone()
    view.fill_(0x5A)
    assert _digest(path) == before
    assert torch.equal(_file_view(path, names[0]), original)
    assert torch.equal(from_dlpack(ckpt.view(names[1])), other)


def _capsule_flags(capsule: object) -> tuple[bytes, int]:
    """The capsule's name and, for a DLPack 1.0 capsule, its flags."""
    api = ctypes.pythonapi
    api.PyCapsule_GetName.restype = ctypes.c_char_p
    api.PyCapsule_GetName.argtypes = [ctypes.py_object]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    name = api.PyCapsule_GetName(capsule)
    if name != b"dltensor_versioned":
        return name, 0
    ptr = api.PyCapsule_GetPointer(capsule, name)
    # DLManagedTensorVersioned: version (2 x u32), manager_ctx, deleter, then the flags (u64).
    flags = ctypes.c_uint64.from_address(ptr + 8 + 2 * ctypes.sizeof(ctypes.c_void_p)).value
    return name, flags


def test_the_ram_tiers_image_goes_to_torch_read_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRASH_PANDA_RAM_IN_MEMORY", "1")
    model, handle, _, x, want = _loaded(tmp_path)
    engine = get_state(model).engine
    images = [(b, engine.ram_image(b)) for b in range(len(engine.order()))]
    images = [(b, i) for b, i in images if i is not None]
    assert images, "the RAM tier was not held in memory"
    block, image = images[0]
    assert image.read_only
    # Only a DLPack 1.0 capsule can say "read-only": that is the only one it makes ...
    name, flags = _capsule_flags(image.__dlpack__(max_version=(1, 0)))
    assert name == b"dltensor_versioned" and flags & 1
    with pytest.raises(ValueError, match="read-only"):
        image.__dlpack__()
    # ... and torch takes it (as a copy source) with the image's bytes.
    copied = from_dlpack(image).clone()
    lease = engine.acquire(block)
    staged = from_dlpack(lease.block_bytes())
    assert torch.equal(staged[: len(copied)], copied[: len(staged)])
    del staged
    # A staged lease's views are writable memory of its own (DLPack flags clear).
    name, flags = _capsule_flags(lease.view(0).__dlpack__(max_version=(1, 0)))
    assert name == b"dltensor_versioned" and flags == 0
    lease.release()
    with torch.no_grad():
        assert torch.equal(model(x), want)
    tp.release(model, handle)
