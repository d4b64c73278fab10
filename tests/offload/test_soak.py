"""Twenty stages in a row, each with every tier and a final pass: what the process holds
(private memory, open files, threads, mappings) is flat from the third on."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
import torch

import trash_panda as tp
from support.models import Tiny, on_meta, save
from trash_panda import _core

IDS = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(8))
RUNS = 20


def holdings(checkpoint: Path) -> tuple[int, int, int, int, int, int]:
    """(private bytes, open files, threads, file mappings, anonymous mappings, mappings of
    ``checkpoint``) of this process."""
    gc.collect()
    _core.trim_heap()
    with open("/proc/self/maps", encoding="utf-8") as f:
        rows = [line.split(maxsplit=5) for line in f]
    files = [r[5].strip() for r in rows if len(r) == 6 and r[4] != "0"]
    anonymous = len(rows) - len(files)
    ours = sum(1 for f in files if f == str(checkpoint))
    return (
        _core.private_memory(),
        len(os.listdir("/proc/self/fd")),
        len(os.listdir("/proc/self/task")),
        len(files),
        anonymous,
        ours,
    )


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads /proc (Linux)")
def test_twenty_stages_hold_nothing_more(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = Tiny(dim=512, layers=8).to(torch.bfloat16).eval()
    path = save(ref, tmp_path / "soak.safetensors", torch.bfloat16)
    with torch.no_grad():
        want = ref(IDS)
    seen: list[tuple[int, int, int, int]] = []
    for _ in range(RUNS):
        with tp.stage(
            # A budget whose best plan uses all three tiers: 2 blocks resident, 2 in RAM, 4 on disk.
            lambda: on_meta(Tiny, dim=512, layers=8),
            path,
            device="cpu",
            resident_blocks=2,
            ram="29MB",
            min_free_ram=0,
        ) as (model, plan, handle):
            assert plan.blocks_in("device") and plan.blocks_in("ram") and plan.blocks_in("disk")
            with torch.no_grad():
                assert torch.equal(model(IDS), want)
                with handle.final_pass() as fp:
                    assert torch.equal(model(IDS), want)
            assert len(fp.freed) == 8
        seen.append(holdings(path))
    steady = seen[2:]
    private = [s[0] for s in steady]
    assert max(private) - private[0] < 4 << 20, [p >> 20 for p in private]
    for what, i in (("open files", 1), ("threads", 2), ("file mappings", 3)):
        assert {s[i] for s in steady} == {steady[0][i]}, (what, [s[i] for s in seen])
    assert all(s[5] == 0 for s in seen), "a released stage left the checkpoint mapped"
    # Anonymous mappings: glibc gives a thread that starts while others run an arena (two
    # mappings) and keeps the stacks of ended threads for reuse, up to its own limits, so
    # their count can step up a little when worker threads happen to overlap differently. A
    # leak would grow with every stage; that is what this bounds.
    anonymous = [s[4] for s in steady]
    assert max(anonymous) - anonymous[0] <= 6, anonymous
