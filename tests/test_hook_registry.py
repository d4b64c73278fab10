"""The hook layer: one registry per model calls the named block hooks in a defined order."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import trash_panda as tp
from models import Tiny, on_meta, save
from trash_panda.offload.registry import BlockHook, HookRegistry
from trash_panda.offload.state import BlockState
from trash_panda.plan import Tier


class Recorder(BlockHook):
    def __init__(self, name: str, log: list[str], gate: bool = False, fail: bool = False) -> None:
        self.name, self.log, self.gate, self.fail = name, log, gate, fail
        self.closed = False

    def pre_forward(self, block: BlockState) -> None:
        self.log.append(f"pre {self.name}")
        if self.fail:
            raise RuntimeError(self.name)

    def post_forward(self, block: BlockState) -> None:
        self.log.append(f"post {self.name}")

    def close(self) -> None:
        self.closed = True


def _block() -> BlockState:
    return BlockState(index=0, prefix="blocks.0.", module=nn.Sequential(nn.Linear(2, 2), nn.ReLU()), tier=Tier.DEVICE)


def test_pre_hooks_run_in_order_and_post_hooks_in_reverse() -> None:
    log: list[str] = []
    block = _block()
    hooks = HookRegistry([block])
    hooks.add(Recorder("a", log, gate=True))
    hooks.add(Recorder("c", log))
    hooks.add(Recorder("b", log, gate=True), before="c")
    assert hooks.names == ["a", "b", "c"]
    block.module(torch.ones(1, 2))
    assert log == ["pre a", "pre b", "pre c", "post c", "post b", "post a"]
    with pytest.raises(ValueError, match="already registered"):
        hooks.add(Recorder("a", log))
    removed = hooks.remove("b")
    assert isinstance(removed, Recorder) and removed.closed and hooks.get("b") is None
    log.clear()
    block.module(torch.ones(1, 2))
    assert log == ["pre a", "pre c", "post c", "post a"]
    hooks.remove_all()
    log.clear()
    block.module(torch.ones(1, 2))
    assert log == [] and hooks.names == []


def test_a_gate_that_raises_leaves_the_block_unstarted_and_a_later_hook_does_not() -> None:
    log: list[str] = []
    block = _block()
    hooks = HookRegistry([block])
    gate = Recorder("gate", log, gate=True, fail=True)
    hooks.add(gate)
    hooks.add(Recorder("after", log, fail=False))
    with pytest.raises(RuntimeError, match="gate"):
        block.module(torch.ones(1, 2))
    assert log == ["pre gate"]  # no post hook: the block did not start
    gate.fail = False
    hooks.remove("after")
    hooks.add(Recorder("after", log, fail=True))
    log.clear()
    with pytest.raises(RuntimeError, match="after"):
        block.module(torch.ones(1, 2))
    assert log == ["pre gate", "pre after", "post after", "post gate"]  # started: all undo
    hooks.remove_all()


def test_module_hooks_go_with_the_hook_that_added_them() -> None:
    log: list[str] = []
    block = _block()
    inner = block.module[0]
    hooks = HookRegistry([block])

    class Forgets(BlockHook):
        name = "forgets"

        def attach(self, registry: HookRegistry) -> None:
            registry.on_module_end(self, inner, lambda: log.append("inner ran"))

    hooks.add(Forgets())
    block.module(torch.ones(1, 2))
    assert log == ["inner ran"]
    hooks.remove("forgets")
    block.module(torch.ones(1, 2))
    assert log == ["inner ran"]
    hooks.remove_all()


def test_the_handle_s_hooks_and_where_a_final_pass_goes(tmp_path: Path) -> None:
    torch.manual_seed(0)
    path = save(Tiny().eval(), tmp_path / "m.safetensors")
    model = on_meta(Tiny)
    tp.stream_load(model, path, device="cpu")
    handle = tp.install_offload(model)
    assert handle.hooks.names == ["release_guard", "timing", "staging", "order"]
    with handle.final_pass(keep_prefixes=["blocks."]):
        assert handle.hooks.names == ["release_guard", "final_pass", "timing", "staging", "order"]
    with handle.final_pass(keep_prefixes=["blocks."]) as fp:  # a closed pass's hook is replaced
        assert handle.hooks.get("final_pass") is fp
    tp.release(model, handle)
    assert handle.hooks.names == []
