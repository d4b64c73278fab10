"""Transformers model folders made on the spot: a config, random weights saved in shards with
save_pretrained, and a byte-level BPE tokenizer trained with the tokenizers library."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from demo_model import train_tokenizer  # the demo's trainer, given this text

TEXT = [
    "the raccoon streams weights from the disk to the device block by block",
    "a plan says which block lives on the device, in ram or on the disk",
    "tokens come one by one while the next block is read ahead of the compute",
] * 20

# A UNet of two levels with cross-attention, small enough to build in a test.
TINY_UNET: dict[str, Any] = {
    "block_out_channels": (16, 32),
    "layers_per_block": 1,
    "sample_size": 8,
    "in_channels": 4,
    "out_channels": 4,
    "down_block_types": ("CrossAttnDownBlock2D", "DownBlock2D"),
    "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D"),
    "cross_attention_dim": 32,
    "norm_num_groups": 8,
    "attention_head_dim": 8,
}


def randomize(model: nn.Module, seed: int = 1) -> None:
    """Random weights of a useful size everywhere (norms too, so a norm loaded wrong shows)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_((torch.randn(p.shape, generator=g) * 0.2 + (1.0 if p.dim() == 1 else 0.0)).to(p.dtype))


def save_sharded(model: nn.Module, folder: Path, shard: str = "100KB") -> list[Path]:
    """save_pretrained in shards of at most ``shard``; returns the shard files."""
    model.save_pretrained(folder, max_shard_size=shard)
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) >= 3 and (folder / "model.safetensors.index.json").is_file(), shards
    return shards


def llama_config(layers: int = 6, intermediate: int = 128, vocab: int = 256, tied: bool = False) -> Any:
    """The config of a tiny Llama: hidden size 64, 4 heads of which 2 for keys and values."""
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=64,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab,
        max_position_embeddings=128,
        tie_word_embeddings=tied,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


def make_llama(folder: Path, layers: int) -> Path:
    """A tied Llama of ``layers`` tiny layers in bf16, saved in shards, with a tokenizer."""
    from transformers import LlamaForCausalLM

    cfg = llama_config(layers=layers, vocab=320, tied=True)
    model = LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16).eval()
    randomize(model)
    save_sharded(model, folder)
    train_tokenizer(folder, 300, TEXT)
    return folder


def _clip_tokenizer() -> Any:
    # Letters only and no merges (each letter is a token): enough for a prompt, made without a download.
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in "abcdefghijklmnopqrstuvwxyz":
        vocab[c + "</w>"] = len(vocab)
        vocab[c] = len(vocab)
    from transformers import CLIPTokenizer

    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=32)


def make_sd(out: Path) -> Path:
    """A Stable Diffusion pipeline folder of tiny random components, saved in shards."""
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(0)
    tok = _clip_tokenizer()
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=4,
            num_attention_heads=4,
            vocab_size=len(tok),
            max_position_embeddings=32,
            projection_dim=32,
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=1,
        )
    ).eval()
    unet = UNet2DConditionModel(**TINY_UNET).eval()
    vae = AutoencoderKL(
        block_out_channels=(16, 32),
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        latent_channels=4,
        norm_num_groups=8,
        sample_size=16,
    ).eval()
    for i, m in enumerate((text_encoder, unet, vae)):
        randomize(m, seed=i + 1)
        with torch.no_grad():  # keep the activations of random weights in range
            for p in m.parameters():
                p.mul_(0.5)
    pipe = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tok,
        unet=unet,
        scheduler=DDIMScheduler(steps_offset=1, clip_sample=False),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(out, safe_serialization=True, max_shard_size="100KB")
    assert (out / "unet" / "diffusion_pytorch_model.safetensors.index.json").is_file()
    assert (out / "text_encoder" / "model.safetensors.index.json").is_file()
    return out
