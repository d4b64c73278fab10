"""GGUF models streamed compact: a tiny Llama written as GGUF (Q8_0, Q4_0 and K-quants) gives the
logits of transformers' own ``gguf_file=`` load (which dequantizes through the ``gguf`` package)
bit for bit, and the same greedy tokens, with blocks on every tier."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import trash_panda
from support.gguf_models import LLAMA, write_llama
from support.simdevice import SimulatedDevice
from trash_panda import Plan, Tier

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

from transformers import AutoModelForCausalLM  # noqa: E402


def _every_tier_plan(layers: int) -> Plan:
    names = [f"model.layers.{i}." for i in range(layers)]
    p = Plan.manual(resident=names[:1], streamed=names[1:], streamed_tier="ram")
    return p.assign(Tier.DISK, indices=list(range(2, layers, 2)))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_K", "Q5_K"])
def test_logits_and_tokens_equal_transformers_gguf_load(tmp_path: Path, qtype: str) -> None:
    path = write_llama(tmp_path / f"tiny-{qtype}.gguf", qtype)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.bfloat16).eval()
    model = trash_panda.from_pretrained(
        AutoModelForCausalLM, tmp_path, gguf_file=path.name, plan=_every_tier_plan(LLAMA["layers"])
    )
    try:
        assert model.dtype == torch.bfloat16
        state = trash_panda.offload.state.get_state(model)
        assert state is not None
        assert {b.tier for b in state.plan.blocks} == {Tier.DEVICE, Tier.RAM, Tier.DISK}
        ids = torch.randint(0, LLAMA["vocab"], (2, 9), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            want = plain(ids).logits
            got = model(ids).logits
        assert torch.equal(got, want)
        greedy = {"max_new_tokens": 6, "min_new_tokens": 6, "do_sample": False}
        assert torch.equal(model.generate(ids, **greedy), plain.generate(ids, **greedy))
    finally:
        trash_panda.release(model)


def test_the_device_path_expands_gguf_blocks_as_the_cpu(tmp_path: Path, sim: SimulatedDevice) -> None:
    # A GPU-shaped plan run through the CUDA backend's code on the simulated device: staged
    # compact blocks copied to device slots and expanded there by the torch path, the attention
    # projections' rows reordered as they are written.
    from transformers import AutoConfig

    from trash_panda.checkpoint import Checkpoint
    from trash_panda.gguf_names import gguf_tensor_map
    from trash_panda.offload import empty_weights
    from trash_panda.offload.backends.cuda import DeviceBackend
    from trash_panda.offload.handle import _install
    from trash_panda.offload.state import get_state

    path = write_llama(tmp_path / "tiny.gguf", "Q4_K")
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.bfloat16).eval()
    ckpt = Checkpoint(path)
    config = AutoConfig.from_pretrained(tmp_path, gguf_file=path.name)
    with empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    names = gguf_tensor_map(model, ckpt)
    reordered = {k for k, v in names.views.items() if v[0].order is not None}
    assert reordered == {f"blk.{i}.attn_{p}.weight" for i in range(LLAMA["layers"]) for p in "qk"}
    p = trash_panda.plan(model, ckpt, vram="1TB", ram="1TB", resident_blocks=1, key_map=names)
    p.assign(Tier.DISK, indices=[2, 3])
    trash_panda.stream_load(model, ckpt, plan=p, device="cpu", key_map=names)
    state = get_state(model)
    assert state is not None
    handle = _install(model, state, state.blocks, None, lambda s: DeviceBackend(s, sim))
    try:
        ids = torch.randint(0, LLAMA["vocab"], (2, 9), generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            assert torch.equal(model(ids).logits, plain(ids).logits)
    finally:
        handle.remove()
        trash_panda.release(model)


def test_a_lora_on_a_q4_k_model_equals_the_plain_model_with_it(tmp_path: Path) -> None:
    # The adapter runs unmerged on the expanded Q4_K weights, then merged (PEFT's merge_adapter):
    # both as on transformers' dequantized model.
    pytest.importorskip("peft")
    from peft import LoraConfig, PeftModel, get_peft_model

    path = write_llama(tmp_path / "tiny.gguf", "Q4_K")
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.bfloat16).eval()
    torch.manual_seed(5)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    get_peft_model(plain, cfg).save_pretrained(tmp_path / "lora")
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.bfloat16).eval()
    ref = PeftModel.from_pretrained(plain, tmp_path / "lora")
    model = trash_panda.from_pretrained(
        AutoModelForCausalLM, tmp_path, gguf_file=path.name, plan=_every_tier_plan(LLAMA["layers"])
    )
    try:
        ours = PeftModel.from_pretrained(model, tmp_path / "lora")
        ids = torch.randint(0, LLAMA["vocab"], (2, 9), generator=torch.Generator().manual_seed(4))
        with torch.no_grad():
            assert torch.equal(ours(ids).logits, ref(ids).logits)
            ref.merge_adapter()
            ours.merge_adapter()
            assert torch.equal(ours(ids).logits, ref(ids).logits)
            assert torch.equal(ours(ids).logits, ref(ids).logits)  # a second pass, merges kept
    finally:
        trash_panda.release(model)


def test_the_generate_command_on_a_gguf_file(tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    from transformers import AutoTokenizer

    from support.hf_folders import TEXT, train_tokenizer

    train_tokenizer(tmp_path, 300, TEXT)
    path = write_llama(tmp_path / "tiny.gguf", "Q4_K", vocab=320)
    ids_file = tmp_path / "ids.json"
    env = {**os.environ, "PYTHONPATH": str(Path(trash_panda.__file__).parent.parent)}
    cmd = [sys.executable, "-m", "trash_panda.cli", "generate", str(tmp_path), "--gguf-file", path.name]
    opts = ["--prompt", "the raccoon", "--max-new-tokens", "5", "--device", "cpu", "--save-ids", str(ids_file)]
    r = subprocess.run([*cmd, *opts], capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr
    tok = AutoTokenizer.from_pretrained(tmp_path)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.bfloat16).eval()
    inputs = tok("the raccoon", return_tensors="pt")
    want = plain.generate(**inputs, max_new_tokens=5, min_new_tokens=5, do_sample=False)[
        0, inputs["input_ids"].shape[1] :
    ]
    assert json.loads(ids_file.read_text())["generated"] == want.tolist()


def test_a_bad_gguf_file_is_a_clear_error(tmp_path: Path) -> None:
    # Cut in its data, or with a tensor of a type not supported yet: the file and the tensor
    # are named, and nothing is left half-loaded.
    path = write_llama(tmp_path / "tiny.gguf", "Q8_0")
    data = path.read_bytes()
    cut = tmp_path / "cut" / "tiny.gguf"
    cut.parent.mkdir()
    cut.write_bytes(data[: len(data) - 1000])
    with pytest.raises(trash_panda.CheckpointError, match=r"tiny\.gguf.*reach past its end"):
        trash_panda.from_pretrained(AutoModelForCausalLM, cut.parent, gguf_file=cut.name)
    with pytest.raises(trash_panda.ArgumentError, match="is not one"):
        trash_panda.from_pretrained(AutoModelForCausalLM, tmp_path, gguf_file="missing.gguf")
