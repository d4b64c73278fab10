"""Tiny diffusers pipelines of two models that run together, made with random weights for the
group tests: Wan 2.2 (two experts, ``transformer`` for the high-noise steps and
``transformer_2`` for the rest, with ``boundary_ratio``) and Stable Diffusion with a
ControlNet; a LoRA for both of Wan's experts; one call of each pipeline."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from support.hf_folders import TINY_UNET, make_sd, randomize

WAN_STEPS = 4


def _wan_transformer() -> Any:
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=16,
        out_channels=16,
        text_dim=32,
        freq_dim=256,
        ffn_dim=32,
        num_layers=3,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    ).eval()


def _letters_tokenizer() -> Any:
    """One token a letter (no download): enough for a prompt."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz ")}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>", unk_token="<unk>", model_max_length=16
    )


def make_wan22(out: Path) -> Path:
    """A Wan 2.2 text-to-video pipeline folder: UMT5 text encoder, Wan VAE, two experts."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(0)
    tokenizer = _letters_tokenizer()
    text_encoder = UMT5EncoderModel(
        UMT5Config(
            vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
            relative_attention_num_buckets=8,
        )
    ).eval()  # fmt: skip
    vae = AutoencoderKLWan(
        base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
    ).eval()
    high, low = _wan_transformer(), _wan_transformer()
    for i, m in enumerate((high, low)):
        randomize(m, seed=30 + i)
        with torch.no_grad():
            for p in m.parameters():
                p.mul_(0.5)
    pipe = WanPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        transformer=high,
        transformer_2=low,
        boundary_ratio=0.875,
    )
    pipe.save_pretrained(out, safe_serialization=True)
    return out


def wan_lora(folder: Path, out: Path) -> Path:
    """A LoRA of the experts' attention (diffusers' format, rank 4, random B), for both."""
    from diffusers import WanPipeline, WanTransformer3DModel
    from peft import LoraConfig, get_peft_model_state_dict

    model = WanTransformer3DModel.from_pretrained(folder / "transformer")
    torch.manual_seed(40)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["to_q", "to_k", "to_v", "to_out.0"], init_lora_weights=False)
    model.add_adapter(config)
    WanPipeline.save_lora_weights(out, transformer_lora_layers=get_peft_model_state_dict(model))
    return out


def wan_call(pipe: Any, steps: int = WAN_STEPS) -> torch.Tensor:
    """A few frames of video, the same each call."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = pipe(
            prompt="a raccoon",
            negative_prompt="blur",
            max_sequence_length=16,
            height=16,
            width=16,
            num_frames=5,
            num_inference_steps=steps,
            guidance_scale=4.0,
            output_type="pt",
            generator=torch.Generator().manual_seed(0),
        )
    frames = out.frames
    assert isinstance(frames, torch.Tensor) and frames.shape == (1, 5, 3, 16, 16)
    return frames


def make_sd_controlnet(out: Path) -> Path:
    """The tiny Stable Diffusion pipeline with a ControlNet made to match its UNet."""
    from diffusers import ControlNetModel, StableDiffusionControlNetPipeline, StableDiffusionPipeline

    sd = StableDiffusionPipeline.from_pretrained(make_sd(out.parent / (out.name + "-sd")))
    unet_options = {k: v for k, v in TINY_UNET.items() if k not in ("out_channels", "up_block_types", "sample_size")}
    controlnet = ControlNetModel(**unet_options, conditioning_embedding_out_channels=(8, 16)).eval()
    randomize(controlnet, seed=50)
    with torch.no_grad():
        for p in controlnet.parameters():
            p.mul_(0.5)
    pipe = StableDiffusionControlNetPipeline(
        vae=sd.vae,
        text_encoder=sd.text_encoder,
        tokenizer=sd.tokenizer,
        unet=sd.unet,
        controlnet=controlnet,
        scheduler=sd.scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(out, safe_serialization=True, max_shard_size="100KB")
    return out


def controlnet_call(pipe: Any) -> torch.Tensor:
    """One small image guided by a fixed random control image."""
    guide = torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = pipe(
            "a raccoon at night",
            image=guide,
            num_inference_steps=3,
            height=16,
            width=16,
            guidance_scale=3.0,
            output_type="pt",
            generator=torch.Generator().manual_seed(0),
        )
    image = out.images
    assert isinstance(image, torch.Tensor) and image.shape == (1, 3, 16, 16)
    return image
