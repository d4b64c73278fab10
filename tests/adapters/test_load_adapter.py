"""trash_panda.load_adapter on a streamed model (blocks on every tier, in fp32 and bf16): a LoRA
saved by PEFT, the same LoRA in kohya's naming, and a LoHa and a LoKr made by PEFT and saved in
LyCORIS' naming each give the outputs of the plain model carrying the same adapter through PEFT,
bit for bit; a new scale, a second adapter, a merge and an unmerge (the checkpoint's bits back),
and remove() do too. Bad names and files are refused."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

import trash_panda as tp
from support.checkpoints import every_tier, ids, reference
from support.models import Tiny, on_meta, save
from trash_panda import Tier

peft = pytest.importorskip("peft")

from peft import LoHaConfig, LoKrConfig, LoraConfig, get_peft_model_state_dict, inject_adapter_in_model  # noqa: E402
from peft.tuners.tuners_utils import BaseTunerLayer  # noqa: E402

TARGETS = ["up", "down", "head"]


def _config(kind: str, rank: int) -> Any:
    if kind == "lora":
        return LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS, init_lora_weights=False)
    if kind == "loha":
        return LoHaConfig(r=rank, alpha=3 * rank, target_modules=TARGETS, init_weights=False)
    return LoKrConfig(r=rank, alpha=3 * rank, target_modules=TARGETS, init_weights=False, decompose_both=True)


def _adapted(base: Tiny, kind: str, rank: int, seed: int, name: str) -> dict[str, torch.Tensor]:
    """Puts a PEFT adapter named ``name`` on ``base`` (random, non-zero) and returns its weights
    as PEFT saves them."""
    torch.manual_seed(seed)
    inject_adapter_in_model(_config(kind, rank), base, adapter_name=name)
    with torch.no_grad():  # LoRA's B and LoHa/LoKr's second factor start at zero or tiny
        for layer in base.modules():
            if isinstance(layer, BaseTunerLayer):
                for attr in layer.adapter_layer_names:
                    held = getattr(layer, attr)
                    if name in held:
                        found = held[name]
                        for p in found.parameters() if isinstance(found, torch.nn.Module) else [found]:
                            p.copy_(torch.randn(p.shape) * 0.2)
    return get_peft_model_state_dict(base, adapter_name=name)


def _kohya(state: dict[str, torch.Tensor], alpha: float) -> dict[str, torch.Tensor]:
    """PEFT's names in kohya's / LyCORIS' form: ``lora_unet_<path with _>.<part>``, an alpha each."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        for peft_part, part in (("lora_A.weight", "lora_down.weight"), ("lora_B.weight", "lora_up.weight")):
            key = key.replace(peft_part, part)
        layer, _, part = key.rpartition(".lora_") if ".lora_" in key else key.rpartition(".")
        if ".lora_" in key:
            part = "lora_" + part
        prefix = "lora_unet_" + layer.replace(".", "_")
        out[f"{prefix}.{part}"] = value.contiguous()
        out[f"{prefix}.alpha"] = torch.tensor(alpha)
    return out


def _files(tmp: Path, kind: str, base: Tiny, rank: int, seed: int, name: str) -> tuple[dict[str, Path], Tiny]:
    """The adapter in each format it is saved in, and the plain model carrying it."""
    state = _adapted(base, kind, rank, seed, name)
    files = {}
    if kind == "lora":
        folder = tmp / f"peft-{name}"
        folder.mkdir()
        save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "adapter_model.safetensors"))
        (folder / "adapter_config.json").write_text(json.dumps({"lora_alpha": 2 * rank, "r": rank}))
        files["peft"] = folder
        files["kohya"] = tmp / f"kohya-{name}.safetensors"
        save_file(_kohya(state, 2 * rank), str(files["kohya"]))
    else:
        files["lycoris"] = tmp / f"lycoris-{name}.safetensors"
        save_file(_kohya(state, 3 * rank), str(files["lycoris"]))
    return files, base


def _plain(tmp: Path, kind: str, dtype: torch.dtype) -> tuple[dict[str, Path], dict[str, Path], Tiny, list[Any]]:
    """Adapters ``a`` (rank 4) and ``b`` (rank 2) saved in each format, and the plain model
    carrying both through PEFT, with its tuner layers."""
    tmp.mkdir()
    plain = reference(torch.float32).to(dtype)
    first, plain = _files(tmp, kind, plain, 4, 1, "a")
    second, plain = _files(tmp, kind, plain, 2, 2, "b")
    return first, second, plain, [m for m in plain.modules() if isinstance(m, BaseTunerLayer)]


