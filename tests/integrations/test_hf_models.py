"""Real transformers and diffusers models, every tier in use, outputs equal to the plain model.

Each model is made from a tiny config with random weights and saved with the official
safetensors writer. The offloaded copy is built with empty_weights() (parameters on meta,
buffers real), loaded with some blocks resident, some in RAM and some on disk, and must give
the same output as the plain model bit for bit (the fp8 test: the same output as a plain bf16
model holding the reference expansion ``(w.float() * scale).to(bf16)``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file, save_model
from torch import nn

import trash_panda
from support.diffusion_models import flux, unet
from support.hf_folders import llama_config, randomize
from trash_panda import Plan, Tier

transformers = pytest.importorskip("transformers")
diffusers = pytest.importorskip("diffusers")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
NEW_TOKENS = 32
# The CPU always; a CUDA GPU where there is one (the reference runs there too, so the same
# kernels compute both outputs).
DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
    ),
]


@pytest.fixture(autouse=True)
def _deterministic() -> Iterator[None]:
    torch.manual_seed(0)
    yield


def _llama_config(intermediate: int = 128, tied: bool = False) -> LlamaConfig:
    config: LlamaConfig = llama_config(intermediate=intermediate, tied=tied)
    return config


def _llama(cfg: LlamaConfig, dtype: torch.dtype) -> nn.Module:
    # The way from_pretrained(dtype=...) builds it: parameters in dtype, rotary tables in fp32.
    model: nn.Module = LlamaForCausalLM._from_config(cfg, dtype=dtype).eval()
    return model


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


def _auto_plan(model: nn.Module, path: Path, device: str) -> Plan:
    """plan() with injected memory figures sized so 2 blocks stay resident, 2 go to RAM, 2 to disk."""
    fixed = {"headroom_vram": 0, "min_free_ram": 0, "lookahead": 2, "device": device}
    # Every block on disk: the largest staging buffer and expansion any block can need.
    probe = trash_panda.plan(model, path, vram="1TB", ram=0, resident_blocks=0, **fixed)
    budgets = probe.budgets
    assert budgets is not None and budgets.staging_buffers == 3
    block = max(b.stored_bytes for b in probe.blocks)
    # The floor kept for the CUDA context (0 when the CPU computes) comes off the free VRAM too.
    floor = budgets.cuda_floor
    vram = floor + budgets.device_slot_bytes + budgets.expansion + budgets.outside + 2 * block + block // 2
    ram = budgets.host_staging + budgets.loader_ring + 2 * block + block // 2
    p = trash_panda.plan(model, path, vram=vram, ram=ram, **fixed)
    assert [b.tier for b in p.blocks] == [Tier.DEVICE] * 2 + [Tier.RAM] * 2 + [Tier.DISK] * 2, str(p)
    return p


@pytest.mark.parametrize(
    ("dtype", "tied", "auto"),
    [("f32", False, False), ("f16", True, True), ("bf16", False, False)],
    ids=["f32", "f16-tied-autoplan", "bf16"],
)
@pytest.mark.parametrize("device", DEVICES)
def test_llama_every_tier_logits_and_generate(tmp_path: Path, dtype: str, tied: bool, auto: bool, device: str) -> None:
    torch_dtype = DTYPES[dtype]
    cfg = _llama_config(tied=tied)
    ref = _llama(cfg, torch_dtype)
    randomize(ref)
    path = tmp_path / "model.safetensors"
    save_model(ref, str(path))  # drops the tied copy of the embedding

    with trash_panda.empty_weights():
        model = _llama(cfg, torch_dtype)
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    if tied:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    p = _auto_plan(model, path, device) if auto else _manual_plan(cfg.num_hidden_layers)
    _every_tier(p)
    ref.to(device)
    report = trash_panda.stream_load(model, path, plan=p, device=device)
    assert report.compute_dtype == str(torch_dtype).removeprefix("torch.")
    assert "model.rotary_emb.inv_freq" in report.kept_buffers
    _check_streamed(model, report, p)
    handle = trash_panda.install_offload(model)
    try:
        # What generate() reads: model.device and model.dtype come from the first parameters
        # (the embedding, outside the blocks), never from a meta placeholder.
        assert model.device.type == device
        assert model.dtype == torch_dtype
        if tied:
            assert model.lm_head.weight is model.model.embed_tokens.weight

        ids = torch.randint(3, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(2)).to(device)
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


# --- 2. diffusers models: a Flux transformer and a UNet ---------------------------------------------


def _output(out: object) -> torch.Tensor:
    sample = out.sample if hasattr(out, "sample") else out[0]  # type: ignore[index]
    assert isinstance(sample, torch.Tensor)
    return sample


_MID = "mid_block.attentions.0.transformer_blocks.0.ff.net."
_RUN_ORDER = {
    # Block discovery takes the outermost lists with two or more weighted children: in the mid
    # block, its two resnets and the two weighted members of the feed-forward's net list.
    "unet": [
        "down_blocks.0.",
        "down_blocks.1.",
        "mid_block.resnets.0.",
        _MID + "0.",
        _MID + "2.",
        "mid_block.resnets.1.",
        "up_blocks.0.",
        "up_blocks.1.",
    ],
}


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("which", ["flux", "unet"])
@pytest.mark.parametrize("device", DEVICES)
def test_diffusers_every_tier_forward(tmp_path: Path, which: str, dtype: str, device: str) -> None:
    torch_dtype = DTYPES[dtype]
    build, inputs = {"flux": flux, "unet": unet}[which]()
    ref = build().to(torch_dtype).eval()
    randomize(ref)
    path = tmp_path / "diffusion_pytorch_model.safetensors"
    save_model(ref, str(path))

    with trash_panda.empty_weights():
        model = build().to(torch_dtype).eval()
    names = [b.prefix for b in trash_panda.blocks.find_blocks(model)]
    assert len(names) >= 5, names
    # The first block resident; the others alternate between RAM and disk.
    p = Plan.manual(resident=names[:1], streamed=names[1:], streamed_tier="ram")
    p.assign(Tier.DISK, indices=list(range(2, len(names), 2)))
    _every_tier(p)
    ref.to(device)
    report = trash_panda.stream_load(model, path, plan=p, device=device)
    _check_streamed(model, report, p)
    # The UNet runs its middle blocks in another order than it defines them: give the real one.
    order = _RUN_ORDER.get(which)
    if order is not None:
        assert sorted(order) == sorted(names)
    handle = trash_panda.install_offload(model, order=order)
    try:
        x = {k: v.to(device) for k, v in inputs(torch_dtype).items()}
        with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            want = _output(ref(**x))
            got = _output(model(**x))
        assert not [str(w.message) for w in caught if "order given" in str(w.message)]
        if order is not None:
            streamed = set(p.blocks_in(Tier.RAM)) | set(p.blocks_in(Tier.DISK))
            assert handle.recorded_order == [n for n in order if n in streamed]
        with torch.no_grad():
            assert torch.isfinite(want).all()
            assert got.dtype == want.dtype == torch_dtype
            assert torch.equal(got, want)
            _ran_streamed(handle, p, passes=1)
            assert torch.equal(_output(model(**x)), want)  # a second pass, from the engine's steady state
            _ran_streamed(handle, p, passes=2)
        _check_streamed(model, report, p)
    finally:
        trash_panda.release(model, handle)


def test_unet_defined_order_warns_naming_the_expected_block(tmp_path: Path) -> None:
    """Without order=, the UNet runs its blocks against their defined order: one warning, naming
    the block that ran and the one the order expected."""
    build, inputs = unet()
    ref = build().eval()
    path = tmp_path / "unet.safetensors"
    save_model(ref, str(path))
    with trash_panda.empty_weights():
        model = build().eval()
    names = [b.prefix for b in trash_panda.blocks.find_blocks(model)]
    p = Plan.manual(resident=names[:1], streamed=names[1:], streamed_tier="ram")
    trash_panda.stream_load(model, path, plan=p, device="cpu")
    handle = trash_panda.install_offload(model)
    try:
        with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            want = _output(ref(**inputs(torch.float32)))
            got = _output(model(**inputs(torch.float32)))
        assert torch.equal(got, want)
        messages = [str(w.message) for w in caught if "order given" in str(w.message)]
        # Discovery lists down_blocks, up_blocks, then the mid block: after down_blocks.1 the
        # defined order expects up_blocks.0.
        assert names[:4] == ["down_blocks.0.", "down_blocks.1.", "up_blocks.0.", "up_blocks.1."]
        assert messages == [
            "block mid_block.resnets.0. ran before the order given (up_blocks.0. ...): "
            "pass order= so blocks are staged (and with overlap=True loaded) in the order forward() runs them"
        ]
        assert handle.recorded_order == _RUN_ORDER["unet"][1:]
    finally:
        trash_panda.release(model, handle)


# --- 3. an fp8 checkpoint with scale tensors ---------------------------------------------------------

FP8_MAX = 448.0


def _block_scales(w: torch.Tensor, block: int = 128) -> torch.Tensor:
    rows, cols = w.shape
    s = torch.zeros(math.ceil(rows / block), math.ceil(cols / block))
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            s[i, j] = w[i * block : (i + 1) * block, j * block : (j + 1) * block].abs().max() / FP8_MAX
    return s


def _per_block(s: torch.Tensor, rows: int, cols: int, block: int = 128) -> torch.Tensor:
    """Block scales repeated over their 128x128 blocks, cropped to the weight."""
    return s.repeat_interleave(block, 0).repeat_interleave(block, 1)[:rows, :cols]


# How each projection of every layer is stored: (scale tensor suffix, scale layout).
FP8_LAYOUTS = {
    "self_attn.q_proj": (".weight_scale", "row [rows, 1]"),
    "self_attn.k_proj": (".weight_scale", "row [rows]"),
    "self_attn.v_proj": (".scale_weight", "tensor 0-d"),
    "self_attn.o_proj": (None, "no scale"),
    "mlp.gate_proj": (".weight_scale_inv", "block"),  # [160, 64]: scales [2, 1]
    "mlp.up_proj": (".weight_scale", "tensor [1]"),
    "mlp.down_proj": (".weight_scale_inv", "block"),  # [64, 160]: scales [1, 2]
}


def _quantize(
    w: torch.Tensor, layout: str, fp8: torch.dtype, scale_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(fp8 weight, scale tensor as stored, the stored scale in fp32 broadcast to the weight)."""
    rows, cols = w.shape
    top = torch.finfo(fp8).max
    if layout == "no scale":
        return w.to(fp8), None, torch.ones(())
    if layout.startswith("row"):
        s = (w.abs().amax(dim=1, keepdim=True) / top).to(scale_dtype)
        stored, full = (s if layout == "row [rows, 1]" else s.reshape(rows)), s.float()
    elif layout.startswith("tensor"):
        s = (w.abs().max() / top).to(scale_dtype)
        stored, full = (s.reshape(()) if layout == "tensor 0-d" else s.reshape(1)), s.float()
    else:
        stored = (_block_scales(w) * FP8_MAX / top).to(scale_dtype)
        full = _per_block(stored.float(), rows, cols)
    return (w / full).to(fp8), stored.contiguous(), full


