"""Writes a large checkpoint of a 30-layer bf16 transformer (20 GB) for planning examples.

The file is sparse: the header is real and the data section is allocated by the file system only
where written (nowhere), so making it takes a second and almost no disk. Reading it gives zeros.

    python examples/big_checkpoint.py target/big.safetensors
    trash-panda plan target/big.safetensors --vram 24GB --max-vram 9GB --ram 16GB
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

HIDDEN, FFN, LAYERS, VOCAB = 5120, 13824, 30, 32000


def shapes() -> list[tuple[str, list[int]]]:
    out: list[tuple[str, list[int]]] = [("model.embed_tokens.weight", [VOCAB, HIDDEN])]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", [HIDDEN]),
            (p + "self_attn.q_proj.weight", [HIDDEN, HIDDEN]),
            (p + "self_attn.k_proj.weight", [HIDDEN, HIDDEN]),
            (p + "self_attn.v_proj.weight", [HIDDEN, HIDDEN]),
            (p + "self_attn.o_proj.weight", [HIDDEN, HIDDEN]),
            (p + "post_attention_layernorm.weight", [HIDDEN]),
            (p + "mlp.gate_proj.weight", [FFN, HIDDEN]),
            (p + "mlp.up_proj.weight", [FFN, HIDDEN]),
            (p + "mlp.down_proj.weight", [HIDDEN, FFN]),
        ]
    out += [("model.norm.weight", [HIDDEN]), ("lm_head.weight", [VOCAB, HIDDEN])]
    return out


def main(path: Path) -> None:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes():
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)
    print(f"{path}: {offset / 1e9:.1f} GB of bf16 weights (sparse)")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "target/big.safetensors"))
