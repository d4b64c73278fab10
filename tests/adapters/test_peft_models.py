"""PEFT's own calls on a model from trash_panda.from_pretrained: PeftModel.from_pretrained, a
second adapter, merge_adapter and unmerge_adapter give the logits the plain model gives with the
same calls, in bf16, with blocks on every tier and in a final pass; unmerge_adapter gives back
the checkpoint's exact bits. PEFT imported after the model was streamed is patched too."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import trash_panda
from support.adapters import llama_lora
from support.hf_folders import make_llama
from trash_panda import Plan, Tier
from trash_panda.offload.state import get_state

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from peft import PeftModel  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

LAYERS = 6
PLANS = {
    "every_tier": lambda: Plan.manual(
        resident=["model.layers.0.", "model.layers.1."], streamed=[f"model.layers.{i}." for i in range(2, LAYERS)]
    ).assign(Tier.DISK, indices=[3, 5]),
    "ram": lambda: Plan.manual(resident=[], streamed=[f"model.layers.{i}." for i in range(LAYERS)]),
    "disk": lambda: Plan.manual(resident=[], streamed=[f"model.layers.{i}." for i in range(LAYERS)]).assign(
        Tier.DISK, indices=list(range(LAYERS))
    ),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = make_llama(tmp_path_factory.mktemp("llama"), LAYERS)
    return {
        "model": base,
        "a": llama_lora(base, tmp_path_factory.mktemp("lora_a"), rank=4, seed=20),
        "b": llama_lora(base, tmp_path_factory.mktemp("lora_b"), rank=8, seed=21),
    }


def _ids() -> torch.Tensor:
    return torch.randint(3, 300, (2, 9), generator=torch.Generator().manual_seed(3))


def _steps(folders: dict[str, Path]) -> list[tuple[str, Callable[[Any], Any]]]:
    """Each step takes the model (then the PeftModel) and returns what the next step takes."""

    def second(m: Any) -> Any:
        m.load_adapter(folders["b"], adapter_name="b")
        m.set_adapter("b")
        return m

    def merge(m: Any) -> Any:
        m.merge_adapter()
        return m

    def unmerge(m: Any) -> Any:
        m.unmerge_adapter()
        return m

    return [
        ("from_pretrained", lambda m: PeftModel.from_pretrained(m, folders["a"], adapter_name="a")),
        ("second adapter", second),
        ("merge_adapter", merge),
        ("unmerge_adapter", unmerge),
    ]


@pytest.fixture(scope="module")
def plain_logits(folders: dict[str, Path]) -> dict[str, torch.Tensor]:
    model: Any = AutoModelForCausalLM.from_pretrained(folders["model"]).eval()
    with torch.no_grad():
        out = {"none": model(_ids()).logits}
        for name, step in _steps(folders):
            model = step(model)
            out[name] = model(_ids()).logits
    return out


def _merged_and_unmerged(folders: dict[str, Path], only: list[str]) -> torch.Tensor:
    """The plain model's logits after the steps up to the second adapter, then a merge and an
    unmerge of the layers under ``only`` alone."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    model: Any = AutoModelForCausalLM.from_pretrained(folders["model"]).eval()
    for name, step in _steps(folders):
        if name == "merge_adapter":
            break
        model = step(model)
    for name, layer in model.base_model.model.named_modules():
        if isinstance(layer, BaseTunerLayer) and any(name.startswith(p) for p in only):
            layer.merge()
            layer.unmerge()
    with torch.no_grad():
        logits: torch.Tensor = model(_ids()).logits
    return logits


@pytest.mark.parametrize("plan", list(PLANS))
def test_peft_calls_equal_plain(folders: dict[str, Path], plain_logits: dict[str, torch.Tensor], plan: str) -> None:
    assert plain_logits["none"].dtype == torch.bfloat16
    assert not torch.equal(plain_logits["from_pretrained"], plain_logits["none"])
    assert not torch.equal(plain_logits["second adapter"], plain_logits["from_pretrained"])
    model: Any = trash_panda.from_pretrained(AutoModelForCausalLM, folders["model"], device="cpu", plan=PLANS[plan]())
    base = model
    try:
        with torch.no_grad():
            assert torch.equal(model(_ids()).logits, plain_logits["none"])
            for name, step in _steps(folders):
                model = step(model)
                logits = model(_ids()).logits
                if name == "unmerge_adapter":
                    # The exact bits back: the streamed layers stage the checkpoint's again, and
                    # the resident ones (merged by PEFT in place) get theirs back from it, where
                    # the plain model subtracts what it added.
                    assert torch.equal(logits, plain_logits["second adapter"])
                    if plan == "every_tier":
                        inexact = _merged_and_unmerged(folders, ["model.layers.0.", "model.layers.1."])
                        assert not torch.equal(inexact, plain_logits["second adapter"])
                else:
                    assert torch.equal(logits, plain_logits[name]), name
            # A final pass frees each block after it runs; the adapters stay.
            handle = get_state(base).handle
            with handle.final_pass():
                last = model(_ids()).logits
            assert torch.equal(last, logits)
    finally:
        trash_panda.release(base)


def test_peft_imported_after_the_model_is_patched(folders: dict[str, Path], tmp_path: Path) -> None:
    """A process that streams the model first and imports PEFT afterwards: the adapter lands on
    the model's device (not the meta device) and the logits are the plain model's."""
    script = textwrap.dedent(f"""
        import sys, torch
        import trash_panda
        from transformers import AutoModelForCausalLM
        assert "peft" not in sys.modules
        ids = torch.randint(3, 300, (2, 9), generator=torch.Generator().manual_seed(3))
        model = trash_panda.from_pretrained(AutoModelForCausalLM, {str(folders["model"])!r}, device="cpu",
                                            resident_blocks=0, vram="1TB", ram="1TB")
        from peft import PeftModel
        streamed = PeftModel.from_pretrained(model, {str(folders["a"])!r})
        plain = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained({str(folders["model"])!r}),
                                          {str(folders["a"])!r})
        with torch.no_grad():
            same = torch.equal(streamed(ids).logits, plain(ids).logits)
        trash_panda.release(model)
        print("same" if same else "different")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "same", r.stdout
