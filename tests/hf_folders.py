"""Transformers model folders made on the spot: a config, random weights saved in shards with
save_pretrained, and a byte-level BPE tokenizer trained with the tokenizers library."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

TEXT = [
    "the raccoon streams weights from the disk to the device block by block",
    "a plan says which block lives on the device, in ram or on the disk",
    "tokens come one by one while the next block is read ahead of the compute",
] * 20


def train_tokenizer(folder: Path, vocab: int) -> None:
    """A byte-level BPE tokenizer of at most ``vocab`` tokens, saved as a fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TEXT, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.save_pretrained(folder)


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
