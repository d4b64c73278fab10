"""The plan is the truth about memory: what the runtime holds is what the plan counts."""

from __future__ import annotations

import gc
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import trash_panda as tp
from support.models import Tiny, assert_writes_are_caught, save
from trash_panda import Plan, Tier, _core
from trash_panda.errors import ArgumentError, DtypeError, PlanError
from trash_panda.offload.backends import cuda as cuda_backend

MiB = 1 << 20


def on_meta(**kw: Any) -> Tiny:
    with torch.device("meta"):
        return Tiny(**kw).eval()


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eight blocks of 64 MiB each in bf16 (dim 2048: 8 x 2048^2 weights a block)."""
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = Tiny(dim=2048, layers=8, vocab=64).to(torch.bfloat16)
    path = save(model, tmp_path_factory.mktemp("big") / "big.safetensors", torch.bfloat16)
    del model
    gc.collect()
    return path


def _two_passes(model: Tiny, big: Path, plan: Plan, before_runs: Any = None) -> Any:
    """Blocks 2-4 in RAM, 5-7 on disk; loaded, hooked, ``before_runs()``, then two passes."""
    plan.assign(Tier.RAM, indices=[2, 3, 4]).assign(Tier.DISK, indices=[5, 6, 7])
    tp.stream_load(model, big, plan=plan, device="cpu")
    handle = tp.install_offload(model)
    if before_runs is not None:
        before_runs()
    x = torch.randint(0, 64, (1, 4))
    with torch.no_grad():
        for _ in range(2):
            model(x)
    return handle


def _within_plan(rise: int, b: Any) -> None:
    """``rise`` of private memory is within what the plan's budgets ``b`` count (resident,
    outside and held figures), plus 48 MiB of slack."""
    counted = b.device_used + b.outside + b.held_on_device
    assert rise <= counted + 48 * MiB, (
        f"private memory rose {rise / MiB:.0f} MiB; the plan counts {counted / MiB:.0f} MiB "
        f"(resident {b.device_used / MiB:.0f}, outside {b.outside / MiB:.0f}, staging "
        f"{b.host_staging / MiB:.0f}, expansion {b.expansion / MiB:.0f})"
    )


@pytest.mark.slow
@pytest.mark.parametrize("lookahead", [1, 2, 4])
@pytest.mark.parametrize("compute", ["bf16", "f32"])
def test_private_memory_stays_within_the_plan(big: Path, lookahead: int, compute: str) -> None:
    """stream_load + install_offload + two passes take no more private memory than the plan's
    resident, outside and held figures (host staging, expansion), plus 48 MiB of slack."""
    model = on_meta(dim=2048, layers=8, vocab=64)
    gc.collect()
    _core.trim_heap()
    before = _core.private_memory()
    plan = tp.plan(
        model, big, vram=None, ram="64GB", min_free_ram=0, lookahead=lookahead, compute_dtype=compute, resident_blocks=2
    )
    handle = _two_passes(model, big, plan)
    rise = _core.private_memory() - before
    b = plan.budgets
    assert b is not None
    assert b.staging_buffers == lookahead + 1
    tp.release(model, handle)
    _within_plan(rise, b)


@pytest.mark.slow
@pytest.mark.parametrize("ram_in_memory", [False, True], ids=["mapped", "in-memory"])
def test_private_memory_with_adapters_stays_within_the_plan(
    big: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ram_in_memory: bool
) -> None:
    """With a LoRA on every block's layers, merged into the streamed ones: each streamed block
    keeps its merge in an image where it lives (mapped bf16 blocks run in place, so an overlay
    file; a RAM tier held in memory stages from a memory image, the disk tier from a file). A
    plan made with the merges on the model counts those images exactly as the engine holds
    them, and the private memory rises by no more than the plan's figures, the adapters' bytes
    and the memory images."""
    pytest.importorskip("peft")
    from safetensors.torch import save_file

    from trash_panda.adapter_names import adapter_bytes
    from trash_panda.offload.merges import merged_copies
    from trash_panda.offload.state import get_state

    monkeypatch.setenv("TRASH_PANDA_OVERLAY_DIR", str(tmp_path / "overlays"))
    if ram_in_memory:
        monkeypatch.setenv("TRASH_PANDA_RAM_IN_MEMORY", "1")
    g = torch.Generator().manual_seed(1)
    lora: dict[str, torch.Tensor] = {}
    for i in range(8):
        for layer, (rows, cols) in (("up", (8192, 2048)), ("down", (2048, 8192))):
            stem = f"lora_unet_blocks_{i}_{layer}"
            lora[f"{stem}.lora_down.weight"] = (torch.randn(16, cols, generator=g) * 0.01).to(torch.bfloat16)
            lora[f"{stem}.lora_up.weight"] = (torch.randn(rows, 16, generator=g) * 0.01).to(torch.bfloat16)
            lora[f"{stem}.alpha"] = torch.tensor(16.0)
    file = tmp_path / "lora.safetensors"
    save_file(lora, str(file))
    del lora
    model = on_meta(dim=2048, layers=8, vocab=64)
    gc.collect()
    _core.trim_heap()
    before = _core.private_memory()
    plan = tp.plan(model, big, vram=None, ram="64GB", min_free_ram=0, compute_dtype="bf16", resident_blocks=2)
    adapters: list[Any] = []
    handle = _two_passes(model, big, plan, lambda: adapters.append(tp.load_adapter(model, file, name="a")))
    adapter = adapters[0]
    rise = _core.private_memory() - before
    state = get_state(model)
    assert state is not None and state.engine is not None
    copies = merged_copies(state)
    merged = [n for n, why in adapter.modes.items() if why.startswith("merged")]
    assert len(merged) == 12  # the six streamed blocks' two layers
    assert len(copies.patched) == 24 and copies.made == 12 and copies.reused == 12  # weights, biases
    images = state.engine.overlay_bytes()
    assert images.blocks == 6
    # Planned again with the merges on the model, in the same tiers: the images as held.
    again = tp.plan(model, big, vram=None, ram="64GB", min_free_ram=0, compute_dtype="bf16", resident_blocks=2)
    again = again.assign(Tier.RAM, indices=[2, 3, 4]).assign(Tier.DISK, indices=[5, 6, 7])
    merged_blocks = [b.name for b in again.blocks if b.merged]
    assert merged_blocks == [f"blocks.{i}." for i in range(2, 8)], merged_blocks  # resident ones run unmerged
    a = again.budgets
    assert a is not None
    assert (a.merged_memory, a.merged_files) == (images.memory, images.file)
    assert (images.memory > 0) == ram_in_memory and images.file > 0
    assert "merged blocks (6, an adapter merged in)" in str(again)
    b = plan.budgets
    assert b is not None
    adapters_held = adapter_bytes(model)
    assert adapters_held == adapter.nbytes > 0
    # Beside the model: only what no image could take (nothing here).
    assert copies.held == (images.memory if ram_in_memory else 0) and copies.kept == 24
    counted = b.device_used + b.outside + b.held_on_device + adapters_held + images.memory
    if ram_in_memory:
        counted += b.ram_used  # the RAM tier's private copy
    tp.release(model, handle)
    assert rise <= counted + 48 * MiB, (
        f"private memory rose {rise / MiB:.0f} MiB; counted {counted / MiB:.0f} MiB (resident "
        f"{b.device_used / MiB:.0f}, outside {b.outside / MiB:.0f}, staging {b.host_staging / MiB:.0f}, "
        f"expansion {b.expansion / MiB:.0f}, adapters {adapters_held / MiB:.0f}, images {images.memory / MiB:.0f})"
    )


def test_in_place_write_to_a_streamed_weight_is_an_error(tmp_path: Path) -> None:
    torch.manual_seed(0)
    with torch.device("cpu"):
        ref = Tiny(dim=32, layers=4, vocab=50).eval()
    path = save(ref, tmp_path / "m.safetensors")
    model = on_meta(dim=32, layers=4, vocab=50)
    plan = Plan.manual(resident=["blocks.0."], streamed=["blocks.1.", "blocks.2.", "blocks.3."])
    tp.stream_load(model, path, plan=plan, device="cpu")
    handle = tp.install_offload(model)
    x = torch.randint(0, 50, (1, 3))
    with torch.no_grad():
        want = ref(x)
        assert torch.equal(model(x), want)
        # The spoiled staged copy is dropped: the next pass reads the block again.
        assert_writes_are_caught(model, 2, x, want)
    tp.release(model, handle)


class _FakeCudart:
    """cudaHostRegister that fails on the call numbered ``fail_at``."""

    def __init__(self, fail_at: int) -> None:
        self.fail_at = fail_at
        self.calls = 0
        self.registered: set[int] = set()

    def cudaHostRegister(self, addr: int, size: int, flags: int) -> int:
        self.calls += 1
        if self.calls == self.fail_at:
            return 2  # cudaErrorMemoryAllocation
        self.registered.add(addr)
        return 0

    def cudaHostUnregister(self, addr: int) -> int:
        self.registered.discard(addr)
        return 0

    def cudaGetErrorString(self, err: int) -> str:
        return "out of memory"


def _engine(tmp_path: Path) -> tuple[Any, Any]:
    torch.manual_seed(0)
    with torch.device("cpu"):
        ref = Tiny(dim=32, layers=4, vocab=50).eval()
    path = save(ref, tmp_path / "m.safetensors")
    model = on_meta(dim=32, layers=4, vocab=50)
    tp.stream_load(
        model, path, plan=Plan.manual(resident=[], streamed=[f"blocks.{i}." for i in range(4)]), device="cpu"
    )
    state = tp.offload.state.get_state(model)
    assert state is not None and state.engine is not None
    return model, state.engine


def test_pinned_registration_failure_undoes_and_warns(tmp_path: Path) -> None:
    model, engine = _engine(tmp_path)
    assert len(engine.staging_buffers()) == 3
    fake = _FakeCudart(fail_at=2)
    with pytest.warns(UserWarning, match="could not pin.*out of memory"):
        assert cuda_backend.register_pinned(fake, engine) is None
    assert fake.registered == set(), "the registration that succeeded was undone"
    tp.release(model)


def test_pinned_registration_is_undone_when_dropped(tmp_path: Path) -> None:
    model, engine = _engine(tmp_path)
    fake = _FakeCudart(fail_at=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reg = cuda_backend.register_pinned(fake, engine)
    assert reg is not None and len(fake.registered) == 3
    del reg, engine  # a model dropped without release(): nothing stays registered
    gc.collect()
    assert fake.registered == set()
    tp.release(model)


def test_the_engine_takes_typed_blocks_and_refuses_a_bad_option_naming_it(tmp_path: Path) -> None:
    """An engine is described with StreamBlock / StreamTensor and keyword options; a bad value is
    refused where it is given, with an error naming it and what is accepted."""
    torch.manual_seed(0)
    path = save(Tiny(layers=2), tmp_path / "m.safetensors")
    model = on_meta(layers=2)
    tp.stream_load(model, path, plan=Plan.manual(resident=["blocks.0."], streamed=["blocks.1."]), device="cpu")
    state = tp.offload.state.get_state(model)
    assert state is not None
    ckpt = tp.Checkpoint(path)
    files = list(ckpt.files)
    infos = [s.info for s in state.blocks[1].tensors]  # in the order stream_load described them
    tensors = [
        _core.StreamTensor(i.name, file=0, start=i.start, end=i.end, dtype=i.dtype, shape=i.shape) for i in infos
    ]
    block = _core.StreamBlock("blocks.1.", Tier.RAM, tensors)  # the tier the plan streams it from
    assert block.tier == Tier.RAM and [t.name for t in block.tensors] == [i.name for i in infos]
    engine = _core.Engine([block], files, state.config, holder="a test")
    lease = engine.acquire(0)
    assert lease.block == 0 and [t.name for t in engine.layout(0)] == [i.name for i in infos]
    lease.release()
    engine.close()

    with pytest.raises(ArgumentError, match=r'block "blocks.1.": tier: expected Tier.RAM or Tier.DISK'):
        _core.StreamBlock("blocks.1.", Tier.DEVICE, tensors)
    with pytest.raises(PlanError, match="ram"):
        _core.StreamBlock("blocks.1.", "tape", tensors)
    with pytest.raises(DtypeError, match=r'tensor "w": unknown dtype "bfloat": expected .*BF16, .*F8_E4M3'):
        _core.StreamTensor("w", file=0, start=0, end=2, dtype="bfloat", shape=[1])
    with pytest.raises(TypeError, match="pool"):
        _core.Engine([block], files, state.config, pool=4)  # type: ignore[arg-type]
    with pytest.raises(TypeError):  # the options are keywords
        _core.Engine([block], files, state.config, None, "a test")  # type: ignore[misc]
    with pytest.raises(TypeError):  # a block is a StreamBlock, not a tuple
        _core.Engine([("blocks.1.", "disk", [])], files, state.config)  # type: ignore[list-item]
    tp.release(model)


@pytest.fixture(scope="module")
def big_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same eight blocks in a GGUF file under the model's names, every 2-D weight in Q4_K
    (random blocks with weight-sized scales), the rest in F32: about 19 MB a block stored, 67 MB
    expanded to bf16."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    from support.ggml_blocks import gguf_type, random_blocks

    path = tmp_path_factory.mktemp("gguf") / "big.gguf"
    w = gguf.GGUFWriter(str(path), "tiny")
    for i, (name, t) in enumerate(on_meta(dim=2048, layers=8, vocab=64).state_dict().items()):
        if t.dim() == 2 and t.shape[1] % 256 == 0:
            data = random_blocks("Q4_K", t.shape[0], t.shape[1], seed=i, scale=1e-4)
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=gguf_type("Q4_K"))
        else:
            w.add_tensor(name, np.full(tuple(t.shape), 0.5, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.slow
def test_private_memory_with_gguf_blocks_stays_within_the_plan(big_gguf: Path) -> None:
    """GGUF blocks held compact (resident and RAM tier) and expanded one block at a time: the
    private memory stays within the plan's compact figures and its expansion buffer."""
    model = on_meta(dim=2048, layers=8, vocab=64)
    gc.collect()
    _core.trim_heap()
    before = _core.private_memory()
    plan = tp.plan(model, big_gguf, vram=None, ram="64GB", min_free_ram=0, compute_dtype="bf16", resident_blocks=2)
    b = plan.budgets
    assert b is not None
    blocks = plan.blocks
    assert all(blk.ggml for blk in blocks) and blocks[0].stored_bytes * 3 < blocks[0].expanded_bytes
    handle = _two_passes(model, big_gguf, plan)
    rise = _core.private_memory() - before
    tp.release(model, handle)
    _within_plan(rise, b)
