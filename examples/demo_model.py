"""The demo's model: a transformers Llama of about 6 GB in bf16 with random weights, and a small
byte-level BPE tokenizer trained on the spot, written once as a complete model folder.

The weights come from one pool of normal values, each tensor a slice of it at a random offset:
generating 3 billion fresh normal values would take about a minute on two cores, copying slices
takes seconds, and the model is as deterministic and as hard to compress. Shards are written one
at a time, so the model never sits whole in memory.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "target" / "demo-llama-6gb"
SHARD_BYTES = 1 << 30
POOL = 64 << 20  # normal values in the pool; twice the largest tensor, so every slice fits
TEXT_FILES = ["README.md", "BENCHMARK.md"]


def config(vocab: int) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 30,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "vocab_size": vocab,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "dtype": "bfloat16",
    }


def train_tokenizer(folder: Path, vocab: int = 4000, text: list[str] | None = None) -> int:
    """A byte-level BPE tokenizer of at most ``vocab`` tokens, trained on ``text`` (by default
    the repository's documents) and saved as a fast tokenizer; returns its size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if text is None:
        text = [line for name in TEXT_FILES for line in (ROOT / name).read_text(encoding="utf-8").splitlines() if line]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(text, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.save_pretrained(folder)
    return len(fast)


def _shapes(cfg: dict[str, object]) -> list[tuple[str, tuple[int, ...]]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**cfg))  # type: ignore[arg-type]
    return [(name, tuple(p.shape)) for name, p in model.state_dict().items()]


def create(folder: Path = DEFAULT) -> Path:
    """Writes the model folder (once: a folder with its ``.complete`` mark is reused)."""
    from safetensors.torch import save_file

    from trash_panda.progress import Progress

    if (folder / ".complete").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    vocab = train_tokenizer(folder)
    cfg = config(vocab)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    shapes = _shapes(cfg)
    total = sum(2 * _numel(s) for _, s in shapes)
    gen = torch.Generator().manual_seed(0)
    pool = (torch.randn(POOL, generator=gen) * 0.02).to(torch.bfloat16)
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in shapes:
        if size and size + 2 * _numel(shape) > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += 2 * _numel(shape)
    weight_map: dict[str, str] = {}
    with Progress(f"creating {folder.name}", total) as bar:
        for i, shard in enumerate(shards):
            file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            tensors = {}
            for name, shape in shard:
                n = _numel(shape)
                if name.endswith("norm.weight"):
                    tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
                else:
                    off = int(torch.randint(0, POOL - n, (1,), generator=gen))
                    tensors[name] = pool[off : off + n].clone().reshape(shape)
                weight_map[name] = file
            save_file(tensors, str(folder / file), metadata={"format": "pt"})
            bar.advance(sum(2 * _numel(s) for _, s in shard))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (folder / ".complete").write_text("")
    return folder


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
