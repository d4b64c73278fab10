"""transformers' assisted generation with both models streamed by ``from_pretrained``: the
draft loaded first, then its target planned ``beside`` it for what the budget has left. The
tokens equal the plain models' (bf16, greedy) on budgets where both fit, where only the draft
does, and where neither does, and the two plans hold no more than the budget together."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

import trash_panda as tp
from support.hf_folders import make_llama
from trash_panda import Tier
from trash_panda.errors import ArgumentError

pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM

NEW_TOKENS = 12


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("assisted")
    target = make_llama(root / "target", layers=6)
    draft = make_llama(root / "draft", layers=3)
    for f in target.glob("tokenizer*"):  # one tokenizer for both, as a real pair has
        shutil.copy(f, draft / f.name)
    return target, draft


def _ids() -> torch.Tensor:
    return torch.tensor([[1, 17, 42, 7, 99, 5]])


def _generate(target: torch.nn.Module, draft: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return target.generate(  # type: ignore[no-any-return, operator]
            _ids(), assistant_model=draft, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0
        )


@pytest.fixture(scope="module")
def plain(pair: tuple[Path, Path]) -> torch.Tensor:
    target, draft = (AutoModelForCausalLM.from_pretrained(p, dtype=torch.bfloat16).eval() for p in pair)
    return _generate(target, draft)


def _holds(folder: Path, ram: int | str) -> int:
    model = tp.from_pretrained(AutoModelForCausalLM, folder, ram=ram, min_free_ram=0, device="cpu")
    try:
        state = tp.offload.state.get_state(model)
        assert state is not None
        return int(state.plan.holds("m").ram)
    finally:
        tp.release(model)


@pytest.mark.parametrize("fits", ["both", "draft", "neither"])
def test_assisted_generation_with_the_draft_planned_first(
    pair: tuple[Path, Path], plain: torch.Tensor, fits: str
) -> None:
    target_dir, draft_dir = pair
    full = {"target": _holds(target_dir, "1GB"), "draft": _holds(draft_dir, "1GB")}
    least = {"target": _holds(target_dir, 0), "draft": _holds(draft_dir, 0)}
    total = {"both": None, "draft": full["draft"] + least["target"] + 64 * 1024}[fits] if fits != "neither" else None
    draft_ram = total
    if fits == "neither":
        draft_ram = least["draft"] + (full["draft"] - least["draft"]) // 2
        total = draft_ram + least["target"] + 64 * 1024
    options = {"min_free_ram": 0, "device": "cpu"}
    draft = tp.from_pretrained(AutoModelForCausalLM, draft_dir, ram=draft_ram, **options)
    target = tp.from_pretrained(AutoModelForCausalLM, target_dir, ram=total, beside=[draft], **options)
    try:
        for _ in range(2):
            assert torch.equal(_generate(target, draft), plain)
        plans = {name: tp.offload.state.get_state(m).plan for name, m in (("draft", draft), ("target", target))}  # type: ignore[union-attr]
        tiers = {name: {b.tier for b in p.blocks} for name, p in plans.items()}
        if fits in ("both", "draft"):
            assert tiers["draft"] == {Tier.DEVICE}, plans["draft"].table()  # every block of the draft resident
        if fits in ("draft", "neither"):
            assert tiers["target"] != {Tier.DEVICE}
            assert total is not None
            assert sum(p.holds("m").ram for p in plans.values()) <= total
        if fits == "neither":
            assert tiers["draft"] != {Tier.DEVICE}
    finally:
        tp.release(target)
        tp.release(draft)


def test_beside_takes_models_loaded_by_trash_panda(pair: tuple[Path, Path]) -> None:
    plain_model = AutoModelForCausalLM.from_pretrained(pair[1])
    with pytest.raises(ArgumentError, match="is not loaded by it"):
        tp.from_pretrained(AutoModelForCausalLM, pair[0], beside=[plain_model])
    with pytest.raises(ArgumentError, match="beside: expected a list"):
        tp.from_pretrained(AutoModelForCausalLM, pair[0], beside=plain_model)  # type: ignore[arg-type]