@pytest.mark.parametrize(
    ("fp8", "scale_dtype"),
    [(torch.float8_e4m3fn, torch.float32), (torch.float8_e4m3fn, torch.bfloat16), (torch.float8_e5m2, torch.float32)],
    ids=["e4m3-f32-scales", "e4m3-bf16-scales", "e5m2-f32-scales"],
)
@pytest.mark.parametrize("device", DEVICES)
def test_llama_fp8_scales_every_tier_equals_reference_expansion(
    tmp_path: Path, fp8: torch.dtype, scale_dtype: torch.dtype, device: str
) -> None:
    cfg = _llama_config(intermediate=160)  # gate/up/down have a dimension over 128: two scale blocks
    ref = _llama(cfg, torch.bfloat16)
    randomize(ref)
    tensors: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, param in ref.named_parameters():
            layer = name.removesuffix(".weight")
            kind = next((k for k in FP8_LAYOUTS if name.startswith("model.layers.") and layer.endswith(k)), None)
            if kind is None:
                tensors[name] = param.detach().clone()
                continue
            suffix, layout = FP8_LAYOUTS[kind]
            q, stored, full = _quantize(param.float(), layout, fp8, scale_dtype)
            tensors[name] = q
            if suffix is not None:
                assert stored is not None
                tensors[layer + suffix] = stored
            # The reference expansion, straight into the plain bf16 model.
            param.copy_((q.float() * full).to(torch.bfloat16))
    assert sum(t.dtype == fp8 for t in tensors.values()) == 7 * cfg.num_hidden_layers
    assert tensors["model.layers.0.mlp.gate_proj.weight_scale_inv"].shape == (2, 1)
    assert tensors["model.layers.0.mlp.down_proj.weight_scale_inv"].shape == (1, 2)
    path = tmp_path / "fp8.safetensors"
    save_file(tensors, str(path))

    with trash_panda.empty_weights():
        model = _llama(cfg, torch.bfloat16)
    p = _manual_plan(cfg.num_hidden_layers)
    _every_tier(p)
    ref.to(device)
    report = trash_panda.stream_load(model, path, plan=p, device=device)  # compute dtype: bf16, from the file
    assert report.compute_dtype == "bfloat16"
    assert report.unexpected == []
    _check_streamed(model, report, p)
    handle = trash_panda.install_offload(model)
    try:
        ids = torch.randint(3, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(2)).to(device)
        mask = torch.ones_like(ids)
        with torch.no_grad():
            want = ref(input_ids=ids, attention_mask=mask).logits
            got = model(input_ids=ids, attention_mask=mask).logits
        assert torch.equal(got, want)
        _ran_streamed(handle, p, passes=1)
        gen = {"max_new_tokens": 8, "min_new_tokens": 8, "do_sample": False, "use_cache": True}
        assert torch.equal(
            model.generate(input_ids=ids, attention_mask=mask, **gen),
            ref.generate(input_ids=ids, attention_mask=mask, **gen),
        )
    finally:
        trash_panda.release(model, handle)
