"""Tiny diffusers transformers written as GGUF files for tests: a Flux-shaped one under
diffusers' names, a Wan-shaped one under the original Wan names (as published GGUF files of Wan
are), with their 2-D weights in GGML types; the reference model holding what the ``gguf``
package dequantizes; and a pipeline of the transformer alone, for ``load_pipeline``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from support.diffusion_models import flux
from support.ggml_blocks import gguf_type, random_blocks

# A Flux-shaped transformer whose 2-D weights' rows are whole K-quant blocks (of 256).
tiny_flux, flux_inputs = flux(in_channels=64, single=2, head_dim=128, text_dim=256, pooled_dim=256, axes=(32, 48, 48))


def tiny_wan() -> nn.Module:
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=128,
        in_channels=16,
        out_channels=16,
        text_dim=256,
        freq_dim=256,
        ffn_dim=512,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    )


def wan_inputs(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(4)
    return {
        "hidden_states": torch.randn(1, 16, 2, 8, 8, generator=g).to(dtype),
        "timestep": torch.tensor([500]),
        "encoder_hidden_states": torch.randn(1, 6, 256, generator=g).to(dtype),
    }


# The original Wan names of diffusers' (the converter's renames, undone), in the order that
# undoes them.
_WAN_ORIGINAL = [
    ("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
    ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
    ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
    ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
    ("condition_embedder.time_proj", "time_projection.1"),
    ("attn2", "cross_attn"),
    ("attn1", "self_attn"),
    (".to_out.0.", ".o."),
    (".to_q.", ".q."),
    (".to_k.", ".k."),
    (".to_v.", ".v."),
    ("ffn.net.0.proj", "ffn.0"),
    ("ffn.net.2", "ffn.2"),
    ("norm2", "norm__swap"),
    ("norm3", "norm2"),
    ("norm__swap", "norm3"),
]


def wan_original_name(name: str) -> str:
    if name == "scale_shift_table":
        return "head.modulation"
    if name.startswith("proj_out."):
        return "head.head." + name[len("proj_out.") :]
    name = name.replace(".scale_shift_table", ".modulation")
    for new, old in _WAN_ORIGINAL:
        name = name.replace(new, old)
    return name


def write_gguf(model: nn.Module, path: Path, qtype: str, rename: Any = None, seed: int = 0) -> Path:
    """``model``'s tensors in a GGUF file: 2-D weights whose rows are whole blocks of ``qtype``
    in it (random blocks with weight-sized scales for a K-quant, the weight quantized by the
    ``gguf`` package otherwise), those of 32 in Q8_0, the rest in F32; named ``rename(name)``."""
    import gguf

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "flux")
    per = 256 if qtype.endswith("_K") else 32
    for name, t in model.state_dict().items():
        out = rename(name) if rename is not None else name
        x = t.detach().float().numpy()
        if x.ndim > 4:
            # As ComfyUI-GGUF's converter writes them: flattened, the shape in the metadata.
            writer.add_array(f"comfy.gguf.orig_shape.{out}", [int(d) for d in x.shape])
            x = x.reshape(x.shape[0], -1)
        kind = (
            qtype if x.ndim == 2 and x.shape[1] % per == 0 else "Q8_0" if x.ndim == 2 and x.shape[1] % 32 == 0 else None
        )
        if kind is None:
            writer.add_tensor(out, np.ascontiguousarray(x))
        elif kind.endswith("_K"):
            data = random_blocks(kind, x.shape[0], x.shape[1], seed=int(rng.integers(1 << 30)), scale=3e-4)
            writer.add_tensor(out, data, raw_shape=data.shape, raw_dtype=gguf_type(kind))
        else:
            q = gguf.quants.quantize(x, gguf_type(kind))
            writer.add_tensor(out, q, raw_shape=q.shape, raw_dtype=gguf_type(kind))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def dequantized_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a GGUF file as the ``gguf`` package dequantizes it (float32), shaped as
    torch sees it."""
    import gguf

    out = {}
    reader = gguf.GGUFReader(str(path))
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        field = reader.fields.get(f"comfy.gguf.orig_shape.{t.name}")
        if field is not None:
            shape = tuple(int(field.parts[i][0]) for i in field.data)
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        out[t.name] = torch.from_numpy(np.ascontiguousarray(values).astype(np.float32).reshape(shape))
    return out


def transformer_pipeline(folder: Path, model: nn.Module) -> Path:
    """A pipeline folder of ``model``'s config alone (no weights: a GGUF file gives them)."""
    (folder / "transformer").mkdir(parents=True, exist_ok=True)
    model.save_config(folder / "transformer")
    index = {
        "_class_name": "TransformerOnly",
        "_diffusers_version": "0.42.1",
        "transformer": ["diffusers", type(model).__name__],
    }
    (folder / "model_index.json").write_text(json.dumps(index))
    return folder


def pipeline_class() -> type:
    """A diffusers pipeline of one component, the transformer."""
    from diffusers import DiffusionPipeline

    class TransformerOnly(DiffusionPipeline):  # type: ignore[misc]
        def __init__(self, transformer: nn.Module) -> None:
            super().__init__()
            self.register_modules(transformer=transformer)

    return TransformerOnly
