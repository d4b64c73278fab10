"""The pages tensors are read into: a pipeline tells the core's pool what its reads will still
take, and up to that the pages of freed tensors go to those reads instead of back to the system
(no fault and no zeroing at the read); the bytes read are the file's all the same, and the pool
keeps no more than the reads want."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest
import torch

from trash_panda import _core
from trash_panda.offload.materialize import DIRECT_ALIGN, FRESH_BYTES, _fresh, read_many

pytestmark = pytest.mark.skipif(not hasattr(mmap, "MAP_PRIVATE"), reason="the pool maps pages (Unix)")

N = 4 * FRESH_BYTES


@pytest.fixture(autouse=True)
def _nothing_wanted_after() -> object:
    yield
    _core.pool_pages_for(0)


def _block() -> torch.Tensor:
    t = _fresh((N // 4,), torch.float32, N)
    t.fill_(1.5)  # touched: its pages are there
    return t


def test_pages_are_pooled_only_for_reads_to_come() -> None:
    before = _core.page_pool_stats()
    t = _block()
    del t
    assert _core.page_pool_stats().pooled == before.pooled, "no reads to come: the pages go to the system"
    t = _block()
    at = t.data_ptr()
    _core.pool_pages_for(N)  # a read of N bytes to come
    del t
    assert _core.page_pool_stats().pooled == N
    again = _fresh((N // 2,), torch.bfloat16, N)
    assert again.data_ptr() == at, "the freed pages serve the next tensor"
    assert _core.page_pool_stats().reused >= before.reused + N
    # Uninitialised, as torch.empty: what the last tensor left is still there.
    assert again.view(torch.float32)[0].item() == 1.5
    del again
    assert _core.page_pool_stats().pooled == 0, "that read took what was wanted: the next free goes"


def test_the_pool_gives_back_what_no_read_wants() -> None:
    """Pages the reads do not want stay no longer than that: the running stage's activations
    get their memory from the system, so pages kept beyond the reads would be over its budget."""
    blocks = [_block() for _ in range(4)]
    _core.pool_pages_for(3 * N)
    grown = _core.private_memory()
    blocks.clear()
    kept = _core.private_memory()
    assert _core.page_pool_stats().pooled == 3 * N, "one block more than the reads want went back"
    assert grown - 2 * N < kept < grown - N // 2, (grown, kept)
    assert _core.pool_pages_for(N) == 2 * N
    assert _core.pool_pages_for(0) == N
    assert _core.private_memory() < kept - 2 * N


def test_a_smaller_tensor_takes_the_front_of_a_run_and_leaves_the_rest() -> None:
    big = _block()
    at = big.data_ptr()
    _core.pool_pages_for(N)
    del big
    a = _fresh((N // 8,), torch.float32, N // 2)
    b = _fresh((N // 8,), torch.float32, N // 2)
    assert {a.data_ptr(), b.data_ptr()} == {at, at + N // 2}
    a.fill_(1.0)
    b.fill_(2.0)
    assert a.sum().item() == N // 8 and b.sum().item() == N // 4, "the two halves do not overlap"


@pytest.mark.skipif(not hasattr(__import__("os"), "O_DIRECT"), reason="direct reads (Linux)")
def test_a_read_into_reused_pages_gives_the_file_s_bytes(tmp_path: Path) -> None:
    """Pages freed by one read serve the next, placed as in the file again, and the tensors
    equal the file's (the pages' old bytes are all overwritten, the partial ones too)."""
    from safetensors.torch import save_file

    from trash_panda.checkpoint import Checkpoint

    g = torch.Generator().manual_seed(8)
    tensors = {
        "odd": torch.randn(5, generator=g),
        "w1": torch.randn(FRESH_BYTES // 2 + 3, generator=g),
        "w2": torch.randn(FRESH_BYTES // 2 + 11, generator=g).to(torch.bfloat16),
    }
    path = tmp_path / "w.safetensors"
    save_file(tensors, str(path))
    ckpt = Checkpoint(path)
    infos = [ckpt.info(n) for n in ("w1", "w2")]
    lane = _core.ReadLane([path], 1, direct=True)
    first = read_many(infos, threads=2, lane=lane)
    for old in first:
        old.view(torch.uint8).fill_(0xAB)  # what a stage's block leaves behind
    _core.pool_pages_for(2 * N)
    del first, old
    before = _core.page_pool_stats()
    assert before.pooled >= sum(i.nbytes for i in infos)
    second = read_many(infos, threads=2, lane=lane)
    assert _core.page_pool_stats().reused >= before.reused + sum(i.nbytes for i in infos)
    for info, t in zip(infos, second, strict=True):
        assert torch.equal(t, tensors[info.name])
        assert t.data_ptr() % DIRECT_ALIGN == info.start % DIRECT_ALIGN
