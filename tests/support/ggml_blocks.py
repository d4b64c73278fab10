"""GGML blocks for tests: random blocks of every type with chosen f16 scales, and weights made
into blocks. The ``gguf`` package quantizes Q4_0 ... Q8_0 only, so K-quant blocks are written
raw: random codes with bounded scales, which is what a K-quant file holds."""

from __future__ import annotations

from typing import Any

import numpy as np

# Bytes per block and weights per block, by the core's names.
LAYOUT = {
    "Q4_0": (18, 32),
    "Q4_1": (20, 32),
    "Q5_0": (22, 32),
    "Q5_1": (24, 32),
    "Q8_0": (34, 32),
    "Q2_K": (84, 256),
    "Q3_K": (110, 256),
    "Q4_K": (144, 256),
    "Q5_K": (176, 256),
    "Q6_K": (210, 256),
}
TYPES = list(LAYOUT)

# Where each type keeps its f16 scale (and minimum) fields.
SCALE_FIELDS = {
    "Q4_0": (0,),
    "Q5_0": (0,),
    "Q8_0": (0,),
    "Q4_1": (0, 2),
    "Q5_1": (0, 2),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q6_K": (208,),
}

# f16 scales that test the edges: zero, the smallest and largest subnormal, the largest finite,
# negative zero, one, and two negative ordinary values.
EXTREME = np.array([0x0000, 0x0001, 0x03FF, 0x7BFF, 0x8000, 0x3C00, 0xB555, 0xA2E6], dtype=np.uint16)


def gguf_type(name: str) -> Any:
    """The gguf package's type for a core name ("Q4_K")."""
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType[name]


def random_blocks(name: str, rows: int, cols: int, seed: int, scale: float | None = None) -> np.ndarray:
    """A ``[rows, cols / block * bytes]`` uint8 array of random blocks of ``name``. With
    ``scale``, every f16 field is about ``scale`` (weights of a model's size); without, a third
    are drawn from :data:`EXTREME` and the rest are random finite f16 values."""
    size, per = LAYOUT[name]
    assert cols % per == 0
    rng = np.random.default_rng(seed)
    out = rng.integers(0, 256, size=(rows * cols // per, size), dtype=np.uint8)
    for at in SCALE_FIELDS[name]:
        n = out.shape[0]
        if scale is None:
            h = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
            h = np.where((h & 0x7C00) == 0x7C00, h & 0xBBFF, h).astype(np.uint16)
            pick = rng.integers(0, 3, size=n) == 0
            h[pick] = EXTREME[rng.integers(0, len(EXTREME), size=int(pick.sum()))]
        else:
            h = (np.float16(scale) * rng.uniform(0.5, 1.5, size=n).astype(np.float16)).view(np.uint16)
        out[:, at : at + 2] = h.astype("<u2").view(np.uint8).reshape(n, 2)
    return out.reshape(rows, -1)
