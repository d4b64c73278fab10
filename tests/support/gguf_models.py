"""Tiny GGUF files for tests: a Llama-shaped model written by the ``gguf`` package's writer,
its weights quantized by the package (Q8_0, Q4_0) or, for the K-quants it cannot make, random
blocks with weight-sized scales."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from support.ggml_blocks import gguf_type, random_blocks

LLAMA = {
    "layers": 4,
    "hidden": 256,
    "ffn": 512,
    "heads": 4,
    "kv_heads": 2,
    "vocab": 256,
}


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's layout of a query or key projection (its rotary pairs side by side)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama(path: Path, qtype: str, seed: int = 0, vocab: int | None = None) -> Path:
    """A ``LLAMA``-shaped model in GGUF: its 2-D weights in ``qtype`` ("Q8_0", "Q4_0", "Q4_K",
    ...), norms in F32, the head in Q6_K when ``qtype`` is a K-quant (as llama.cpp makes them)."""
    import gguf

    c = {**LLAMA, "vocab": vocab or LLAMA["vocab"]}
    rng = np.random.default_rng(seed)
    head_dim = c["hidden"] // c["heads"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_block_count(c["layers"])
    w.add_context_length(256)
    w.add_embedding_length(c["hidden"])
    w.add_feed_forward_length(c["ffn"])
    w.add_head_count(c["heads"])
    w.add_head_count_kv(c["kv_heads"])
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(c["vocab"])
    w.add_uint32("general.file_type", 7)

    def weight(name: str, rows: int, cols: int, kind: str, heads: int | None = None) -> None:
        if kind.endswith("_K"):
            data = random_blocks(kind, rows, cols, seed=int(rng.integers(1 << 30)), scale=2e-4)
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=gguf_type(kind))
            return
        x = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
        if heads is not None:
            x = _permute(x, heads)
        q = gguf.quants.quantize(x, gguf_type(kind))
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf_type(kind))

    def norm(name: str, n: int) -> None:
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    h, f, kv = c["hidden"], c["ffn"], c["kv_heads"] * head_dim
    weight("token_embd.weight", c["vocab"], h, qtype)
    for i in range(c["layers"]):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", h)
        weight(p + "attn_q.weight", h, h, qtype, c["heads"])
        weight(p + "attn_k.weight", kv, h, qtype, c["kv_heads"])
        weight(p + "attn_v.weight", kv, h, qtype)
        weight(p + "attn_output.weight", h, h, qtype)
        norm(p + "ffn_norm.weight", h)
        weight(p + "ffn_gate.weight", f, h, qtype)
        weight(p + "ffn_up.weight", f, h, qtype)
        weight(p + "ffn_down.weight", h, f, "Q8_0" if qtype.endswith("_K") and f % 256 else qtype)
    norm("output_norm.weight", h)
    weight("output.weight", c["vocab"], h, "Q6_K" if qtype.endswith("_K") else qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
