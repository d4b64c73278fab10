"""trash_panda.from_pretrained on sharded transformers folders: generate() (greedy and sampled),
pipeline("text-generation") and an encoder give exactly the plain model's outputs, with blocks
on every tier; .to(), release() and the arguments' errors."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch

import trash_panda
from conftest import ReadsWith
from support.hf_folders import make_llama, randomize, save_sharded
from trash_panda import Plan, Tier

transformers = pytest.importorskip("transformers")

from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM  # noqa: E402

LAYERS = 6
NEW = 12
# The CPU always; a CUDA GPU where there is one (the plain model runs there too).
DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
    ),
]


def _every_tier_plan(prefix: str, layers: int) -> Plan:
    names = [f"{prefix}{i}." for i in range(layers)]
    p = Plan.manual(resident=names[:2], streamed=names[2:], streamed_tier="ram")
    return p.assign(Tier.DISK, indices=list(range(3, layers, 2)))


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_llama(tmp_path_factory.mktemp("llama"), LAYERS)


def _streamed(folder: Path, device: str = "cpu") -> torch.nn.Module:
    return trash_panda.from_pretrained(
        AutoModelForCausalLM, folder, device=device, plan=_every_tier_plan("model.layers.", LAYERS)
    )


@pytest.mark.parametrize("device", DEVICES)
def test_causal_lm_generate_and_pipeline_equal_plain(llama_folder: Path, device: str) -> None:
    tok = AutoTokenizer.from_pretrained(llama_folder)
    plain = AutoModelForCausalLM.from_pretrained(llama_folder).eval().to(device)
    model = _streamed(llama_folder, device)
    try:
        assert type(model) is LlamaForCausalLM
        assert model.device == plain.device and model.dtype == plain.dtype == torch.bfloat16
        assert model.config.num_hidden_layers == LAYERS and model.config.tie_word_embeddings
        assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied
        # Every tier in use, and the streamed blocks hold no weights between runs.
        tiers = {b.tier for b in trash_panda.offload.state.get_state(model).plan.blocks}  # type: ignore[union-attr]
        assert tiers == {Tier.DEVICE, Tier.RAM, Tier.DISK}
        assert all(p.is_meta for p in model.model.layers[3].parameters())

        inputs = tok(["the raccoon streams", "a plan says which block"], return_tensors="pt", padding=True).to(device)
        greedy = {"max_new_tokens": NEW, "min_new_tokens": NEW, "do_sample": False, "use_cache": True}
        want = plain.generate(**inputs, **greedy)
        got = model.generate(**inputs, **greedy)
        assert want.shape[1] == inputs["input_ids"].shape[1] + NEW
        assert torch.equal(got, want)
        with torch.inference_mode():  # as many users run it
            assert torch.equal(model.generate(**inputs, **greedy), want)

        sampled = {"max_new_tokens": NEW, "do_sample": True, "top_k": 50, "temperature": 1.3, "use_cache": True}
        torch.manual_seed(7)
        want = plain.generate(**inputs, **sampled)
        torch.manual_seed(7)
        got = model.generate(**inputs, **sampled)
        assert torch.equal(got, want)
        torch.manual_seed(8)
        assert not torch.equal(plain.generate(**inputs, **sampled), want)  # the seed matters

        args = {"max_new_tokens": NEW, "do_sample": False}
        want_text = transformers.pipeline("text-generation", model=plain, tokenizer=tok)("the raccoon", **args)
        got_text = transformers.pipeline("text-generation", model=model, tokenizer=tok)("the raccoon", **args)
        assert got_text == want_text
        assert len(want_text[0]["generated_text"]) > len("the raccoon")
    finally:
        trash_panda.release(model)
    with pytest.raises(trash_panda.TrashPandaError, match="released"):
        model(input_ids=torch.ones(1, 3, dtype=torch.long))


def test_to_is_a_no_op_or_a_clear_error(llama_folder: Path) -> None:
    model = _streamed(llama_folder)
    try:
        assert model.to("cpu") is model
        assert model.to(torch.bfloat16) is model
        assert model.cpu() is model
        with pytest.raises(trash_panda.TrashPandaError, match=r"cannot be moved to .*float16.*release\(\)"):
            model.half()
        with pytest.raises(trash_panda.TrashPandaError, match="cannot be moved to meta"):
            model.to("meta")
    finally:
        trash_panda.release(model)


def test_plan_and_load_go_to_the_trash_panda_logger(llama_folder: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="trash_panda")
    model = trash_panda.from_pretrained(
        LlamaForCausalLM, llama_folder, device="cpu", vram="1TB", ram="1TB", headroom_vram=0
    )
    trash_panda.release(model)
    messages = [r.getMessage() for r in caplog.records if r.name == "trash_panda"]
    assert any(m.startswith(f"plan for {llama_folder}:") and "model.layers.0-5" in m for m in messages), messages
    assert any(m.startswith("stream_load ") and "-> cpu (bfloat16)" in m for m in messages), messages
    warned = [r.getMessage() for r in caplog.records if r.name == "trash_panda" and r.levelno == logging.WARNING]
    assert any("activation memory not measured" in m for m in warned), warned
    assert not any("activation memory not measured" in m for m in messages if m.startswith("plan for "))


def test_encoder_model_every_tier_equals_plain(tmp_path: Path) -> None:
    from transformers import BertConfig, BertModel

    cfg = BertConfig(
        hidden_size=32,
        num_hidden_layers=5,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=300,
        max_position_embeddings=64,
    )
    ref = BertModel(cfg).eval()
    randomize(ref)
    save_sharded(ref, tmp_path, "40KB")
    plain = AutoModel.from_pretrained(tmp_path).eval()
    model = trash_panda.from_pretrained(
        AutoModel, tmp_path, device="cpu", plan=_every_tier_plan("encoder.layer.", cfg.num_hidden_layers)
    )
    try:
        assert type(model) is BertModel and model.dtype == torch.float32
        ids = torch.randint(3, cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(2))
        mask = torch.ones_like(ids)
        mask[1, 6:] = 0
        with torch.no_grad():
            want = plain(input_ids=ids, attention_mask=mask)
            got = model(input_ids=ids, attention_mask=mask)
        assert torch.equal(got.last_hidden_state, want.last_hidden_state)
        assert torch.equal(got.pooler_output, want.pooler_output)
    finally:
        trash_panda.release(model)


def test_arguments_are_checked(tmp_path: Path, llama_folder: Path) -> None:
    with pytest.raises(trash_panda.ArgumentError, match="cls: expected a transformers model class"):
        trash_panda.from_pretrained("llama", llama_folder)
    with pytest.raises(trash_panda.ArgumentError, match="is not a folder"):
        trash_panda.from_pretrained(AutoModelForCausalLM, tmp_path / "missing")
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(trash_panda.ArgumentError, match="no model.safetensors.*pytorch_model.bin"):
        trash_panda.from_pretrained(AutoModelForCausalLM, tmp_path)
    with pytest.raises(trash_panda.ArgumentError, match="plan: given with planning options \\(max_vram\\)"):
        trash_panda.from_pretrained(
            AutoModelForCausalLM, llama_folder, plan=_every_tier_plan("model.layers.", LAYERS), max_vram="1GB"
        )


def test_generate_command_prints_tokens_and_summary(llama_folder: Path, tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    plan_file = tmp_path / "plan.json"
    _every_tier_plan("model.layers.", LAYERS).save(plan_file)
    ids_file = tmp_path / "ids.json"
    env = {**os.environ, "PYTHONPATH": str(Path(trash_panda.__file__).parent.parent)}
    cmd = [sys.executable, "-m", "trash_panda.cli", "generate", str(llama_folder), "--prompt", "the raccoon"]
    opts = ["--max-new-tokens", str(NEW), "--plan", str(plan_file), "--device", "cpu", "--save-ids", str(ids_file)]
    r = subprocess.run([*cmd, *opts], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr

    tok = AutoTokenizer.from_pretrained(llama_folder)
    plain = AutoModelForCausalLM.from_pretrained(llama_folder).eval()
    inputs = tok("the raccoon", return_tensors="pt")
    want = plain.generate(**inputs, max_new_tokens=NEW, do_sample=False)[0, inputs["input_ids"].shape[1] :]
    saved = json.loads(ids_file.read_text())
    assert saved["prompt"] == inputs["input_ids"][0].tolist()
    assert saved["generated"] == want.tolist()
    assert r.stdout == "the raccoon" + tok.decode(want, skip_special_tokens=True) + "\n"
    assert f"{NEW} tokens in " in r.stderr and " per token" in r.stderr
    assert re.search(r"disk tier \((buffered|direct) reads\): 0\.00 GB read", r.stderr), r.stderr
    assert "waited for blocks:" in r.stderr
    assert "plan for" not in r.stderr  # a plan given is not planned again
    assert "stream_load " in r.stderr  # the load summary, through the logger

    bad = subprocess.run([*cmd, "--plan", str(plan_file), "--ram", "1GB"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "--plan replaces the planning options" in bad.stderr


@pytest.mark.parametrize("form", ["folder", "index"])
def test_plan_and_stream_load_take_a_sharded_folder(llama_folder: Path, form: str) -> None:
    """The entry points below from_pretrained take the shards as a folder or as their index."""
    path = llama_folder if form == "folder" else llama_folder / "model.safetensors.index.json"
    plain = AutoModelForCausalLM.from_pretrained(llama_folder).eval()
    model, _ = trash_panda.hf.build_empty(LlamaForCausalLM, llama_folder, trash_panda.Checkpoint(path), None)
    p = trash_panda.plan(model, path, vram="1TB", ram="1TB", resident_blocks=2, headroom_vram=0, device="cpu")
    assert len(p.blocks) == LAYERS
    report = trash_panda.stream_load(model, path, plan=p, device="cpu")
    assert report.ram.blocks == LAYERS - 2 and report.unexpected == []
    handle = trash_panda.install_offload(model)
    try:
        ids = torch.randint(3, 300, (1, 7), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            assert torch.equal(model(input_ids=ids).logits, plain(input_ids=ids).logits)
    finally:
        trash_panda.release(model, handle)


def test_overlap_returns_before_the_resident_blocks_are_read(
    loader_reads: ReadsWith, llama_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """overlap=True: the call returns with the resident blocks still unread; the first forward
    waits for each, and the output is the plain model's. Released mid-load, the thread stops."""
    import threading

    from trash_panda.offload import overlap

    gate = threading.Event()
    real = overlap.load_block

    def slow(*args: object, **kwargs: object) -> None:
        gate.wait(timeout=30)
        real(*args, **kwargs)  # type: ignore[arg-type]

    loader_reads(block=slow)
    tok = AutoTokenizer.from_pretrained(llama_folder)
    plain = AutoModelForCausalLM.from_pretrained(llama_folder).eval()
    inputs = tok(["the raccoon streams"], return_tensors="pt")
    greedy = {"max_new_tokens": NEW, "min_new_tokens": NEW, "do_sample": False, "use_cache": True}
    plan = _every_tier_plan("model.layers.", LAYERS)
    model = trash_panda.from_pretrained(AutoModelForCausalLM, llama_folder, device="cpu", plan=plan, overlap=True)
    try:
        assert all(p.is_meta for p in model.model.layers[0].parameters())  # resident, not read yet
        gate.set()
        assert torch.equal(model.generate(**inputs, **greedy), plain.generate(**inputs, **greedy))
        assert not any(p.is_meta for p in model.model.layers[0].parameters())
    finally:
        trash_panda.release(model)

    gate.clear()
    model = trash_panda.from_pretrained(AutoModelForCausalLM, llama_folder, device="cpu", plan=plan, overlap=True)
    loader = trash_panda.offload.state.get_state(model).handle.hooks.get("overlap_wait").loader  # type: ignore[union-attr]
    gate.set()
    trash_panda.release(model)  # while the loader may still be reading
    assert not loader._thread.is_alive()
    with pytest.raises(trash_panda.TrashPandaError, match="released"):
        model(input_ids=torch.ones(1, 3, dtype=torch.long))
    with pytest.raises(trash_panda.ArgumentError, match="overlap: expected True or False"):
        trash_panda.from_pretrained(AutoModelForCausalLM, llama_folder, overlap="yes")  # type: ignore[arg-type]
