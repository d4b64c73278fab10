"""The hook order is one rank table (``registry.RANKS``): with every hook on one model at once
(overlap wait, final pass, GPU release, timing, staging, order, a custom hook), in whichever
order the features were installed, the registry's order is the table's and the output is the
plain model's, bit for bit; the docs state the same order."""

from __future__ import annotations

import contextlib
import itertools
import re
from pathlib import Path

import pytest
import torch

import trash_panda as tp
from support.checkpoints import ids, reference
from support.models import Tiny, on_meta, save
from support.simdevice import SimMemory, SimulatedDevice
from trash_panda.offload import gpu_swap
from trash_panda.offload.registry import CUSTOM, CUSTOM_GATE, RANKS, BlockHook, hook_rank
from trash_panda.offload.state import BlockState

ROOT = Path(__file__).resolve().parents[2]
# What each install below puts in the registry, besides the handle's own four.
FEATURES = ("overlap_wait", "final_pass", "gpu_released", "custom")
# The block hooks of the table, in its order (the others are module hooks).
TABLE_BLOCK_HOOKS = ["release_guard", "final_pass", "gpu_released", "overlap_wait", "timing", "staging", "order"]


class Sees(BlockHook):
    """A custom hook: records whether each block has its weights around its run."""

    name = "custom"

    def __init__(self) -> None:
        self.seen: list[tuple[str, bool]] = []

    def pre_forward(self, block: BlockState) -> None:
        self.seen.append(("pre", block.module.up.weight.is_meta))

    def post_forward(self, block: BlockState) -> None:
        self.seen.append(("post", block.module.up.weight.is_meta))


def _table_order(names: list[str]) -> list[str]:
    return sorted(names, key=lambda n: hook_rank(n))


@pytest.mark.parametrize("installs", list(itertools.permutations(FEATURES)), ids="-".join)
def test_every_hook_at_once_in_the_table_s_order(
    tmp_path: Path, sim: SimulatedDevice, installs: tuple[str, ...]
) -> None:
    ref = reference(torch.float32)
    path = save(ref, tmp_path / "m.safetensors")
    want = ref(ids())
    with (
        tp.stage(lambda: on_meta(Tiny), path, device="cpu", resident_blocks=3, overlap=True) as (model, _p, handle),
        contextlib.ExitStack() as stack,
    ):
        hooks = handle.hooks
        wait = hooks.get("overlap_wait")
        assert wait is not None
        wait.loader.join()  # type: ignore[attr-defined]
        hooks.remove("overlap_wait")  # put back below, in its turn (a loader done stays done)
        custom = Sees()
        for feature in installs:
            if feature == "overlap_wait":
                hooks.add(wait)
            elif feature == "final_pass":
                stack.enter_context(handle.final_pass())  # every block freed after its run
            elif feature == "gpu_released":
                assert gpu_swap.release_gpu(handle, SimMemory(sim)).changed
            else:
                hooks.add(custom)
        assert hooks.names == _table_order(hooks.names) == [*TABLE_BLOCK_HOOKS, "custom"]
        with torch.no_grad():
            out = model(ids())
        assert torch.equal(out, want)
        assert not handle.gpu_released  # restored by the call's first hook that does work
        # After staging: the custom hook saw every block with its weights, before and after.
        assert custom.seen and not any(meta for _, meta in custom.seen)
    assert hooks.names == []


def test_custom_ranks() -> None:
    assert hook_rank("mine") == CUSTOM > RANKS["order"]
    assert RANKS["overlap_wait"] < hook_rank("mine", gate=True) == CUSTOM_GATE < RANKS["timing"]
    assert hook_rank("mine", rank=5) == 5 and hook_rank("staging", rank=RANKS["staging"]) == RANKS["staging"]
    with pytest.raises(ValueError, match="built-in"):
        hook_rank("staging", rank=1)


def test_every_built_in_hook_name_is_in_the_table() -> None:
    from trash_panda.diffusers import CHAIN
    from trash_panda.offload.block_hooks import ReleaseGuard, RunOrder, RunTiming, Staging
    from trash_panda.offload.final_pass import FinalPass
    from trash_panda.offload.gpu_swap import GpuReleased
    from trash_panda.offload.materialize import LOOKUP_GUARDS
    from trash_panda.offload.overlap import OverlapWait
    from trash_panda.offload.state import RELEASED
    from trash_panda.pipeline.group import GROUP_HOOK
    from trash_panda.pipeline.pace import Pacer

    hooks = [ReleaseGuard, FinalPass, GpuReleased, OverlapWait, RunTiming, Staging, Pacer, RunOrder]
    names = {h.name for h in hooks} | {CHAIN, GROUP_HOOK, RELEASED, LOOKUP_GUARDS}
    assert names == set(RANKS)
    # Every built-in gate comes before timing but staging, the last: a gate that raised leaves
    # the block unstarted, so nothing after a bring may be one.
    gates = sorted((RANKS[h.name], h.name) for h in hooks if h.gate)
    assert gates[-1][1] == "staging" and all(r < RANKS["timing"] for r, _ in gates[:-1])


def _listed(text: str) -> list[str]:
    """The names of a numbered list: ``1. `name` ...`` (markdown) or ``1. ``name`` ...`` (rst)."""
    return re.findall(r"^\s*\d+\.\s+``?([a-z_]+)``?", text, flags=re.M)


def test_the_docs_state_the_table_s_order() -> None:
    import trash_panda.offload.registry as registry

    table = sorted(RANKS, key=RANKS.__getitem__)
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = doc.split("### The hook order", 1)[1].split("\n#", 1)[0]
    assert _listed(section) == table
    assert _listed(registry.__doc__ or "") == table
