"""LoRA files made by PEFT for the tiny models of the tests, saved as users have them."""

from __future__ import annotations

from pathlib import Path

import torch

# The UNet's attention projections and its ResNets' convolutions (as kohya's UNet LoRAs take).
UNET_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "proj_in", "proj_out", "conv1", "conv2", "ff.net.2"]
TEXT_TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"]


def sd_loras(folder: Path, out: Path) -> dict[str, Path]:
    """Two LoRAs of the tiny Stable Diffusion pipeline in ``folder``, in diffusers' format:
    ``a`` (rank 4, alpha 8) on the UNet and the text encoder, ``b`` (rank 2, alpha 2) on the
    UNet's attention only. Their B matrices are random, so each changes the image."""
    from diffusers import StableDiffusionPipeline
    from peft import LoraConfig, get_peft_model_state_dict, inject_adapter_in_model

    pipe = StableDiffusionPipeline.from_pretrained(folder)
    files = {}
    for name, rank, alpha, unet_targets, text in (
        ("a", 4, 8, UNET_TARGETS, True),
        ("b", 2, 2, ["to_q", "to_v"], False),
    ):
        torch.manual_seed(len(files) + 10)
        cfg = LoraConfig(r=rank, lora_alpha=alpha, target_modules=unet_targets, init_lora_weights=False)
        pipe.unet.add_adapter(cfg, adapter_name=name)
        layers = {"unet_lora_layers": get_peft_model_state_dict(pipe.unet, adapter_name=name)}
        if text:
            text_cfg = LoraConfig(r=rank, lora_alpha=alpha, target_modules=TEXT_TARGETS, init_lora_weights=False)
            # PEFT's own call: transformers' add_adapter asks for a newer PEFT than is pinned.
            inject_adapter_in_model(text_cfg, pipe.text_encoder, adapter_name=name)
            layers["text_encoder_lora_layers"] = get_peft_model_state_dict(pipe.text_encoder, adapter_name=name)
        files[name] = out / name
        StableDiffusionPipeline.save_lora_weights(files[name], **layers)
    return files


def llama_lora(model_folder: Path, out: Path, rank: int = 4, seed: int = 20) -> Path:
    """A PEFT LoRA of the tiny Llama in ``model_folder`` (every projection of its layers),
    saved by ``save_pretrained`` (``adapter_model.safetensors`` and ``adapter_config.json``)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_folder)
    torch.manual_seed(seed)
    cfg = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        init_lora_weights=False,
    )
    get_peft_model(model, cfg).save_pretrained(out)
    return out
