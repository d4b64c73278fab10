"""Embedding tables left in the checkpoint's map on the CPU (Linux): a pass pays for the rows it
looks up, not for the table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import trash_panda as tp
from support.models import Tiny, save
from trash_panda import Plan, _core

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="tables are mapped on Linux only")

PLAN = Plan.manual(resident=["blocks.0."], streamed=["blocks.1.", "blocks.2."], streamed_tier="disk")


def _in_file(t: torch.Tensor, path: Path) -> bool:
    """Whether ``t``'s memory lies in a map of ``path`` (from /proc/self/maps)."""
    at = t.data_ptr()
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[5] == str(path):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= at < hi:
                return True
    return False


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_an_embedding_is_the_files_pages_and_the_model_equals_the_plain_one(tmp_path: Path, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    ref = Tiny(dim=64, layers=3, vocab=300).to(dtype).eval()
    path = save(ref, tmp_path / "m.safetensors", dtype)
    with torch.device("meta"):
        model = Tiny(dim=64, layers=3, vocab=300).to(dtype).eval()
    report = tp.stream_load(model, path, plan=PLAN, device="cpu")
    table = model.embed.weight
    assert report.mapped_bytes == table.numel() * table.element_size()
    assert "embedding tables" in str(report)
    assert _in_file(table, path.resolve())
    assert not _in_file(model.head.weight, path.resolve()), "only tables read by rows are left mapped"
    handle = tp.install_offload(model)
    x = torch.randint(0, 300, (2, 7))
    with torch.no_grad():
        want = ref(x)
        for _ in range(2):
            assert torch.equal(model(x), want)
    tp.release(model, handle)
    assert model.embed.weight.is_meta


def test_a_table_tied_to_a_linear_is_read(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = Tiny(dim=64, layers=3, vocab=300).to(torch.bfloat16).eval()
    ref.head.weight = ref.embed.weight
    path = tmp_path / "m.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items() if k != "head.weight"}, str(path))
    with torch.device("meta"):
        model = Tiny(dim=64, layers=3, vocab=300).to(torch.bfloat16).eval()
    model.head.weight = model.embed.weight
    report = tp.stream_load(model, path, plan=PLAN, device="cpu")
    assert report.mapped_bytes == 0
    assert not _in_file(model.embed.weight, path.resolve())
    assert model.head.weight is model.embed.weight
    x = torch.randint(0, 300, (1, 5))
    handle = tp.install_offload(model)
    with torch.no_grad():
        assert torch.equal(model(x), ref(x))
    tp.release(model, handle)


def test_a_converted_table_is_read(tmp_path: Path) -> None:
    """A table whose computed dtype differs from its stored one is converted, so it is read."""
    torch.manual_seed(0)
    ref = Tiny(dim=64, layers=3, vocab=300).eval()
    path = save(ref, tmp_path / "m.safetensors", torch.bfloat16)
    with torch.device("meta"):
        model = Tiny(dim=64, layers=3, vocab=300).eval()
    report = tp.stream_load(model, path, plan=PLAN, device="cpu", compute_dtype="fp32")
    assert report.mapped_bytes == 0
    assert model.embed.weight.dtype == torch.float32
    tp.release(model)


class Lookup(nn.Module):
    """A large table and one small block: a pass reads a few rows of the table."""

    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList([nn.Linear(dim, dim, bias=False)])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.blocks[0](self.embed(ids))


def test_a_pass_holds_the_rows_it_looks_up_not_the_table(tmp_path: Path) -> None:
    vocab, dim = 65536, 2048  # 256 MiB of bf16, rows of 4 KiB
    torch.manual_seed(0)
    ref = Lookup(vocab, dim).to(torch.bfloat16).eval()
    path = save(ref, tmp_path / "m.safetensors", torch.bfloat16)
    table_bytes = vocab * dim * 2
    _core.drop_cache(path)
    with torch.device("meta"):
        model = Lookup(vocab, dim).to(torch.bfloat16).eval()
    report = tp.stream_load(model, path, plan=Plan.manual(resident=["blocks.0."], streamed=[]), device="cpu")
    assert report.mapped_bytes == table_bytes
    ids = torch.tensor([[3, 5000, 64000, 9]])
    before = _core.current_rss()
    with torch.no_grad():
        assert torch.equal(model(ids), ref(ids))
    grown = _core.current_rss() - before
    # The rows looked up and what the system maps with each (its read-ahead, or the page
    # cache's large folios: a few MiB a row), and the activations. The table is 256 MiB.
    assert grown < table_bytes / 4, f"RSS grew {grown / 2**20:.1f} MiB for a 256 MiB table"
    tp.release(model)


def test_a_table_whose_file_was_cut_short_is_an_error_not_a_crash(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = Tiny(dim=64, layers=3, vocab=300).to(torch.bfloat16).eval()
    path = save(ref, tmp_path / "m.safetensors", torch.bfloat16)
    with torch.device("meta"):
        model = Tiny(dim=64, layers=3, vocab=300).to(torch.bfloat16).eval()
    tp.stream_load(model, path, plan=PLAN, device="cpu")
    handle = tp.install_offload(model)
    x = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.equal(model(x), ref(x))
        # Saved again over the same path: the file is cut to nothing first.
        with open(path, "r+b") as f:
            f.truncate(100)
        with pytest.raises(tp.CheckpointError, match=r"m\.safetensors: tensor \"embed\.weight\" ends at byte"):
            model(torch.tensor([[299]]))
    tp.release(model, handle)
    assert not model.embed._forward_pre_hooks, "release removes the check"
