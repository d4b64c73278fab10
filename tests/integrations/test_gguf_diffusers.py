"""diffusers transformers from GGUF files through ``load_pipeline(..., files=...)``: a Flux-shaped
one (diffusers' names) and a Wan-shaped one (the original Wan names, mapped by diffusers' own
converter) give outputs bit-equal to the plain diffusers model holding the ``gguf`` package's
dequantization, with blocks on every tier."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import trash_panda
from support.gguf_diffusers import (
    dequantized_state_dict,
    flux_inputs,
    pipeline_class,
    tiny_flux,
    tiny_wan,
    transformer_pipeline,
    wan_inputs,
    wan_original_name,
    write_gguf,
)

pytest.importorskip("diffusers")
pytest.importorskip("gguf")

CASES = {
    "flux": (tiny_flux, flux_inputs, None, "transformer_blocks.", "Q4_K"),
    "wan": (tiny_wan, wan_inputs, wan_original_name, "blocks.", "Q5_K"),
}


def _plain(model: torch.nn.Module, path: Path, convert: bool) -> torch.nn.Module:
    """The model holding the reference dequantization of the file, in bf16."""
    state = dequantized_state_dict(path)
    if convert:
        from diffusers.loaders.single_file_model import SINGLE_FILE_LOADABLE_CLASSES

        fn = SINGLE_FILE_LOADABLE_CLASSES[type(model).__name__]["checkpoint_mapping_fn"]
        state = fn(checkpoint=state, config=dict(model.config))
    model.load_state_dict({k: v.to(torch.bfloat16) for k, v in state.items()})
    return model.to(torch.bfloat16).eval()


@pytest.mark.parametrize("ram", ["1TB", "1B"])
@pytest.mark.parametrize("case", list(CASES))
def test_outputs_equal_the_plain_model_on_the_reference_dequantization(tmp_path: Path, case: str, ram: str) -> None:
    # One block resident, the others in RAM or, with no RAM to spare, on the disk tier.
    build, inputs, rename, blocks, qtype = CASES[case]
    torch.manual_seed(0)
    model = build()
    path = write_gguf(model, tmp_path / f"{case}.gguf", qtype, rename)
    folder = transformer_pipeline(tmp_path / "pipe", model)
    plain = _plain(build(), path, convert=rename is not None)
    plan: dict[str, Any] = {"vram": "1TB", "resident_blocks": 1, "device": "cpu", "ram": ram, "min_free_ram": 0}
    pipe = trash_panda.diffusers.load_pipeline(
        pipeline_class(), folder, stream="transformer", files={"transformer": path}, **plan
    )
    try:
        streamed = pipe.transformer
        state = trash_panda.offload.state.get_state(streamed)
        assert state is not None and state.engine is not None
        tiers = {b.tier for b in state.plan.blocks}
        assert all(b.name.startswith(blocks) or "single" in b.name for b in state.plan.blocks)
        assert tiers == {trash_panda.Tier.DEVICE, trash_panda.Tier.RAM if ram == "1TB" else trash_panda.Tier.DISK}
        with torch.no_grad():
            want = plain(**inputs(torch.bfloat16)).sample
            got = streamed(**inputs(torch.bfloat16)).sample
        assert torch.equal(got, want)
    finally:
        trash_panda.diffusers.release_pipeline(pipe)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.mod = (torch.nn.Linear(256, 256, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mod(self.q(x) * self.k(x).sigmoid() + self.v(x))


class _Fused(torch.nn.Module):
    """Blocks whose projections a file holds fused (rows of one tensor) and in another order."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


def _converter(checkpoint: dict[str, torch.Tensor], **_kw: object) -> dict[str, torch.Tensor]:
    """A converter as diffusers writes them: a fused projection split in three, halves swapped."""
    out = {}
    for i in range(3):
        q, k, v = torch.chunk(checkpoint.pop(f"layers.{i}.qkv.weight"), 3, dim=0)
        out.update({f"blocks.{i}.q.weight": q, f"blocks.{i}.k.weight": k, f"blocks.{i}.v.weight": v})
        shift, scale = checkpoint.pop(f"layers.{i}.mod.weight").chunk(2, dim=0)
        out[f"blocks.{i}.mod.weight"] = torch.cat([scale, shift], dim=0)
    return out


def test_a_converter_that_splits_and_swaps_rows_is_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gguf

    from trash_panda import diffusers_names
    from trash_panda.checkpoint import Checkpoint
    from trash_panda.offload import empty_weights

    torch.manual_seed(0)
    writer = gguf.GGUFWriter(str(tmp_path / "f.gguf"), "fused")
    for i in range(3):
        for name, rows in (("qkv", 768), ("mod", 256)):
            w = (torch.randn(rows, 256) * 0.05).numpy()
            q = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(
                f"layers.{i}.{name}.weight", q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0
            )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    plain = _Fused()
    state = _converter(dequantized_state_dict(tmp_path / "f.gguf"))
    plain.load_state_dict({k: v.to(torch.bfloat16) for k, v in state.items()})
    plain = plain.to(torch.bfloat16).eval()

    monkeypatch.setattr(diffusers_names, "_converter", lambda _model: _converter)
    with empty_weights():
        model = _Fused().to(torch.bfloat16).eval()
    ckpt = Checkpoint(tmp_path / "f.gguf")
    names = diffusers_names.diffusers_tensor_map(model, ckpt)
    views = {v.name: v for vs in names.views.values() for v in vs}
    assert (views["blocks.0.k.weight"].first, views["blocks.0.k.weight"].count) == (256, 256)
    assert views["blocks.0.mod.weight"].order == tuple(range(128, 256)) + tuple(range(128))
    p = trash_panda.Plan.manual(resident=["blocks.0."], streamed=["blocks.1.", "blocks.2."]).assign(
        trash_panda.Tier.DISK, prefixes=["blocks.2."]
    )
    trash_panda.stream_load(model, ckpt, plan=p, device="cpu", key_map=names)
    handle = trash_panda.install_offload(model)
    x = torch.randn(2, 256, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(model(x), plain(x))
    trash_panda.release(model, handle)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
def test_diffusers_own_gguf_path_is_close_to_the_reference(
    tmp_path: Path, qtype: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # diffusers' from_single_file with GGUFQuantizationConfig dequantizes its own way (in the
    # compute dtype, on each call): its outputs are near the reference's, not equal; the
    # difference is reported, the streamed model's equality is the test above.
    from diffusers import FluxTransformer2DModel, GGUFQuantizationConfig

    torch.manual_seed(0)
    model = tiny_flux()
    path = write_gguf(model, tmp_path / "f.gguf", qtype)
    folder = transformer_pipeline(tmp_path / "pipe", model)
    plain = _plain(tiny_flux(), path, convert=False)
    theirs = FluxTransformer2DModel.from_single_file(
        str(path),
        config=str(folder),
        subfolder="transformer",
        quantization_config=GGUFQuantizationConfig(compute_dtype=torch.bfloat16),
        torch_dtype=torch.bfloat16,
    ).eval()
    x = flux_inputs(torch.bfloat16)
    with torch.no_grad():
        want, got = plain(**x).sample.float(), theirs(**x).sample.float()
    rel = ((got - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt()).item()
    with capsys.disabled():
        print(f"\ndiffusers' GGUF path against the reference, {qtype}: relative RMS difference {rel:.4f}")
    assert 0 < rel < 0.02
