"""stream_load + install_offload on plain torch models: outputs equal to the un-offloaded model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import trash_panda as tp
from support.checkpoints import every_tier, fp8_checkpoint, ids, reference
from support.models import Tiny, TwoLists, assert_writes_are_caught, on_meta, save
from trash_panda import CheckpointError, Plan, Tier
from trash_panda.offload.state import get_state

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_tier_bit_for_bit(tmp_path: Path, dtype: torch.dtype) -> None:
    ref = reference(dtype)
    path = save(ref, tmp_path / "m.safetensors", dtype)
    model = on_meta(Tiny)
    report = tp.stream_load(model, path, plan=every_tier(), device="cpu")
    assert report.device_tier.blocks == 2 and report.ram.blocks == 2 and report.disk.blocks == 2
    assert "disk" in str(report)
    handle = tp.install_offload(model)
    with torch.no_grad():
        want = ref(ids())
        for _ in range(3):  # the first pass stages cold, later ones reuse the pool
            assert torch.equal(model(ids()), want)
    stats = handle.stats()
    block_bytes = [b.stored_bytes for b in tp.plan(on_meta(Tiny), path, vram="1GB", ram="1GB").blocks]
    # Each disk block is read at least once; a block still staged from the pass before is reused.
    assert stats is not None
    assert sum(block_bytes[4:]) <= stats.disk_bytes <= 3 * sum(block_bytes[4:])
    assert stats.ram_bytes >= sum(block_bytes[2:4])
    assert handle.recorded_order == [f"blocks.{i}." for i in range(2, 6)]
    tp.release(model, handle)


@pytest.mark.parametrize("lookahead", ["0", "1", "3"])
@pytest.mark.parametrize("ram_in_memory", ["0", "1"])
def test_settings_keep_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lookahead: str, ram_in_memory: str
) -> None:
    monkeypatch.setenv("TRASH_PANDA_LOOKAHEAD", lookahead)
    monkeypatch.setenv("TRASH_PANDA_RAM_IN_MEMORY", ram_in_memory)
    monkeypatch.setenv("TRASH_PANDA_DISK_MODE", "buffered" if lookahead == "1" else "direct")
    ref = reference(torch.float32)
    path = save(ref, tmp_path / "m.safetensors")
    model = on_meta(Tiny)
    report = tp.stream_load(model, path, plan=every_tier(), device="cpu")
    assert report.ram_source == ("in memory" if ram_in_memory == "1" else "mapped")
    handle = tp.install_offload(model)
    with torch.no_grad():
        assert torch.equal(model(ids()), ref(ids()))
    tp.release(model, handle)


def test_automatic_plan_and_low_level_form(tmp_path: Path) -> None:
    ref = reference(torch.float32)
    path = save(ref, tmp_path / "m.safetensors")
    model = on_meta(Tiny)
    tp.stream_load(
        model, path, offload_prefixes=["blocks."], resident_prefixes=["blocks.0."], compute_dtype="f32", device="cpu"
    )
    state = get_state(model)
    assert state is not None
    assert [b.tier for b in state.blocks] == [Tier.DEVICE] + [Tier.RAM] * 5
    handle = tp.offload_blocks(model.blocks, device="cpu", compute_dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(model(ids()), ref(ids()))
    tp.release(model, handle)

    model = on_meta(Tiny)
    tp.stream_load(model, path, device="cpu")  # plans by itself
    handle = tp.install_offload(model)
    with torch.no_grad():
        assert torch.equal(model(ids()), ref(ids()))
    tp.release(model, handle)


def test_two_block_lists(tmp_path: Path) -> None:
    torch.manual_seed(1)
    ref = TwoLists().eval()
    path = save(ref, tmp_path / "two.safetensors")
    model = on_meta(TwoLists)
    # A manual entry naming a whole list covers each of its blocks.
    p = Plan.manual(resident=["double_blocks.0."], streamed=["double_blocks.1.", "double_blocks.2.", "single_blocks."])
    p.assign(Tier.DISK, prefixes=["double_blocks.2."])
    tp.stream_load(model, path, plan=p, device="cpu")
    state = get_state(model)
    assert state is not None
    assert [(b.prefix, b.tier.value) for b in state.blocks] == [
        ("double_blocks.0.", "device"),
        ("double_blocks.1.", "ram"),
        ("double_blocks.2.", "disk"),
        *((f"single_blocks.{i}.", "ram") for i in range(4)),
    ]
    handle = tp.install_offload(model)
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(x), ref(x))
    tp.release(model, handle)


def test_fp8_with_scales_equals_reference_expansion(tmp_path: Path) -> None:
    ref = reference(torch.float32)
    expected = fp8_checkpoint(ref, tmp_path / "fp8.safetensors")
    model = on_meta(Tiny)
    report = tp.stream_load(model, tmp_path / "fp8.safetensors", plan=every_tier(), device="cpu")
    assert report.compute_dtype == "bfloat16"
    handle = tp.install_offload(model)
    with torch.no_grad():
        want = expected(ids())
        assert torch.equal(model(ids()), want)
        assert torch.equal(model(ids()), want)
    tp.release(model, handle)


@pytest.mark.parametrize("storage", ["bf16", "fp8"])
def test_storage_dtype(tmp_path: Path, storage: str) -> None:
    # dim 512: the up/down weights have 2^20 elements, the smallest the fp8 storage converts.
    ref = reference(torch.float32, dim=512, layers=3, vocab=50)
    path = save(ref, tmp_path / "wide.safetensors")
    state = {}
    for name, w in ref.state_dict().items():
        if storage == "bf16" or not name.startswith("blocks."):
            state[name] = w.to(torch.bfloat16).float() if name.startswith("blocks.") else w
        elif w.dim() == 2 and w.numel() >= tp._core.FP8_MIN_ELEMENTS:
            q, s = tp.dtype.quantize_fp8(w)
            state[name] = q.float() * s
        else:
            state[name] = w
    model = on_meta(Tiny, dim=512, layers=3, vocab=50)
    p = Plan.manual(resident=["blocks.0."], streamed=["blocks.1.", "blocks.2."]).assign(Tier.DISK, indices=[2])
    tp.stream_load(model, path, plan=p, storage_dtype=storage, compute_dtype="f32", device="cpu")
    handle = tp.install_offload(model)
    x = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(1))
    # The disk tier (blocks.2.) keeps the file's form; the others hold the storage dtype's.
    expected = Tiny(dim=512, layers=3, vocab=50).eval()
    expected.load_state_dict({**state, **{k: v for k, v in ref.state_dict().items() if k.startswith("blocks.2.")}})
    with torch.no_grad():
        got = model(x)
        assert not torch.equal(got, ref(x)), "storage conversion changed nothing"
        assert torch.equal(got, expected(x))
    tp.release(model, handle)


def test_missing_parameter_names_it_and_near_names(tmp_path: Path) -> None:
    ref = reference(torch.float32)
    tensors = {k: v for k, v in ref.state_dict().items() if k != "blocks.3.up.weight"}
    tensors["blocks.3.up.weights"] = ref.state_dict()["blocks.3.up.weight"]
    save_file(tensors, str(tmp_path / "m.safetensors"))
    model = on_meta(Tiny)
    with pytest.raises(CheckpointError, match=r"blocks\.3\.up\.weight.*blocks\.3\.up\.weights"):
        tp.stream_load(model, tmp_path / "m.safetensors", plan=every_tier(), device="cpu")
    assert get_state(model) is None
    assert all(p.is_meta for p in model.parameters())


def test_shape_mismatch_names_both_shapes(tmp_path: Path) -> None:
    ref = reference(torch.float32)
    tensors = dict(ref.state_dict())
    tensors["blocks.1.up.weight"] = torch.zeros(255, 64)
    save_file(tensors, str(tmp_path / "m.safetensors"))
    with pytest.raises(CheckpointError, match=r"\[255, 64\].*\[256, 64\]"):
        tp.stream_load(on_meta(Tiny), tmp_path / "m.safetensors", plan=every_tier(), device="cpu")


def test_failed_load_leaves_nothing_usable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = save(reference(torch.float32), tmp_path / "m.safetensors")
    calls = {"n": 0}
    real = tp._core.read_block

    def flaky(*args: object, **kw: object) -> tuple[int, float]:
        calls["n"] += 1
        if calls["n"] == 2:  # the resident blocks, read in one call
            raise tp.ReadError("simulated: the drive went away")
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(tp._core, "read_block", flaky)
    model = on_meta(Tiny)
    with pytest.raises(tp.ReadError, match="drive went away"):
        tp.stream_load(model, path, plan=every_tier(), device="cpu")
    assert get_state(model) is None
    assert all(p.is_meta for p in model.parameters())
    with pytest.raises(tp.ArgumentError, match="stream_load"):
        tp.install_offload(model)


def test_order_and_warning(tmp_path: Path) -> None:
    class Reversed(Tiny):
        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.embed(ids)
            for b in reversed(self.blocks):
                x = b(x)
            return self.head(self.norm(x))

    torch.manual_seed(0)
    ref = Reversed().eval()
    path = save(ref, tmp_path / "r.safetensors")
    model = on_meta(Reversed)
    tp.stream_load(model, path, plan=every_tier(), device="cpu")
    handle = tp.install_offload(model)
    with pytest.warns(UserWarning, match="order"), torch.no_grad():
        assert torch.equal(model(ids()), ref(ids()))
    assert handle.recorded_order == [f"blocks.{i}." for i in range(5, 1, -1)]
    assert handle.ran == [f"blocks.{i}." for i in range(5, -1, -1)]  # resident blocks too
    ran = handle.ran
    handle.remove()
    # The streamed blocks' order alone: the resident blocks then run against the order given
    # (which drives an overlap load's reads), and that is warned about too.
    handle = tp.install_offload(model, order=handle.recorded_order)
    with pytest.warns(UserWarning, match=r"blocks\.1\. ran before the order given \(blocks\.0\."), torch.no_grad():
        model(ids())
    handle.remove()
    handle = tp.install_offload(model, order=ran)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            assert torch.equal(model(ids()), ref(ids()))
    with pytest.raises(tp.ArgumentError, match="blocks.9"):
        handle.remove()
        tp.install_offload(model, order=["blocks.9."])
    tp.release(model)


@pytest.mark.slow
def test_release_gives_memory_back(tmp_path: Path) -> None:
    ref = reference(torch.float32, dim=1280, layers=8, vocab=100)  # about 420 MB of weights
    path = save(ref, tmp_path / "big.safetensors")
    del ref
    x = torch.randint(0, 100, (1, 4))
    # A warm-up load and release, so the allocator's and torch's one-time costs are paid.
    for warm_up in (True, False):
        tp._core.trim_heap()
        before = tp._core.current_rss()
        model = on_meta(Tiny, dim=1280, layers=8, vocab=100)
        p = Plan.manual(resident=[f"blocks.{i}." for i in range(4)], streamed=[f"blocks.{i}." for i in range(4, 8)])
        # bf16 storage under f32 compute: resident weights are kept in the state, expanded each run.
        tp.stream_load(model, path, plan=p.assign(Tier.DISK, indices=[7]), device="cpu", storage_dtype="bf16")
        handle = tp.install_offload(model)
        with torch.no_grad():
            model(x)
        loaded = tp._core.current_rss()
        tp.release(model, handle)  # the caller still holds the handle afterwards
        after = tp._core.current_rss()
        if warm_up:
            del handle
    assert loaded - before > 60e6, "the load should have taken memory"
    assert after <= before * 1.05, f"RSS {before / 1e6:.0f} MB before, {after / 1e6:.0f} MB after release"
    with pytest.raises(tp.TrashPandaError, match="released"):
        model(x)


def test_measure_activation_on_cpu(tmp_path: Path) -> None:
    def big() -> None:
        t = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MB, touched
        t.add_(1)

    assert tp.measure_activation_vram(big, device="cpu") >= 50e6
    with pytest.raises(tp.ArgumentError, match="callable"):
        tp.measure_activation_vram(3)  # type: ignore[arg-type]


def test_argument_errors(tmp_path: Path) -> None:
    path = save(reference(torch.float32), tmp_path / "m.safetensors")
    with pytest.raises(tp.ArgumentError, match="nn.Module"):
        tp.stream_load("model", path)  # type: ignore[arg-type]
    with pytest.raises(tp.ArgumentError, match="not both"):
        tp.stream_load(on_meta(Tiny), path, plan=every_tier(), offload_prefixes=["blocks."], device="cpu")
    model = on_meta(Tiny)
    tp.stream_load(model, path, plan=every_tier(), device="cpu")
    with pytest.raises(tp.ArgumentError, match="already loaded"):
        tp.stream_load(model, path, plan=every_tier(), device="cpu")
    handle = tp.install_offload(model)
    with pytest.raises(tp.ArgumentError, match="already installed"):
        tp.install_offload(model)
    with pytest.raises(tp.ArgumentError, match="another model"):
        tp.release(on_meta(Tiny), handle)
    tp.release(model, handle)


def test_key_map_and_skip_prefixes(tmp_path: Path) -> None:
    ref = reference(torch.float32)
    tensors = {f"model.{k}": v for k, v in ref.state_dict().items()}
    tensors["vision.patch.weight"] = torch.zeros(8, 8)  # a part the model does not have
    save_file(tensors, str(tmp_path / "prefixed.safetensors"))
    model = on_meta(Tiny)
    report = tp.stream_load(
        model,
        tmp_path / "prefixed.safetensors",
        plan=every_tier(),
        key_map={"model.": ""},
        skip_prefixes=["vision."],
        device="cpu",
    )
    assert report.unexpected == []
    handle = tp.install_offload(model)
    with torch.no_grad():
        assert torch.equal(model(ids()), ref(ids()))
    tp.release(model, handle)

    model = on_meta(Tiny)
    report = tp.stream_load(
        model,
        tmp_path / "prefixed.safetensors",
        plan=every_tier(),
        key_map=lambda name: name.removeprefix("model."),
        device="cpu",
    )
    assert report.unexpected == ["vision.patch.weight"]
    assert "vision.patch.weight" in str(report)
    tp.release(model)


def test_profile_report_and_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    path = save(reference(torch.float32), tmp_path / "m.safetensors")
    monkeypatch.setenv("TRASH_PANDA_PROFILE", "1")
    monkeypatch.setenv("TRASH_PANDA_LOG", str(tmp_path / "run.jsonl"))
    model = on_meta(Tiny)
    tp.stream_load(model, path, plan=every_tier(), device="cpu")
    handle = tp.install_offload(model)
    with torch.no_grad():
        model(ids())
        model(ids())
    tp.release(model, handle)
    err = capsys.readouterr().err
    assert "pass 1:" in err and "pass 2:" in err and "pass 3:" not in err
    assert "blocks.4 (disk)" in err
    assert "memory while releasing:" in err and "after release:" in err
    # The read rates are set against the drive, measured unbuffered beside the run; a file
    # system that refuses unbuffered reads gets no reference rather than a flattering one.
    if tp._core.measure_drive([path], 1 << 20) is None:
        assert "drive reference" not in err and "the drive" not in err
    else:
        assert "drive reference: " in err and "of the checkpoint, 4 in flight, measured at release" in err
        assert "first pass against the drive: ram " in err and "x the drive, disk " in err
    line = json.loads((tmp_path / "run.jsonl").read_text().splitlines()[-1])
    assert line["format"] == "trash-panda-profile"
    assert len(line["passes"]) == 2
    trace = json.loads((tmp_path / "run.jsonl.trace.json").read_text())
    assert sum(1 for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "disk") == 4


def test_error_inside_a_block_leaves_the_model_runnable(tmp_path: Path) -> None:
    ref = reference(torch.float32)
    path = save(ref, tmp_path / "m.safetensors")
    model = on_meta(Tiny)
    tp.stream_load(model, path, plan=every_tier(), device="cpu")
    handle = tp.install_offload(model)
    failing = model.blocks[4].up  # inside a disk-tier block

    def boom(_m: torch.nn.Module, _args: object) -> None:
        raise RuntimeError("simulated failure inside a streamed block")

    hook = failing.register_forward_pre_hook(boom)
    for _ in range(3):  # more failures than staging buffers: every lease must come back
        with pytest.raises(RuntimeError, match="simulated"), torch.no_grad():
            model(ids())
    hook.remove()
    assert all(p.is_meta for b in model.blocks[2:] for p in b.parameters()), "placeholders are back"
    with torch.no_grad():
        assert torch.equal(model(ids()), ref(ids()))
    tp.release(model, handle)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("storage", [None, "fp8"])
def test_under_inference_mode(tmp_path: Path, dtype: torch.dtype, storage: str | None) -> None:
    """Users run models under torch.inference_mode(): every tier gives the plain model's output
    there too, and a write to a streamed weight is still caught."""
    ref = reference(dtype)
    path = save(ref, tmp_path / "m.safetensors", dtype)
    model = on_meta(Tiny)
    tp.stream_load(model, path, plan=every_tier(), device="cpu", storage_dtype=storage)
    handle = tp.install_offload(model)
    with torch.inference_mode():
        want = ref(ids())
        for _ in range(3):
            got = model(ids())
            if storage is None:
                assert torch.equal(got, want)
            else:  # resident and RAM-tier weights held as fp8: close, not equal
                assert torch.allclose(got.float(), want.float(), rtol=0.2, atol=0.2)
        assert_writes_are_caught(model, 4, ids(), want if storage is None else None)
    tp.release(model, handle)
