"""The models of bench/pipeline.py: a Llama that rewrites the prompt, a T5 text encoder, an SD3
transformer and an SD3-style AutoencoderKL, with random bf16 weights written once under
target/bench-data/pipeline-<preset>/, and the pipeline's steps on them.

Each step takes the models it needs as arguments, so every way of the benchmark (plain torch,
``stage()``, ``Pipeline``, diffusers' group offloading) runs the very same computation.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from _common import DATA, write_checkpoint
from torch import nn

STAGES = ("llm", "text", "transformer", "vae")

# "small" is for trying the script (about 100 MB in all); "full" is the benchmark: the stages
# add up to about 4 GB, and the transformer alone is over half of it.
PRESETS: dict[str, dict[str, dict[str, object]]] = {
    "small": {
        "llm": {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4, "vocab_size": 8000},
        "text": {"d_model": 256, "d_ff": 704, "num_layers": 2, "num_heads": 4},
        "transformer": {"num_layers": 4, "num_attention_heads": 4},
        "vae": {"block_out_channels": [32, 64, 64, 64]},
    },
    "full": {
        "llm": {"hidden_size": 1536, "intermediate_size": 4096, "num_hidden_layers": 16, "vocab_size": 32000},
        "text": {"d_model": 1024, "d_ff": 2816, "num_layers": 12, "num_heads": 16},
        "transformer": {"num_layers": 14, "num_attention_heads": 24},
        "vae": {"block_out_channels": [128, 256, 512, 512]},
    },
}

PROMPT_TOKENS = 32
REWRITE_STEPS = 4  # tokens the LLM adds: one prefill pass, then one pass per token
LATENT = 32  # 32x32 latents: 256x256 images


@dataclass(frozen=True)
class Model:
    name: str
    make: Callable[[], nn.Module]  # on the current device (meta under empty_weights)
    path: Path  # the safetensors file


def _llm(c: dict[str, object]) -> Callable[[], nn.Module]:
    from transformers import LlamaConfig, LlamaForCausalLM

    h = int(c["hidden_size"])  # type: ignore[call-overload]
    config = LlamaConfig(
        **c,
        num_attention_heads=h // 64,
        num_key_value_heads=h // 64,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    return lambda: LlamaForCausalLM(config)


def _text(c: dict[str, object]) -> Callable[[], nn.Module]:
    from transformers import T5Config, T5EncoderModel

    config = T5Config(**c, d_kv=64, vocab_size=32128, feed_forward_proj="gated-gelu", torch_dtype="bfloat16")
    return lambda: T5EncoderModel(config)


def _transformer(c: dict[str, object], text_dim: int) -> Callable[[], nn.Module]:
    from diffusers import SD3Transformer2DModel

    heads = int(c["num_attention_heads"])  # type: ignore[call-overload]
    kwargs = dict(
        sample_size=LATENT,
        patch_size=2,
        in_channels=16,
        out_channels=16,
        num_layers=c["num_layers"],
        attention_head_dim=64,
        num_attention_heads=heads,
        joint_attention_dim=text_dim,
        caption_projection_dim=heads * 64,
        pooled_projection_dim=text_dim,
        pos_embed_max_size=LATENT // 2,
    )
    return lambda: SD3Transformer2DModel(**kwargs)


def _vae(c: dict[str, object]) -> Callable[[], nn.Module]:
    from diffusers import AutoencoderKL

    channels = list(c["block_out_channels"])  # type: ignore[call-overload]
    kwargs = dict(
        in_channels=3,
        out_channels=3,
        latent_channels=16,
        block_out_channels=channels,
        down_block_types=["DownEncoderBlock2D"] * len(channels),
        up_block_types=["UpDecoderBlock2D"] * len(channels),
        layers_per_block=2,
        norm_num_groups=32 if min(channels) >= 32 else min(channels),
    )
    return lambda: AutoencoderKL(**kwargs)


def models(preset: str) -> dict[str, Model]:
    """The four models of ``preset``; their checkpoints are written on first use."""
    c = PRESETS[preset]
    folder = DATA / f"pipeline-{preset}"
    makes = {
        "llm": _llm(c["llm"]),
        "text": _text(c["text"]),
        "transformer": _transformer(c["transformer"], int(c["text"]["d_model"])),  # type: ignore[call-overload]
        "vae": _vae(c["vae"]),
    }
    return {n: Model(n, makes[n], folder / f"{n}.safetensors") for n in STAGES}


def meta(m: Model) -> nn.Module:
    """``m`` with its parameters on the meta device and its buffers made, as stage() wants."""
    import trash_panda as tp

    with tp.empty_weights():
        return m.make().to(torch.bfloat16).eval()


class _Untied:
    """A model's state dict without the second name of a tied weight, as transformers saves it:
    both names written would be two different random tensors for one parameter."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, torch.Tensor]:
        seen: set[int] = set()
        out = {}
        for name, t in self.model.state_dict(keep_vars=True).items():
            if id(t) not in seen:
                seen.add(id(t))
                out[name] = t
        return out


