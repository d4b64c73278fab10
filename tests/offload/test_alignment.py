"""Every fp32 tensor handed to torch on the CPU is 64-byte aligned, wherever the checkpoint puts it:
a Linear on a weight that is only 8-byte aligned can round differently from one on an aligned
weight. The checkpoint here places every tensor at a file offset of 40 modulo 64, and the model
runs with blocks resident (read at load, or by the overlap loader, through the page cache or
past it), in RAM and on disk; a hook that sees each block with its weights checks every one."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import trash_panda as tp
from support.models import Tiny, on_meta
from trash_panda.offload.registry import BlockHook, model_hooks
from trash_panda.offload.state import BlockState

ALIGN = 64
IDS = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(3))


def _save_at(ref: Tiny, path: Path, residue: int) -> Path:
    """``ref``'s weights, fp32, with the data starting at ``residue`` modulo 64 in the file (every
    tensor's size is a multiple of 64 bytes, so every tensor starts there too)."""
    tensors = {k: v.contiguous() for k, v in ref.state_dict().items()}
    assert all(t.nbytes % ALIGN == 0 for t in tensors.values())
    for pad in range(ALIGN):
        save_file(tensors, str(path), metadata={"pad": "x" * pad})
        header = struct.unpack("<Q", path.read_bytes()[:8])[0]
        if (8 + header) % ALIGN == residue:
            return path
    raise AssertionError("no padding gives that residue")


class AlignmentCheck(BlockHook):
    """Records every parameter of a block, as it runs, that is not 64-byte aligned."""

    name = "alignment_check"

    def __init__(self) -> None:
        self.seen = 0
        self.unaligned: list[str] = []

    def pre_forward(self, block: BlockState) -> None:
        for name, p in block.module.named_parameters():
            self.seen += 1
            if p.data_ptr() % ALIGN:
                self.unaligned.append(f"{block.prefix}{name} at {p.data_ptr() % ALIGN} mod {ALIGN}")


def _checked_run(model: torch.nn.Module) -> torch.Tensor:
    """The model's output, checking as it runs that every weight of every block and every weight
    outside them is 64-byte aligned."""
    check = AlignmentCheck()
    model_hooks(model).add(check)
    try:
        with torch.no_grad():
            got: torch.Tensor = model(IDS)
    finally:
        model_hooks(model).remove(check.name)
    outside = [n for n, t in model.named_parameters() if not n.startswith("blocks.") and t.data_ptr() % ALIGN]
    assert check.seen > 0
    assert check.unaligned == [] and outside == []
    return got


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor]:
    torch.manual_seed(0)
    ref = Tiny(dim=512, layers=6).eval()
    path = _save_at(ref, tmp_path_factory.mktemp("aligned") / "m.safetensors", 40)
    offsets = [v["data_offsets"][0] for k, v in json.loads(_header(path)).items() if k != "__metadata__"]
    start = 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]
    assert {(start + o) % ALIGN for o in offsets} == {40}
    with torch.no_grad():
        return path, ref(IDS)


def _header(path: Path) -> str:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return data[8 : 8 + n].decode()


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("disk_mode", ["buffered", "direct"])
def test_every_tensor_a_block_runs_with_is_64_byte_aligned(
    checkpoint: tuple[Path, torch.Tensor], overlap: bool, disk_mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, want = checkpoint
    monkeypatch.setenv("TRASH_PANDA_DISK_MODE", disk_mode)
    with tp.stage(lambda: on_meta(Tiny, dim=512, layers=6), path, device="cpu", resident_blocks=2, overlap=overlap) as (
        model,
        p,
        _h,
    ):
        tiers = {b.tier for b in p.blocks}
        assert tiers == {tp.Tier.DEVICE, tp.Tier.RAM} or tiers == {tp.Tier.DEVICE, tp.Tier.RAM, tp.Tier.DISK}
        got = _checked_run(model)
    assert torch.equal(got, want)


def _gguf_at(ref: Tiny, path: Path) -> Path:
    """``ref``'s weights, F32, in a GGUF file (its tensors 32-byte aligned, GGUF's default) whose
    data starts at 32 modulo 64, so every tensor does."""
    gguf = pytest.importorskip("gguf")
    from trash_panda import Checkpoint

    tensors = {k: v.contiguous().numpy() for k, v in ref.state_dict().items()}
    for pad in range(ALIGN):
        w = gguf.GGUFWriter(str(path), "tiny")
        w.add_string("pad", "x" * pad)
        for k, v in tensors.items():
            w.add_tensor(k, v)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        if {t.start % ALIGN for t in Checkpoint(path).tensors()} == {32}:
            return path
    raise AssertionError("no padding gives that residue")


def test_a_gguf_files_32_byte_aligned_tensors_run_64_byte_aligned(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = Tiny(dim=512, layers=6).eval()
    path = _gguf_at(ref, tmp_path / "m.gguf")
    with torch.no_grad():
        want = ref(IDS)
    with tp.stage(lambda: on_meta(Tiny, dim=512, layers=6), path, device="cpu", resident_blocks=2) as (model, p, _h):
        assert {b.tier for b in p.blocks} >= {tp.Tier.DEVICE, tp.Tier.RAM}
        got = _checked_run(model)
    assert torch.equal(got, want)
