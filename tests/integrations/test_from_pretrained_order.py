"""from_pretrained(overlap=True) loads as stage(overlap=True) does: an order file next to the
checkpoint that places the final norm and the head after the blocks has them read by the loader
thread at their place, after the first block started, with the plain model's logits; the file
is only read (a bad one warns so), and with order= every outside weight is read first, as before."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import trash_panda
from conftest import ReadsWith
from support.hf_folders import llama_config, randomize, save_sharded
from support.outside_loads import OutsideLoads
from trash_panda import Plan

transformers = pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM, LlamaForCausalLM  # noqa: E402

LAYERS = 4
BLOCKS = [f"model.layers.{i}." for i in range(LAYERS)]
IDS = torch.randint(3, 300, (2, 7), generator=torch.Generator().manual_seed(3))
# The embedding is a lookup table, left mapped by the load: the outside weights read are these.
LATER = ["lm_head.weight", "model.norm.weight"]
# Two blocks resident (read by the loader) and two streamed, sharing its read queue.
PLAN = Plan.manual(resident=BLOCKS[:2], streamed=BLOCKS[2:])


@pytest.fixture(scope="module")
def untied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama with its own head (a tied one is needed with the embedding, before the first block)."""
    folder = tmp_path_factory.mktemp("untied")
    model = LlamaForCausalLM._from_config(llama_config(layers=LAYERS, vocab=320), dtype=torch.bfloat16).eval()
    randomize(model)
    save_sharded(model, folder)
    return folder


@pytest.fixture
def order_file(untied: Path) -> Path:
    """The order file a stage() of this checkpoint writes, made by trace_order (the same file)."""
    ckpt = trash_panda.hf.checkpoint_of(untied)
    found = untied / "model_order.json"
    found.unlink(missing_ok=True)
    model, _ = trash_panda.hf.build_empty(LlamaForCausalLM, untied, trash_panda.Checkpoint(ckpt), None)
    assert trash_panda.trace_order(model, input_ids=IDS, write_to=ckpt) == BLOCKS
    placed = json.loads(found.read_text())["outside"]
    assert placed == {"model.embed_tokens": 0, "model.norm": LAYERS, "lm_head": LAYERS}
    return found


@pytest.fixture(scope="module")
def plain_logits(untied: Path) -> torch.Tensor:
    plain = AutoModelForCausalLM.from_pretrained(untied).eval()
    with torch.no_grad():
        logits: torch.Tensor = plain(input_ids=IDS).logits
    return logits


class Loads(OutsideLoads):
    """The watch of :mod:`outside_loads`, for this file's models."""

    def logits(self, folder: Path, **kwargs: Any) -> torch.Tensor:
        model = trash_panda.from_pretrained(
            AutoModelForCausalLM, folder, device="cpu", plan=PLAN, overlap=True, **kwargs
        )
        try:
            model.model.layers[0].register_forward_pre_hook(lambda _m, _a: self.first_block.set())
            with torch.no_grad():
                out: torch.Tensor = model(input_ids=IDS).logits
        finally:
            trash_panda.release(model)
        return out


def test_the_head_placed_after_the_blocks_is_read_after_the_first_block_starts(
    loader_reads: ReadsWith, untied: Path, order_file: Path, plain_logits: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = order_file.read_bytes()
    loads = Loads(loader_reads)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a usable file warns about nothing
        got = loads.logits(untied)
    assert loads.calls == [(LAYERS, LATER, True)]
    assert torch.equal(got, plain_logits)
    assert order_file.read_bytes() == before  # read, never written


def test_with_order_every_outside_weight_is_read_first(
    loader_reads: ReadsWith, untied: Path, order_file: Path, plain_logits: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    loads = Loads(loader_reads)
    got = loads.logits(untied, order=BLOCKS)
    assert loads.calls == [(None, LATER, False)]
    assert torch.equal(got, plain_logits)
    assert order_file.is_file()


def test_an_old_file_reads_and_stays_and_a_bad_one_warns_it_is_only_read(
    loader_reads: ReadsWith, untied: Path, order_file: Path, plain_logits: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the writer before outside positions wrote: a stage() would add them on release.
    text = json.loads(order_file.read_text())
    del text["outside"]
    order_file.write_text(json.dumps(text))
    before = order_file.read_bytes()
    loads = Loads(loader_reads)
    assert torch.equal(loads.logits(untied), plain_logits)
    assert loads.calls == [(None, LATER, False)]
    assert order_file.read_bytes() == before

    order_file.write_text("{not json")
    loads = Loads(loader_reads)
    with pytest.warns(UserWarning, match=r"model_order.json ignored: .*only read here, not replaced"):
        got = loads.logits(untied)
    assert torch.equal(got, plain_logits)
    assert order_file.read_text() == "{not json"


def test_without_overlap_the_file_is_not_read(untied: Path, order_file: Path, plain_logits: torch.Tensor) -> None:
    order_file.write_text("{not json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = trash_panda.from_pretrained(AutoModelForCausalLM, untied, device="cpu", plan=PLAN)
    try:
        with torch.no_grad():
            assert torch.equal(model(input_ids=IDS).logits, plain_logits)
    finally:
        trash_panda.release(model)
