"""The hook layer: one registry per model calls the named block hooks in a defined order."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

import trash_panda as tp
from support.models import Tiny, on_meta, save
from trash_panda.offload.materialize import LOOKUP_GUARDS
from trash_panda.offload.registry import RANKS, BlockHook, HookRegistry, model_hooks
from trash_panda.offload.state import RELEASED, BlockState
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
    hooks.add(Recorder("a", log, gate=True), rank=1)
    hooks.add(Recorder("c", log), rank=3)
    hooks.add(Recorder("b", log, gate=True), rank=2)
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


class Probe(BlockHook):
    """Records, around each block, whether its first weight is the meta placeholder."""

    def __init__(self, name: str, log: list[tuple[str, str, bool]]) -> None:
        self.name, self.log = name, log
        self.closed = False

    def pre_forward(self, block: BlockState) -> None:
        self.log.append((f"pre {self.name}", block.prefix, block.module.up.weight.is_meta))

    def post_forward(self, block: BlockState) -> None:
        self.log.append((f"post {self.name}", block.prefix, block.module.up.weight.is_meta))

    def close(self) -> None:
        self.closed = True


def test_a_new_block_hook_runs_around_each_block_with_the_others(tmp_path: Path) -> None:
    """A feature is a hook added to a live handle's registry: one placed before ``staging`` sees
    a streamed block on its placeholder, before the bring and after the give-back; one added last
    sees its weights; both run around every block, in the order forward() runs them. Staging is
    not edited for it."""
    torch.manual_seed(0)
    ref = Tiny().eval()
    path = save(ref, tmp_path / "m.safetensors")
    model = on_meta(Tiny)
    streamed = [f"blocks.{i}." for i in range(2, 6)]
    tp.stream_load(model, path, tp.Plan.manual(resident=["blocks.0.", "blocks.1."], streamed=streamed), device="cpu")
    handle = tp.install_offload(model)
    log: list[tuple[str, str, bool]] = []
    before, after = Probe("before", log), Probe("after", log)
    handle.hooks.add(before, rank=RANKS["staging"] - 1)
    handle.hooks.add(after)
    assert handle.hooks.names == ["release_guard", "timing", "before", "staging", "order", "after"]
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.allclose(model(ids), ref(ids), atol=1e-5)
    want = []
    for i in range(6):
        prefix, meta = f"blocks.{i}.", f"blocks.{i}." in streamed
        want += [
            ("pre before", prefix, meta),
            ("pre after", prefix, False),
            ("post after", prefix, False),
            ("post before", prefix, meta),
        ]
    assert log == want
    assert handle.ran == [f"blocks.{i}." for i in range(6)]  # the order hook still records
    assert [run[0] for run in handle.runs] == list(range(6))  # and the timing hook still times
    assert handle.hooks.remove("after") is after and after.closed
    log.clear()
    with torch.no_grad():
        model(ids)
    assert [e[0] for e in log[:2]] == ["pre before", "post before"]
    tp.release(model, handle)
    assert before.closed and handle.hooks.names == []


def test_module_hooks_named_on_their_own_outlive_the_block_hooks() -> None:
    log: list[str] = []
    block = _block()
    outer = nn.Sequential(block.module)
    hooks = model_hooks(outer)
    assert model_hooks(outer) is hooks  # one registry per model
    hooks.on_module_start("refuse", outer, lambda: log.append("refuse"), rank=50)
    hooks.on_module_start("first", outer, lambda: log.append("first"), rank=10)
    hooks.wrap([block])
    hooks.add(Recorder("rec", log))
    assert "refuse" in hooks and "rec" in hooks and "nothing" not in hooks
    with pytest.raises(ValueError, match="already registered"):
        hooks.add(Recorder("refuse", log))
    outer(torch.ones(1, 2))
    assert log == ["first", "refuse", "pre rec", "post rec"]
    hooks.unwrap()  # what an offload handle's removal does
    log.clear()
    outer(torch.ones(1, 2))
    assert log == ["first", "refuse"] and hooks.names == []
    assert hooks.remove("refuse") is None and "refuse" not in hooks
    log.clear()
    outer(torch.ones(1, 2))
    assert log == ["first"]
    hooks.remove_all()
    assert not outer._forward_pre_hooks and not block.module._forward_pre_hooks


def test_module_hooks_run_by_rank_and_one_added_mid_call_runs_in_its_place() -> None:
    """A chained pipeline's hook that starts a component's stage runs first, whenever it was
    added: the waits for weights that the stage adds (while the call begins, from that hook)
    run after it in the same call, at their rank, and a refusal it lifts does not run."""
    log: list[str] = []
    module = nn.Linear(2, 2)
    hooks = model_hooks(module)
    hooks.on_module_start("plain", module, lambda: log.append("plain"))
    hooks.on_module_start("released", module, lambda: log.append("released"))

    def start() -> None:
        log.append("chain")
        hooks.remove("released")
        if "overlap_wait" not in hooks:
            hooks.on_module_start("overlap_wait", module, lambda: log.append("wait"))

    hooks.on_module_start("pipeline_chain", module, start)
    module(torch.ones(1, 2))
    assert log == ["chain", "wait", "plain"]
    log.clear()
    module(torch.ones(1, 2))
    assert log == ["chain", "wait", "plain"]
    with pytest.raises(ValueError, match="built-in"):
        hooks.on_module_start("order", module, lambda: None, rank=1)
    hooks.remove_all()
    assert not module._forward_pre_hooks and not module._forward_hooks


def test_a_hook_added_on_another_thread_as_a_call_begins_runs_in_that_call() -> None:
    """A pipeline's runner sets the next component up on a thread of its own; the chain's hook
    that starts the component waits for that thread (through the runner). The hooks the thread
    added run in the same call, at their ranks: nothing needs to wait before the call begins."""
    log: list[str] = []
    module = nn.Linear(2, 2)
    hooks = model_hooks(module)

    def set_up() -> None:
        hooks.on_module_start("overlap_wait", module, lambda: log.append("wait"))
        hooks.on_module_end("staging", module, lambda: log.append("give back"))

    def start() -> None:
        log.append("chain")
        thread = threading.Thread(target=set_up)
        thread.start()
        thread.join()

    hooks.on_module_start("pipeline_chain", module, start)
    hooks.on_module_end("pipeline_chain", module, lambda: log.append("chain end"))
    module(torch.ones(1, 2))
    assert log == ["chain", "wait", "give back", "chain end"]
    hooks.remove_all()


def test_every_module_post_hook_runs_and_the_first_error_is_raised() -> None:
    log: list[str] = []
    module = nn.Linear(2, 2)
    hooks = model_hooks(module)

    def fails(what: str) -> None:
        log.append(what)
        raise RuntimeError(what)

    hooks.on_module_end("a", module, lambda: fails("a"), rank=1)
    hooks.on_module_end("b", module, lambda: fails("b"), rank=2)
    with pytest.raises(RuntimeError, match="b"):
        module(torch.ones(1, 2))
    assert log == ["b", "a"]  # reverse rank
    hooks.remove_all()


@pytest.mark.skipif(sys.platform != "linux", reason="tables are mapped on Linux only")
def test_a_release_leaves_its_refusal_in_the_model_s_registry(tmp_path: Path) -> None:
    """The refusal to run a released model, and the lookup tables' checks, are named hooks of
    the model's registry: a release removes the checks and leaves the refusal; a load lifts it."""
    torch.manual_seed(0)
    path = save(Tiny(vocab=300).to(torch.bfloat16).eval(), tmp_path / "m.safetensors", torch.bfloat16)
    plan = tp.Plan.manual(resident=["blocks.0."], streamed=[f"blocks.{i}." for i in range(1, 6)])

    def build() -> Tiny:
        with torch.device("meta"):
            return Tiny(vocab=300).to(torch.bfloat16).eval()

    model = build()
    tp.stream_load(model, path, plan=plan, device="cpu")
    hooks = model_hooks(model)
    assert LOOKUP_GUARDS in hooks  # the embedding is left in the checkpoint's map on the CPU
    assert model.embed._forward_pre_hooks
    handle = tp.install_offload(model)
    assert handle.hooks is hooks
    handle.remove()  # the offload hooks go; the model's own checks stay
    assert LOOKUP_GUARDS in hooks and hooks.names == []
    handle = tp.install_offload(model)
    tp.release(model, handle)
    assert RELEASED in hooks and LOOKUP_GUARDS not in hooks
    assert [n for n, m in model.named_modules() if m._forward_pre_hooks or m._forward_hooks] == [""]
    with pytest.raises(tp.TrashPandaError, match="Tiny was released"):
        model(torch.tensor([[1]]))
    tp.stream_load(model, path, plan=plan, device="cpu")
    assert RELEASED not in hooks and LOOKUP_GUARDS in hooks and model_hooks(model) is hooks
    tp.release(model)


def test_the_hook_layer_imports_no_feature() -> None:
    """Features depend on the hook layer, never the reverse: the registry imports nothing of the
    package but its cleanup helper (and, for types only, the block's state)."""
    import ast

    import trash_panda.offload.registry as registry

    tree = ast.parse(Path(registry.__file__).read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            imported.add(node.module)
    assert imported <= {"cleanup", "state"}, imported
    runtime = [n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.level > 0 and n.module != "cleanup"]
    assert runtime == [], "the block state is imported for types only"