def _unmerged(
    tmp: Path, kind: str, dtype: torch.dtype, active: list[str], scale_a: float, in_place: tuple[str, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain model's outputs after a merge and an unmerge of the ``active`` adapters on a
    streamed model whose layers under ``in_place`` hold real weights: PEFT subtracts from those
    what it added (not always the bits they had), as on the plain model, and the streamed ones
    are the checkpoint's again. Then with the adapters off (the base weights)."""
    _, _, again, layers = _plain(tmp, kind, dtype)
    with torch.no_grad():
        for name, layer in again.named_modules():
            if isinstance(layer, BaseTunerLayer):
                layer.set_scale("a", scale_a)
                layer.set_adapter(active)
                if name.startswith(in_place):
                    layer.merge(adapter_names=active)
                    layer.unmerge()
        unmerged = again(ids())
        for layer in layers:
            layer.enable_adapters(False)
        return unmerged, again(ids())


def _merged_reference(tmp: Path, dtype: torch.dtype) -> tuple[Path, dict[str, Path], torch.Tensor]:
    """The checkpoint (in ``dtype``), adapter ``a``'s files, and the plain model's outputs with
    ``a`` merged by PEFT into every layer."""
    path = save(reference(torch.float32), tmp / "tiny.safetensors", dtype)
    files, _, plain, layers = _plain(tmp / "plain", "lora", dtype)
    with torch.no_grad():
        for layer in layers:
            layer.set_adapter(["a"])
            layer.merge(adapter_names=["a"])
        return path, files, plain(ids())


def _planned(path: Path, ram: str) -> Tiny:
    """The model planned for the CPU with two resident blocks and ``ram`` for the rest, streamed."""
    model = on_meta(Tiny)
    planned = tp.plan(model, path, vram="1TB", ram=ram, resident_blocks=2, headroom_vram=0, device="cpu")
    tp.stream_load(model, path, plan=planned, device="cpu")
    tp.install_offload(model)
    return model


def _streamed(path: Path) -> Tiny:
    model = on_meta(Tiny)
    tp.stream_load(model, path, plan=every_tier(), device="cpu")  # computes in the file's dtype
    tp.install_offload(model)
    return model


CASES = [("lora", "peft"), ("lora", "kohya"), ("loha", "lycoris"), ("lokr", "lycoris")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("kind", "form"), CASES, ids=[f"{k}-{f}" for k, f in CASES])
def test_load_adapter_equals_peft_on_the_plain_model(tmp_path: Path, kind: str, form: str, dtype: torch.dtype) -> None:
    ref = reference(torch.float32)
    path = save(ref, tmp_path / "tiny.safetensors", dtype)
    files, second, plain, layers = _plain(tmp_path / "first", kind, dtype)
    x = ids()
    with torch.no_grad():
        for layer in layers:
            layer.set_adapter(["a"])
        want = {"a": plain(x)}
        for layer in layers:
            layer.set_scale("a", 0.5)
        want["scaled"] = plain(x)
        for layer in layers:
            layer.set_adapter(["a", "b"])
        want["both"] = plain(x)
        for layer in layers:
            layer.merge(adapter_names=["a", "b"])
        want["merged"] = plain(x)
        # Every layer gets its checkpoint's bits back on the unmerge, the resident ones too.
        want["unmerged"], want["removed"] = _unmerged(tmp_path / "again", kind, dtype, ["a", "b"], 0.5, ())
    model = _streamed(path)
    try:
        with torch.no_grad():
            bare = model(x)
            a = tp.load_adapter(model, files[form], name="a", mode="unmerged")
            assert a.kind == kind and sorted(a.layers) == sorted(n for n, m in plain.named_modules() if m in layers)
            assert a.nbytes > 0
            assert torch.equal(model(x), want["a"]), "a"
            assert not torch.equal(want["a"], bare)
            a.scale = 0.5
            assert torch.equal(model(x), want["scaled"]), "scaled"
            b = tp.load_adapter(model, second[form], name="b", mode="unmerged")
            assert torch.equal(model(x), want["both"]), "both"
            a.merge()
            b.merge()
            assert a.merged and b.merged
            assert torch.equal(model(x), want["merged"]), "merged"
            a.unmerge()  # every merge of a layer is undone, b's too (as PEFT does)
            assert torch.equal(model(x), want["unmerged"]), "unmerged"
            b.remove()
            a.remove()
            assert torch.equal(model(x), want["removed"]), "removed"
            assert not any(isinstance(m, BaseTunerLayer) for m in model.modules())
            with pytest.raises(tp.ArgumentError, match="was removed"):
                a.scale = 1.0
    finally:
        tp.release(model)


def test_bad_arguments_and_files_are_refused(tmp_path: Path) -> None:
    ref = reference(torch.float32)
    path = save(ref, tmp_path / "tiny.safetensors")
    files, _ = _files(tmp_path, "lora", reference(torch.float32), 4, 1, "a")
    model = _streamed(path)
    refusals: list[tuple[Callable[[], Any], type[Exception], str]] = [
        (lambda: tp.load_adapter(model, files["kohya"], scale="1"), tp.ArgumentError, "scale: expected a number"),
        (lambda: tp.load_adapter(model, files["kohya"], name="a.b"), tp.ArgumentError, "without dots"),
        (lambda: tp.load_adapter(model, tmp_path / "missing.safetensors"), tp.ArgumentError, "not an adapter file"),
        (lambda: tp.load_adapter(model, path), tp.CheckpointError, "no tensor of the file is a LoRA"),  # a model
    ]
    try:
        for call, error, match in refusals:
            with pytest.raises(error, match=match):
                call()
        assert not any(isinstance(m, BaseTunerLayer) for m in model.modules())  # nothing was put on
        tp.load_adapter(model, files["kohya"], name="a", mode="unmerged")
        with pytest.raises(tp.ArgumentError, match="already has an adapter named 'a'"):
            tp.load_adapter(model, files["peft"], name="a", mode="unmerged")
    finally:
        tp.release(model)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_merges_are_kept_where_their_blocks_live(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    """A merge into streamed layers is computed on the first run and written into its block's
    image where the block lives: private memory for a staged RAM-tier block (mapped, its pages
    given back; or held in memory, from the RAM the plan leaves free), an overlay file for the
    disk tier and for blocks used in place (bf16 ones on the CPU), which run from its map.
    Later runs stage the merged block and merge nothing; an unmerge stages the checkpoint's bits
    again and drops the images and files; a final pass keeps none. Where the overlay folder has
    no room, each run merges again. The outputs are the plain model's every time."""
    from trash_panda.offload.merges import merged_copies
    from trash_panda.offload.state import get_state

    path, files, want = _merged_reference(tmp_path, dtype)
    x = ids()
    unmerged, _ = _unmerged(tmp_path / "again", "lora", dtype, ["a"], 1.0, ())
    folder = tmp_path / "overlays"
    monkeypatch.setenv("TRASH_PANDA_OVERLAY_DIR", str(folder))
    cases = [
        ("ram mapped", "1TB", {}, "memory"),
        ("ram in memory", "1TB", {"TRASH_PANDA_RAM_IN_MEMORY": "1"}, "memory"),
        ("disk", "1KB", {}, "file"),
        ("disk, no room", "1KB", {"TRASH_PANDA_OVERLAY_LIMIT": "1KB"}, None),
    ]
    for case, ram, env, place in cases:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        model = on_meta(Tiny)
        planned = tp.plan(model, path, vram="1TB", ram=ram, resident_blocks=0, headroom_vram=0, device="cpu")
        tp.stream_load(model, path, plan=planned, device="cpu", compute_dtype=dtype)
        handle = tp.install_offload(model)
        try:
            adapter = tp.load_adapter(model, files["peft"], name="a", mode="unmerged")
            adapter.merge()
            state = get_state(model)
            assert state is not None and state.engine is not None
            in_place = all(state.engine.in_place(b) for b in state.engine.order())
            assert in_place == (dtype == torch.bfloat16 and "in memory" not in case), case
            if in_place and place is not None:
                place = "file"
            copies = merged_copies(state)
            streamed = sum(1 for n in adapter.layers if n.startswith("blocks."))
            blocks = len({n.split(".")[1] for n in adapter.layers if n.startswith("blocks.")})
            with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for _ in range(3):
                    assert torch.equal(model(x), want), case
            refused = [w for w in caught if "cannot keep a merged block where it lives" in str(w.message)]
            # No room is known ahead (the folder's limit less this model's files): nothing refused.
            assert not refused, case
            held = state.engine.overlay_bytes()
            if place is None:
                # No image: kept beside the model where its plan leaves RAM, else merged each run.
                assert not copies.patched and held.blocks == 0, case
                assert copies.made == (streamed if copies.kept else 3 * streamed), case
                assert not list(folder.glob("*.tpo")), case
            else:
                assert len(copies.patched) == 2 * streamed, case  # weights and biases
                assert {p.place for p in copies.patched.values()} == {place}, case
                assert copies.made == streamed and copies.reused == 2 * streamed, case
                assert held.blocks == blocks and (held.memory > 0) == (place == "memory"), case
                assert (held.file > 0) == (place == "file"), case
                assert len(list(folder.glob("*.tpo"))) == (blocks if place == "file" else 0), case
                # Mapped (or in place), an image takes the place of the block's pages; in memory,
                # it comes out of the RAM the plan leaves free.
                assert copies.held == (held.memory if "in memory" in case else 0), case
                assert copies.held <= max(copies.limit, 0), case
            adapter.unmerge()
            with torch.no_grad():
                assert torch.equal(model(x), unmerged), case  # the checkpoint's bits again
            assert copies.kept == 0 and copies.held == 0 and state.engine.overlay_bytes().blocks == 0, case
            # An overlay file is the image of its merges: it stays, for them to be found again.
            files_kept = blocks if place == "file" else 0
            assert len(list(folder.glob("*.tpo"))) == files_kept, case
            made = copies.made
            adapter.merge()  # the same merges: their images are found (files), or made again
            with torch.no_grad():
                assert torch.equal(model(x), want), case
            assert copies.made == made + (0 if place == "file" else streamed), case
            with handle.final_pass(), torch.no_grad():
                assert torch.equal(model(x), want), case
            assert copies.kept == 0 and copies.held == 0 and state.engine.overlay_bytes().blocks == 0, case
        finally:
            tp.release(model)
            for k in env:
                monkeypatch.delenv(k)
        assert len(list(folder.glob("*.tpo"))) == files_kept, case  # they outlive the engine
        if place != "file":
            continue
        # A later load with the same adapter finds them: its first run merges nothing.
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        model = on_meta(Tiny)
        planned = tp.plan(model, path, vram="1TB", ram=ram, resident_blocks=0, headroom_vram=0, device="cpu")
        tp.stream_load(model, path, plan=planned, device="cpu", compute_dtype=dtype)
        tp.install_offload(model)
        try:
            tp.load_adapter(model, files["peft"], name="a", mode="merged")
            state = get_state(model)
            assert state is not None
            with torch.no_grad():
                assert torch.equal(model(x), want), case
            assert merged_copies(state).made == 0 and len(merged_copies(state).patched) == 2 * streamed, case
            # Another scale is other merges: made, and an image of their own.
            tp.release(model)
            model = on_meta(Tiny)
            tp.stream_load(model, path, plan=planned, device="cpu", compute_dtype=dtype)
            tp.install_offload(model)
            tp.load_adapter(model, files["peft"], name="a", mode="merged", scale=0.5)
            state = get_state(model)
            assert state is not None
            with torch.no_grad():
                model(x)
            assert merged_copies(state).made == streamed, case
        finally:
            tp.release(model)
            for k in env:
                monkeypatch.delenv(k)
        assert len(list(folder.glob("*.tpo"))) == 2 * blocks, case
        for f in folder.glob("*.tpo"):
            f.unlink()


@pytest.mark.parametrize("ram_in_memory", [False, True], ids=["mapped", "in-memory"])
def test_a_device_copies_the_merged_blocks_from_their_images(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sim: Any, ram_in_memory: bool
) -> None:
    """On a device (the simulated asynchronous one, with a GPU's plan: device slots, copies in
    flight, a RAM tier held in memory copied straight from it), a merged block's image is where
    its staging comes from, so the device copies the merged bytes: outputs equal the plain
    model's after PEFT's merge on every pass, a patched block is no longer copied from the RAM
    tier's memory, and an unmerge gives the checkpoint's bits back (a copy made ahead before it,
    of the merged bytes, is dropped)."""
    from trash_panda import Tier
    from trash_panda.offload.backends.cuda import DeviceBackend
    from trash_panda.offload.handle import _install
    from trash_panda.offload.merges import merged_copies
    from trash_panda.offload.state import ModelState, get_state

    monkeypatch.setenv("TRASH_PANDA_OVERLAY_DIR", str(tmp_path / "overlays"))
    if ram_in_memory:
        monkeypatch.setenv("TRASH_PANDA_RAM_IN_MEMORY", "1")
    path, files, want = _merged_reference(tmp_path, torch.bfloat16)
    x = ids()
    model = on_meta(Tiny)
    planned = tp.plan(model, path, vram="1TB", ram="1TB", resident_blocks=1)  # a GPU's plan
    planned.assign(Tier.DISK, indices=[4, 5])
    tp.stream_load(model, path, plan=planned, device="cpu")
    state = get_state(model)
    assert state is not None and state.engine is not None

    def backend(s: ModelState) -> DeviceBackend:
        return DeviceBackend(s, sim)

    handle = _install(model, state, state.blocks, None, backend)
    try:
        adapter = tp.load_adapter(model, files["peft"], name="a", mode="merged")
        copies = merged_copies(state)
        with torch.no_grad():
            for _ in range(3):
                assert torch.equal(model(x), want)
        held = state.engine.overlay_bytes()
        assert held.blocks == 5 and held.file > 0 and held.memory > 0  # blocks 1-3 in RAM, 4-5 on disk
        assert copies.made == 10 and copies.reused == 20  # each streamed layer merged once
        device_copies = handle.backend.copies
        assert device_copies.direct == ram_in_memory
        assert not set(device_copies.images) & {p.block for p in copies.patched.values()}
        adapter.unmerge()
        # The streamed blocks stage the checkpoint's bits again, and the resident block and the
        # head (merged by PEFT in place) get theirs back.
        again, _ = _unmerged(tmp_path / "again", "lora", torch.bfloat16, ["a"], 1.0, ())
        with torch.no_grad():
            assert torch.equal(model(x), again)
        assert state.engine.overlay_bytes().blocks == 0 and not copies.patched
        if ram_in_memory:
            ram_tier = {b.engine_index for b in state.blocks if b.tier == Tier.RAM}
            assert set(device_copies.images) == ram_tier and len(ram_tier) == 3  # copied straight again
    finally:
        tp.release(model, handle)


def test_a_folder_another_model_fills_refuses_the_image_once_and_the_merge_runs_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two models share an overlay folder whose limit holds one model's merged blocks: the
    second's images are refused (the first's files are held), which is said once, and its
    layers are merged as they run, the outputs still the plain model's."""
    from trash_panda.offload.merges import merged_copies
    from trash_panda.offload.state import get_state

    path, files, want = _merged_reference(tmp_path, torch.float32)
    x = ids()
    monkeypatch.setenv("TRASH_PANDA_OVERLAY_DIR", str(tmp_path / "overlays"))
    first, second = _planned(path, ram="1KB"), _planned(path, ram="1KB")
    try:
        one = get_state(first)
        assert one is not None and one.engine is not None
        images = sum(one.engine.patched_image_len(b) for b in one.engine.order() if not one.engine.in_place(b))
        monkeypatch.setenv("TRASH_PANDA_OVERLAY_LIMIT", str(images))
        for model in (first, second):
            tp.load_adapter(model, files["peft"], name="a", mode="merged")
        with torch.no_grad():
            assert torch.equal(first(x), want)
            with pytest.warns(UserWarning, match="cannot keep a merged block where it lives") as said:
                assert torch.equal(second(x), want)
            assert torch.equal(second(x), want)
        assert len([w for w in said if "cannot keep a merged block" in str(w.message)]) == 1
        copies = [merged_copies(s) for s in (one, get_state(second)) if s is not None]
        assert copies[0].patched and not copies[1].patched
        assert len(list((tmp_path / "overlays").glob("*.tpo"))) == 4  # the first model's disk tier
    finally:
        tp.release(first)
        tp.release(second)


def test_adapters_on_fp8_blocks_equal_the_reference_expansion(tmp_path: Path) -> None:
    """Blocks stored in fp8 (three scale layouts) and expanded to bf16 as they run. The LoRA
    unmerged gives the outputs of the plain bf16 model holding the reference expansion with the
    same adapter through PEFT. Merged, each fp8 layer's merge (PEFT's, on the expansion) is
    quantized again by the core's quantizer in the layer's own scale layout, and the layer runs
    on the reference expansion of that, on every run; the kept merge is those codes and scales."""
    from support.checkpoints import fp8_checkpoint
    from trash_panda.offload.requant import kept_bytes
    from trash_panda.offload.state import get_state

    path = tmp_path / "fp8.safetensors"
    expected = fp8_checkpoint(reference(torch.float32), path)
    files, plain = _files(tmp_path, "lora", expected, 4, 1, "a")
    layers = {n: m for n, m in plain.named_modules() if isinstance(m, BaseTunerLayer)}
    x = ids()
    with torch.no_grad():
        unmerged = plain(x)
        for layer in layers.values():
            layer.merge()
        bf16_merge = plain(x)
        codes = 0
        for name, layer in layers.items():
            weight = layer.get_base_layer().weight
            if name.startswith("blocks.") and weight.dim() == 2:
                # The layouts of fp8_checkpoint: per row, per tensor, per 128 x 128 tile.
                layout = ("row", "tensor", "block")[int(name.split(".")[1]) % 3]
                q, scale = tp.dtype.quantize_fp8(weight.data, layout=layout)
                full = scale
                if layout == "block":
                    full = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[: q.shape[0], : q.shape[1]]
                requantized = (q.float() * full).to(torch.bfloat16)
                # One rounding to e4m3 (3 bits of mantissa): a few percent of the weight.
                error = (requantized.float() - weight.float()).norm() / weight.float().norm()
                assert 0 < error.item() < 0.05, (name, error)
                weight.data = requantized
                bias = layer.get_base_layer().bias
                # Kept for the streamed model: these codes and scales, and the bias in bf16.
                codes += q.numel() + scale.numel() * 4 + (bias.numel() * 2 if bias is not None else 0)
        merged = plain(x)
    assert codes > 0 and not torch.equal(merged, bf16_merge)
    model = on_meta(Tiny)
    tp.stream_load(model, path, plan=every_tier(), device="cpu", compute_dtype="bf16")
    tp.install_offload(model)
    try:
        with torch.no_grad():
            adapter = tp.load_adapter(model, files["kohya"], name="a", mode="unmerged")
            assert torch.equal(model(x), unmerged)
            adapter.merge()
            assert torch.equal(model(x), merged)
            assert torch.equal(model(x), merged)  # on the kept codes and scales
            state = get_state(model)
            assert state is not None and state.merged is not None
            copies = state.merged
            assert copies.reused > 0
            # Kept in their blocks' images where the blocks stream (RAM tier: memory; disk tier:
            # an overlay file), beside the model for the resident blocks: those codes and scales.
            specs = {(id(m), a): spec for b in state.blocks for spec in b.tensors for m, a in spec.owners}
            written = sum(kept_bytes(specs[slot]) for slot in copies.patched)
            assert {p.place for p in copies.patched.values()} == {"memory", "file"}
            assert copies.held + written == codes
    finally:
        tp.release(model)


def test_the_requantization_on_a_gpu_computes_the_core_s_bits() -> None:
    """On a GPU a merged fp8 layer is quantized again by torch operations: on the CPU they
    give the core's quantizer's codes and scales, bit for bit, in each layout."""
    from trash_panda.offload.requant import quantize_like_the_core

    g = torch.Generator().manual_seed(3)
    w = (torch.randn(300, 200, generator=g) * 0.05).to(torch.bfloat16)
    w[7] = 0.0
    w[0, 0] = float("nan")
    for layout in ("tensor", "row", "block"):
        q, scale = tp.dtype.quantize_fp8(w, layout=layout)
        tq, tscale = quantize_like_the_core(w, layout)
        assert torch.equal(q.view(torch.uint8), tq.view(torch.uint8)), layout
        assert torch.equal(scale, tscale.reshape(scale.shape)), layout


def test_changing_adapters_reads_nothing_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new scale, a second adapter, a merge, an unmerge and a removal read nothing of the
    model's checkpoint but what an unmerge gives back: the weights of the layers held in memory
    that PEFT merged in place, their checkpoint's bytes, once (the resident and outside weights
    are not read again otherwise); and each pass reads from the disk no more than the disk
    tier's blocks, once."""
    from trash_panda import _core
    from trash_panda.checkpoint import Checkpoint
    from trash_panda.offload.state import get_state
    from trash_panda.offload.tuner_layers import streams

    path = save(reference(torch.float32), tmp_path / "tiny.safetensors")
    first, second, _, _ = _plain(tmp_path / "plain", "lora", torch.float32)
    # Every read of the Python layer into memory goes through one of these two.
    reads: list[str] = []
    read_block, read_one = _core.read_block, Checkpoint.read

    def counted_block(requests: Any, *args: Any, **kwargs: Any) -> Any:
        reads.extend(str(r[0]) for r in requests if Path(r[0]) == path)
        return read_block(requests, *args, **kwargs)

    def counted_one(self: Checkpoint, name: str) -> Any:
        if any(Path(f) == path for f in self.files):
            reads.append(name)
        return read_one(self, name)

    monkeypatch.setattr(_core, "read_block", counted_block)
    monkeypatch.setattr(Checkpoint, "read", counted_one)
    model = _streamed(path)
    assert reads  # the load read the resident and outside weights through them
    reads.clear()
    try:
        state = get_state(model)
        assert state is not None and state.handle is not None and state.engine is not None
        engine, stats = state.engine, state.handle.stats
        on_disk = {b.engine_index for b in state.blocks if b.tier == Tier.DISK}
        assert len(on_disk) == 2

        def disk_bytes() -> int:
            # A pass stages the next pass's first blocks after its end, on the workers: read the
            # counter once they are idle. Which blocks a staging buffer still holds from the pass
            # before depends on timing, so a pass may read fewer blocks, never more.
            assert engine.wait_idle(10.0)
            return _disk_bytes(stats())

        x = ids()
        with torch.no_grad():
            model(x)
            model(x)
            sizes = {s.block: s.bytes for s in engine.stagings() if s.block in on_disk}
            assert set(sizes) == on_disk  # both were staged from the disk
            disk_tier = sum(sizes.values())
            a = tp.load_adapter(model, first["peft"], name="a", mode="unmerged")
            changes: list[Callable[[], object]] = [
                lambda: setattr(a, "scale", 0.3),
                lambda: tp.load_adapter(model, second["kohya"], name="b", mode="unmerged"),
                a.merge,
                a.unmerge,
                a.remove,
            ]
            read = 0
            modules = dict(model.named_modules())
            held = [n for n in a.layers if not streams(modules[n].get_base_layer())]  # merged in place
            for change in changes:
                in_place = held if change == a.unmerge else []
                change()
                now = disk_bytes()
                model(x)
                per_pass = disk_bytes() - now
                assert 0 <= per_pass <= disk_tier
                read += per_pass
                if change == a.unmerge:
                    # The layers merged in place get their bytes back, read once; nothing else.
                    given_back = {f"{n}.{p}" for n in in_place for p in ("weight", "bias")}
                    assert in_place and {f"{n}.weight" for n in in_place} <= set(reads) <= given_back
                    assert len(reads) == len(set(reads))
                else:
                    assert reads == [], change
                reads.clear()
            assert read > 0  # the disk tier was read, not held
    finally:
        tp.release(model)


def _disk_bytes(stats: Any) -> int:
    assert stats is not None
    found: int = stats.disk_bytes
    return found


def test_the_plan_counts_adapters_already_on_the_model(tmp_path: Path) -> None:
    """A model that carries PEFT's layers before it is planned (a chained pipeline's component
    with LoRAs loaded before its first call): the plan matches it to its checkpoint under the
    checkpoint's names and counts the adapters' bytes beside the outside weights, which leaves
    the resident blocks that much less."""
    path = save(reference(torch.float32), tmp_path / "tiny.safetensors")
    bare = on_meta(Tiny)
    adapted = on_meta(Tiny)
    inject_adapter_in_model(_config("lora", 8), adapted, adapter_name="a")
    nbytes = sum(p.numel() * p.element_size() for n, p in adapted.named_parameters() if "lora_" in n)
    assert nbytes > 0
    kw: dict[str, Any] = {"vram": "1TB", "ram": "1TB", "headroom_vram": 0, "device": "cpu", "max_vram": "2MB"}
    without, with_ = tp.plan(bare, path, **kw), tp.plan(adapted, path, **kw)
    b, w = without.budgets, with_.budgets
    assert b is not None and w is not None
    assert (b.adapters, w.adapters) == (0, nbytes)
    assert w.device_budget == b.device_budget - nbytes
    assert [blk.name for blk in with_.blocks] == [blk.name for blk in without.blocks]
    assert "adapters" in with_.table()


@pytest.mark.parametrize("mode", ["auto", "merged", "unmerged"])
def test_each_mode_equals_the_plain_model_merged_where_it_merged(tmp_path: Path, mode: str) -> None:
    """``mode="auto"`` merges into the streamed layers whose merge fits the plan's free RAM and
    runs the adapter unmerged on the layers held in memory; ``"merged"`` merges everywhere,
    ``"unmerged"`` nowhere. Each gives the plain model with PEFT's merge on the same layers, bit
    for bit, and so does a new scale (the merges made again, reading nothing)."""
    path = save(reference(torch.float32), tmp_path / "tiny.safetensors")
    files, _, _, _ = _plain(tmp_path / "plain", "lora", torch.float32)
    model = _planned(path, ram="1TB")
    x = ids()
    try:
        with torch.no_grad():
            adapter = tp.load_adapter(model, files["peft"], name="a", mode=mode)
            merged = {n for n, why in adapter.modes.items() if why.startswith("merged")}
            streamed = {n for n in adapter.layers if n.startswith(("blocks.2.", "blocks.3.", "blocks.4.", "blocks.5."))}
            want_merged = {"auto": streamed, "merged": set(adapter.layers), "unmerged": set()}[mode]
            assert merged == want_merged, adapter.modes
            if mode == "auto":
                assert all("held in memory" in adapter.modes[n] for n in set(adapter.layers) - streamed)
            for scale in (1.0, 0.4):
                # A fresh plain model each time: its unmerge below changes its weights' bits.
                _, _, plain, layers = _plain(tmp_path / f"plain-{scale}", "lora", torch.float32)
                by_name = dict(plain.named_modules())
                for layer in layers:
                    layer.set_adapter(["a"])
                    layer.set_scale("a", scale)
                for n in merged:
                    by_name[n].merge(adapter_names=["a"])
                want = plain(x)
                for n in merged:
                    by_name[n].unmerge()
                if scale != 1.0:
                    if mode == "merged":  # the resident layers were merged in place
                        with pytest.raises(tp.ArgumentError, match="is merged"):
                            adapter.scale = scale
                        continue
                    adapter.scale = scale
                assert torch.equal(model(x), want), (mode, scale)
                assert torch.equal(model(x), want), (mode, scale)
    finally:
        tp.release(model)


def test_the_report_says_how_each_layer_runs_and_what_a_change_made_again(tmp_path: Path) -> None:
    """adapter_report: the adapters, the layers running one unmerged, those merged into
    streamed weights with the merges kept; after a second adapter (merged with the first, as
    PEFT merges a layer's active adapters together) and after a new scale, which layers' merges
    wait to be made again, then which were made again on the next run. Each state's outputs
    are the plain model's with PEFT's merges on the same layers."""
    path = save(reference(torch.float32), tmp_path / "tiny.safetensors")
    first, second, _, _ = _plain(tmp_path / "plain", "lora", torch.float32)
    model = _planned(path, ram="1TB")
    x = ids()

    def plain_with(active: list[str], scale_a: float, merged: list[str]) -> torch.Tensor:
        _, _, plain, layers = _plain(tmp_path / f"plain-{len(active)}-{scale_a}", "lora", torch.float32)
        for layer in layers:
            layer.set_adapter(active)
            layer.set_scale("a", scale_a)
        by_name = dict(plain.named_modules())
        for n in merged:
            by_name[n].merge(adapter_names=active)
        return plain(x)

    try:
        with torch.no_grad():
            a = tp.load_adapter(model, first["peft"], name="a")
            merged = sorted(n for n, why in a.modes.items() if why.startswith("merged"))
            assert merged and len(merged) < len(a.layers)
            assert torch.equal(model(x), plain_with(["a"], 1.0, merged))
            report = tp.adapter_report(model)
            assert f"1 adapter(s) on {len(a.layers)} layers" in report
            assert f"a: {len(a.layers)} layers, {a.nbytes / 1e6:.1f} MB" in report
            unmerged = f"with an adapter unmerged (W x + s·B(A x) on each call): {len(a.layers) - len(merged)} layers"
            assert unmerged in report
            assert f"merged into streamed layers: {len(merged)} layers" in report
            assert "made again" not in report
            by_layer = tp.adapter_report(model, per_layer=True)
            assert by_layer.startswith(report) and "  per layer:" in by_layer
            assert f"    {merged[0]} [a]: a merged into the streamed weight, kept" in by_layer
            assert "    blocks.0.up [a]: a unmerged (its weight is held in memory" in by_layer
            assert by_layer.count("\n    ") == len(a.layers)
            with pytest.raises(tp.ArgumentError, match="per_layer: expected True or False, got 'yes'"):
                tp.adapter_report(model, per_layer="yes")  # type: ignore[arg-type]
            b = tp.load_adapter(model, second["kohya"], name="b")
            assert sorted(n for n, why in b.modes.items() if why.startswith("merged")) == merged
            assert sorted(n for n, why in a.modes.items() if why.startswith("merged")) == merged
            waiting = f"to be made again on their next run: {len(merged)} layers ({', '.join(merged[:6])}"
            assert waiting in tp.adapter_report(model)
            assert torch.equal(model(x), plain_with(["a", "b"], 1.0, merged))
            report = tp.adapter_report(model)
            assert f"merges made again after a change of adapters or scales: {len(merged)} layers" in report
            assert f"{len(merged)} times" in report and "to be made again" not in report
            a.scale = 0.5
            assert waiting in tp.adapter_report(model)
            assert torch.equal(model(x), plain_with(["a", "b"], 0.5, merged))
            assert f"{2 * len(merged)} times" in tp.adapter_report(model)
    finally:
        tp.release(model)


@pytest.mark.parametrize("tokens", [33, 4096])
def test_with_no_room_the_first_call_s_tokens_choose_the_way(
    tmp_path: Path, tokens: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``mode="auto"`` on streamed layers with no room to keep a merge (no RAM, an overlay
    folder with no room): at each layer's first call the core's cost model chooses from the
    call's tokens, unmerged for a few (33), merged again on each run for many (4096); either way
    the outputs are the plain model's with PEFT's merges on the same layers, on every call."""
    monkeypatch.setenv("TRASH_PANDA_OVERLAY_LIMIT", "1KB")
    path = save(reference(torch.float32), tmp_path / "tiny.safetensors")
    files, _, _, _ = _plain(tmp_path / "plain", "lora", torch.float32)
    want_way = "merged_each_run" if tokens > 1000 else "unmerged"
    for shape in ((64, 256), (256, 64)):  # the blocks' up and down projections, rank 4
        assert _core_way(shape, tokens) == want_way
    model = _planned(path, ram="1KB")  # no RAM for the RAM tier, none left free: blocks 2 to 5 on disk
    x = torch.randint(0, 100, (1, tokens), generator=torch.Generator().manual_seed(6))
    try:
        with torch.no_grad():
            adapter = tp.load_adapter(model, files["peft"], name="a")
            streamed = {n for n in adapter.layers if n.startswith(tuple(f"blocks.{i}." for i in range(2, 6)))}
            assert {n for n, why in adapter.modes.items() if "chosen at its first call" in why} == streamed
            _, _, plain, _ = _plain(tmp_path / "plain-ref", "lora", torch.float32)
            for layer in (m for m in plain.modules() if isinstance(m, BaseTunerLayer)):
                layer.set_adapter(["a"])
            by_name = dict(plain.named_modules())
            if want_way == "merged_each_run":
                for n in streamed:
                    by_name[n].merge(adapter_names=["a"])
            want = plain(x)
            assert torch.equal(model(x), want)
            way = "merged on each run (no room" if want_way == "merged_each_run" else "unmerged (no room"
            assert {n for n, why in adapter.modes.items() if why.startswith(way)} == streamed, adapter.modes
            assert all("held in memory" in adapter.modes[n] for n in set(adapter.layers) - streamed)
            assert torch.equal(model(x), want)
    finally:
        tp.release(model)


def _core_way(shape: tuple[int, int], tokens: int) -> str:
    from trash_panda import _core

    way: str = _core.choose_adapter_way("lora", 4, shape[0], shape[1], tokens).way
    return way


def test_adapters_the_plan_did_not_count_are_named(tmp_path: Path) -> None:
    """An adapter loaded after the model was planned takes the memory the plan left free: where
    it left too little, load_adapter warns with the figures, and the report names the bytes."""
    from trash_panda.offload.merges import merged_copies
    from trash_panda.offload.state import get_state

    path = save(reference(torch.float32), tmp_path / "tiny.safetensors")
    files, _, _, _ = _plain(tmp_path / "plain", "lora", torch.float32)
    model = on_meta(Tiny)
    planned = tp.plan(model, path, vram=None, ram="1KB", resident_blocks=2, device="cpu")
    budgets = planned.budgets
    assert budgets is not None and budgets.ram_budget - budgets.ram_used <= 0
    tp.stream_load(model, path, plan=planned, device="cpu")
    tp.install_offload(model)
    try:
        taken = r"Tiny: its adapters take 0\.1 MB of RAM its plan did not count, more than the 0\.0 MB"
        with pytest.warns(UserWarning, match=taken):
            adapter = tp.load_adapter(model, files["peft"], name="a")
        assert f"adapters its plan did not count (loaded after it was planned): {adapter.nbytes / 1e6:.1f} MB" in (
            tp.adapter_report(model)
        )
        adapter.remove()
        state = get_state(model)
        assert state is not None and merged_copies(state, model).unplanned == 0
    finally:
        tp.release(model)


def test_a_bad_mode_is_refused(tmp_path: Path) -> None:
    path = save(reference(torch.float32), tmp_path / "tiny.safetensors")
    files, _, _, _ = _plain(tmp_path / "plain", "lora", torch.float32)
    model = _streamed(path)
    try:
        with pytest.raises(tp.ArgumentError, match="mode: expected one of auto, merged, unmerged, got 'fused'"):
            tp.load_adapter(model, files["peft"], mode="fused")
    finally:
        tp.release(model)
