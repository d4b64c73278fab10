"""Real transformers and diffusers models, every tier in use, outputs equal to the plain model.

Each model is made from a tiny config with random weights and saved with the official
safetensors writer. The offloaded copy is built with empty_weights() (parameters on meta,
buffers real), loaded with some blocks resident, some in RAM and some on disk, and must give
the same output as the plain model bit for bit (the fp8 test: the same output as a plain bf16
model holding the reference expansion ``(w.float() * scale).to(bf16)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file, save_model
from torch import nn

import trash_panda
from trash_panda import Plan, Tier

transformers = pytest.importorskip("transformers")
diffusers = pytest.importorskip("diffusers")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
NEW_TOKENS = 32


@pytest.fixture(autouse=True)
def _deterministic() -> Iterator[None]:
    torch.manual_seed(0)
    yield


def _llama_config(intermediate: int = 128, tied: bool = False) -> LlamaConfig:
    return LlamaConfig(hidden_size=64, intermediate_size=intermediate, num_hidden_layers=6, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=256, max_position_embeddings=128,
                       tie_word_embeddings=tied, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _llama(cfg: LlamaConfig, dtype: torch.dtype) -> nn.Module:
    # The way from_pretrained(dtype=...) builds it: parameters in dtype, rotary tables in fp32.
    model: nn.Module = LlamaForCausalLM._from_config(cfg, dtype=dtype).eval()
    return model


def _randomize(model: nn.Module) -> None:
    """Random weights of a useful size everywhere (norms too, so a norm loaded wrong shows)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_((torch.randn(p.shape, generator=g) * 0.2 + (1.0 if p.dim() == 1 else 0.0)).to(p.dtype))


def _every_tier(p: Plan) -> None:
    tiers = {b.tier for b in p.blocks}
    assert tiers == {Tier.DEVICE, Tier.RAM, Tier.DISK}, str(p)


def _check_streamed(model: nn.Module, report: trash_panda.LoadReport, p: Plan) -> None:
    """The load used every tier, and between runs the streamed blocks hold no weights."""
    assert report.device_tier.blocks == len(p.blocks_in(Tier.DEVICE)) > 0
    assert report.ram.blocks == len(p.blocks_in(Tier.RAM)) > 0
    assert report.disk.blocks == len(p.blocks_in(Tier.DISK)) > 0
    for name in [*p.blocks_in(Tier.RAM), *p.blocks_in(Tier.DISK)]:
        block = model.get_submodule(name.rstrip("."))
        assert all(w.is_meta for w in block.parameters()), name


def _ran_streamed(handle: trash_panda.OffloadHandle, p: Plan, passes: int) -> None:
    """Every streamed block went through the engine on every pass."""
    streamed = [*p.blocks_in(Tier.RAM), *p.blocks_in(Tier.DISK)]
    assert sorted(handle.recorded_order) == sorted(streamed)
    ran = [i for i, *_ in handle.runs]
    names = [b.name for b in p.blocks]
    for name in streamed:
        assert ran.count(names.index(name)) == passes, (name, ran)


# --- 1. a transformers causal LM: fp32 / fp16 / bf16 checkpoints ---------------------------------


def _manual_plan(layers: int) -> Plan:
    names = [f"model.layers.{i}." for i in range(layers)]
    p = Plan.manual(resident=names[:2], streamed=names[2:], streamed_tier="ram")
    return p.assign(Tier.DISK, indices=[3, 5])  # the streamed blocks alternate RAM / disk


def _auto_plan(model: nn.Module, path: Path) -> Plan:
    """plan() with injected memory figures sized so 2 blocks stay resident, 2 go to RAM, 2 to disk."""
    fixed = {"headroom_vram": 0, "min_free_ram": 0, "lookahead": 2}
    probe = trash_panda.plan(model, path, vram="1TB", ram="1TB", **fixed)
    budgets = probe.budgets
    assert budgets is not None
    block = max(b.stored_bytes for b in probe.blocks)
    staging = 2 * block  # lookahead blocks, counted on the device and in RAM once blocks are streamed
    vram = staging + budgets["expanded_block"] + budgets["outside"] + 2 * block + block // 2
    ram = staging + 2 * block + block // 2
    p = trash_panda.plan(model, path, vram=vram, ram=ram, **fixed)
    assert [b.tier for b in p.blocks] == [Tier.DEVICE] * 2 + [Tier.RAM] * 2 + [Tier.DISK] * 2, str(p)
    return p


@pytest.mark.parametrize(
    ("dtype", "tied", "auto"),
    [("f32", False, False), ("f16", True, True), ("bf16", False, False)],
    ids=["f32", "f16-tied-autoplan", "bf16"],
)
def test_llama_every_tier_logits_and_generate(tmp_path: Path, dtype: str, tied: bool, auto: bool) -> None:
    torch_dtype = DTYPES[dtype]
    cfg = _llama_config(tied=tied)
    ref = _llama(cfg, torch_dtype)
    _randomize(ref)
    path = tmp_path / "model.safetensors"
    save_model(ref, str(path))  # drops the tied copy of the embedding

    with trash_panda.empty_weights():
        model = _llama(cfg, torch_dtype)
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    if tied:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    p = _auto_plan(model, path) if auto else _manual_plan(cfg.num_hidden_layers)
    _every_tier(p)
    report = trash_panda.stream_load(model, path, plan=p)
    assert report.compute_dtype == str(torch_dtype).removeprefix("torch.")
    assert "model.rotary_emb.inv_freq" in report.kept_buffers
    _check_streamed(model, report, p)
    handle = trash_panda.install_offload(model)
    try:
        # What generate() reads: model.device and model.dtype come from the first parameters
        # (the embedding, outside the blocks), never from a meta placeholder.
        assert model.device == torch.device("cpu")
        assert model.dtype == torch_dtype
        if tied:
            assert model.lm_head.weight is model.model.embed_tokens.weight

        ids = torch.randint(3, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(2))
        mask = torch.ones_like(ids)
        with torch.no_grad():
            want = ref(input_ids=ids, attention_mask=mask).logits
            got = model(input_ids=ids, attention_mask=mask).logits
        assert got.dtype == want.dtype == torch_dtype
        assert torch.equal(got, want)
        _ran_streamed(handle, p, passes=1)

        gen = {"max_new_tokens": NEW_TOKENS, "min_new_tokens": NEW_TOKENS, "do_sample": False, "use_cache": True}
        want_ids = ref.generate(input_ids=ids, attention_mask=mask, **gen)
        got_ids = model.generate(input_ids=ids, attention_mask=mask, **gen)
        assert want_ids.shape == (2, ids.shape[1] + NEW_TOKENS)
        assert torch.equal(got_ids, want_ids)
        # One pass for the logits, one for the prompt, one per further token (KV cache on).
        _ran_streamed(handle, p, passes=1 + NEW_TOKENS)
        _check_streamed(model, report, p)
    finally:
        trash_panda.release(model, handle)