def write_all(ms: dict[str, Model]) -> int:
    """Writes the checkpoints that are missing (a file of the same layout is reused); returns the
    bytes of all four."""
    total = 0
    for i, m in enumerate(ms.values()):
        with torch.device("meta"):
            shapes = m.make().to(torch.bfloat16)
        total += write_checkpoint(m.path, _Untied(shapes), torch.bfloat16, seed=i)  # type: ignore[arg-type]
    (next(iter(ms.values())).path.parent / "sizes.json").write_text(
        json.dumps({n: m.path.stat().st_size for n, m in ms.items()})
    )
    return total


def plain(m: Model) -> nn.Module:
    """The model as plain PyTorch has it: built without initialising, then load_state_dict."""
    from safetensors.torch import load_file

    model = meta(m)
    model.load_state_dict(load_file(str(m.path)), strict=False, assign=True)
    tie_weights = getattr(model, "tie_weights", None)  # transformers' models have it
    if tie_weights is not None:
        tie_weights()  # assign=True put a new tensor under one name of a tied pair
    return model


# -- the pipeline's steps ---------------------------------------------------------------------


def prompt(number: int, vocab: int) -> torch.Tensor:
    return torch.randint(4, vocab, (1, PROMPT_TOKENS), generator=torch.Generator().manual_seed(number))


def rewrite(llm: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Greedy decoding of REWRITE_STEPS tokens with the KV cache, as generate() would: every
    token is a full pass over the model's layers."""
    out = llm(input_ids=ids, use_cache=True)
    for _ in range(REWRITE_STEPS):
        nxt = out.logits[:, -1:].float().argmax(-1)
        ids = torch.cat([ids, nxt], dim=1)
        out = llm(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
    return ids


def encode(text: nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    hidden = text(input_ids=ids % 32128).last_hidden_state
    return hidden, hidden.mean(dim=1)


def start_latents(number: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + number)
    return torch.randn(1, 16, LATENT, LATENT, generator=g).to(torch.bfloat16)


def sigmas(steps: int) -> list[float]:
    return [1.0 - i / steps for i in range(steps + 1)]


def denoise(
    transformer: nn.Module, latents: torch.Tensor, cond: tuple[torch.Tensor, torch.Tensor], step: int, steps: int
) -> torch.Tensor:
    """One Euler step of the flow-matching sampler SD3 uses."""
    s = sigmas(steps)
    t = torch.full((1,), s[step] * 1000.0)
    v = transformer(hidden_states=latents, encoder_hidden_states=cond[0], pooled_projections=cond[1], timestep=t).sample
    return latents + (s[step + 1] - s[step]) * v


def decode(vae: nn.Module, latents: torch.Tensor) -> torch.Tensor:
    # diffusers' AutoencoderKL.decode, which nn.Module's typing cannot see.
    return vae.decode(latents / 1.5305 + 0.0609).sample  # type: ignore[operator]
