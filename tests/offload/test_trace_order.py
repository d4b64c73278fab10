"""trace_order(): the run order found on the meta device equals the order a real run records,
the file it writes is the one a real run writes, and the model is left as it was."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_model
from torch import nn

import trash_panda as tp
from support.hf_folders import TINY_UNET
from support.models import Block, Tiny, save
from trash_panda.offload.state import get_state


class TextFirst(nn.Module):
    """The shape of Flux: main blocks defined first, text blocks after them, and the text blocks
    run first (their output conditions the main ones)."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.img_in = nn.Linear(dim, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(4))
        self.text_blocks = nn.ModuleList(Block(dim) for _ in range(2))
        self.final = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, text: torch.Tensor | None = None) -> torch.Tensor:
        x = self.img_in(x)
        if text is not None:
            for b in self.text_blocks:
                text = b(text)
            x = x + text.mean(dim=1, keepdim=True)
        for b in self.blocks:
            x = b(x)
        out: torch.Tensor = self.final(x)
        return out


def build_text_first() -> nn.Module:
    with tp.empty_weights():
        return TextFirst()


X = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(1))
T = torch.randn(2, 3, 32, generator=torch.Generator().manual_seed(2))
DEFINED = [f"blocks.{i}." for i in range(4)] + ["text_blocks.0.", "text_blocks.1."]
RUN = ["text_blocks.0.", "text_blocks.1.", *DEFINED[:4]]
ORDER_WARNING = "ran before the order given"


@pytest.fixture
def text_first(tmp_path: Path) -> tuple[Path, nn.Module]:
    torch.manual_seed(0)
    ref = TextFirst().eval()
    folder = tmp_path / "ckpt"
    folder.mkdir()
    return save(ref, folder / "model.safetensors"), ref


def real_run(
    build: Callable[[], nn.Module], path: Path, *args: Any, **kwargs: Any
) -> tuple[list[str], list[str], list[torch.Tensor]]:
    """One stage of ``path``, one call: the order its hooks recorded, the warnings, the output."""
    outputs = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tp.stage(build, path, device="cpu", resident_blocks=2) as (model, _p, handle), torch.no_grad():
            outputs.append(_output(model(*args, **kwargs)))
            ran = list(handle.ran)
    return ran, [str(w.message) for w in caught], outputs


def _output(out: object) -> torch.Tensor:
    for field in ("logits", "sample"):
        if hasattr(out, field):
            got = getattr(out, field)
            assert isinstance(got, torch.Tensor)
            return got
    assert isinstance(out, torch.Tensor)
    return out


# --- (a) a Flux-shaped model ------------------------------------------------------------------------


def test_the_traced_order_is_the_real_runs_and_so_is_the_file(
    text_first: tuple[Path, nn.Module], tmp_path: Path
) -> None:
    path, ref = text_first
    traced_folder = tmp_path / "traced"
    traced_folder.mkdir()
    traced = tp.trace_order(build_text_first(), X, T, write_to=path, order_file_destination=traced_folder)
    assert traced == RUN  # not the defined order
    assert tp.trace_order(ref, X, text=T) == RUN  # on the real weights too

    ran, messages, _ = real_run(build_text_first, path, X, T)
    assert ran == traced
    assert [m for m in messages if ORDER_WARNING in m]  # the real first run, without an order, warns
    written = path.parent / "model_order.json"  # written on release
    assert (traced_folder / "model_order.json").read_bytes() == written.read_bytes()
    # The input layer before the first block, the output layer after the last (the sixth).
    assert json.loads(written.read_text())["outside"] == {"img_in": 0, "final": 6}


def test_the_traced_order_makes_the_first_run_prefetch_in_run_order(text_first: tuple[Path, nn.Module]) -> None:
    path, ref = text_first
    with torch.no_grad():
        want = ref(X, T)
    traced = tp.trace_order(build_text_first(), X, T)
    ran, messages, (got,) = _staged_with_order(path, traced)
    assert not [m for m in messages if ORDER_WARNING in m]
    assert ran == RUN
    assert torch.equal(got, want)

    # The file it writes does the same without order=: the first run starts in the run order.
    assert tp.trace_order(build_text_first(), X, T, write_to=path) == RUN
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tp.stage(build_text_first, path, device="cpu", resident_blocks=2) as (model, _p, _h), torch.no_grad():
            state = get_state(model)
            assert state is not None and state.engine is not None
            streamed = [b.prefix for b in state.blocks if b.engine_index is not None]
            first = [streamed[i] for i in state.engine.order()]
            assert torch.equal(model(X, T), want)
    assert not [str(w.message) for w in caught if ORDER_WARNING in str(w.message)]
    assert first == [b for b in RUN if b in streamed]


def _staged_with_order(path: Path, order: list[str]) -> tuple[list[str], list[str], list[torch.Tensor]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tp.stage(build_text_first, path, order=order, device="cpu", resident_blocks=2) as (model, _p, handle):
            with torch.no_grad():
                got = model(X, T)
            ran = list(handle.ran)
    return ran, [str(w.message) for w in caught], [got]


def test_blocks_that_never_run_are_left_out_as_in_a_real_run(
    text_first: tuple[Path, nn.Module], tmp_path: Path
) -> None:
    path, _ref = text_first
    traced = tp.trace_order(build_text_first(), X, write_to=path, order_file_destination=tmp_path)
    assert traced == DEFINED[:4]
    ran, _, _ = real_run(build_text_first, path, X)
    assert ran == traced
    # Both files merge the blocks that ran into the model's order.
    assert (tmp_path / "model_order.json").read_bytes() == (path.parent / "model_order.json").read_bytes()


def test_a_right_file_is_left_as_it_is(text_first: tuple[Path, nn.Module]) -> None:
    path, _ref = text_first
    real_run(build_text_first, path, X, T)
    written = path.parent / "model_order.json"
    written.write_text(written.read_text().replace('"version"', '"note": "kept",\n  "version"'))
    assert tp.trace_order(build_text_first(), X, T, write_to=path) == RUN
    assert '"note": "kept"' in written.read_text()


# --- (b) transformers and diffusers models ----------------------------------------------------------


def _llama() -> tuple[Callable[[], nn.Module], dict[str, torch.Tensor]]:
    from transformers import LlamaForCausalLM

    from support.hf_folders import llama_config

    def build() -> nn.Module:
        model: nn.Module = LlamaForCausalLM._from_config(llama_config(layers=4)).eval()
        return model

    return build, {"input_ids": torch.randint(3, 256, (1, 7), generator=torch.Generator().manual_seed(3))}


def _gpt2() -> tuple[Callable[[], nn.Module], dict[str, torch.Tensor]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    def build() -> nn.Module:
        cfg = GPT2Config(n_embd=32, n_layer=4, n_head=2, vocab_size=100, n_positions=64, bos_token_id=1, eos_token_id=2)
        return GPT2LMHeadModel(cfg).eval()

    return build, {"input_ids": torch.randint(3, 100, (1, 7), generator=torch.Generator().manual_seed(3))}


def _unet() -> tuple[Callable[[], nn.Module], dict[str, torch.Tensor]]:
    from diffusers import UNet2DConditionModel

    def build() -> nn.Module:
        model: nn.Module = UNet2DConditionModel(**TINY_UNET).eval()
        return model

    g = torch.Generator().manual_seed(3)
    return build, {
        "sample": torch.randn(1, 4, 8, 8, generator=g),
        "timestep": torch.tensor([10]),
        "encoder_hidden_states": torch.randn(1, 7, 32, generator=g),
    }


@pytest.mark.parametrize("which", ["llama", "gpt2", "unet"])
def test_a_traced_order_equals_a_real_runs_for_library_models(which: str, tmp_path: Path) -> None:
    pytest.importorskip("transformers" if which != "unet" else "diffusers")
    make, inputs = {"llama": _llama, "gpt2": _gpt2, "unet": _unet}[which]()
    torch.manual_seed(0)
    ref = make()
    folder = tmp_path / "ckpt"
    folder.mkdir()
    path = folder / "model.safetensors"
    save_model(ref, str(path))  # drops GPT-2's tied copy of the embedding

    def build() -> nn.Module:
        with tp.empty_weights():
            return make()

    traced = tp.trace_order(build(), **inputs, write_to=path, order_file_destination=tmp_path)
    assert tp.trace_order(ref, **inputs) == traced  # real weights: the same order
    ran, _, (got,) = real_run(build, path, **inputs)
    assert ran == traced
    assert (tmp_path / "model_order.json").read_bytes() == (folder / "model_order.json").read_bytes()
    # Embeddings or input layers before the first block, a final norm or output layer after the last.
    places = json.loads((folder / "model_order.json").read_text())["outside"]
    assert min(places.values()) == 0 and max(places.values()) == len(traced)
    with torch.no_grad():
        assert torch.equal(got, _output(ref(**inputs)))  # the traced model computes as before
    if which == "unet":  # the mid block runs between the down and the up blocks it is defined after
        names = [b.prefix for b in tp.blocks.find_blocks(ref)]
        assert traced != names and traced[2].startswith("mid_block.")


# --- (c) the model is left as it was --------------------------------------------------------------


class Probe(Tiny):
    """Tiny, whose forward keeps a cache on itself, looks at the weights it is given, and raises
    on demand."""

    def __init__(self) -> None:
        super().__init__(dim=16, layers=3, vocab=50)
        self.register_buffer("scale", torch.ones(16))
        self.head.weight = self.embed.weight  # tied
        self.seen: list[torch.Tensor] = []
        self.fail: str | None = None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.seen.append(self.blocks[0].up.weight)
        self.cache = self.embed(ids)  # an attribute the call sets
        x = self.cache * self.scale
        for b in self.blocks:
            x = b(x)
            if self.fail == "values" and x.sum() > 0:
                x = -x
            if self.fail == "caller":
                raise ValueError("the caller's own error")
        out: torch.Tensor = self.head(self.norm(x))
        return out


def _snapshot(model: nn.Module) -> dict[str, Any]:
    return {
        "params": dict(model.named_parameters(remove_duplicate=False)),
        "values": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "buffers": dict(model.named_buffers()),
        "training": {n: m.training for n, m in model.named_modules()},
        "hooks": {
            n: (len(m._forward_pre_hooks), len(m._forward_hooks), len(m._backward_hooks))
            for n, m in model.named_modules()
        },
        "attrs": {n: set(m.__dict__) for n, m in model.named_modules()},
    }


def _assert_unchanged(model: nn.Module, before: dict[str, Any]) -> None:
    after = _snapshot(model)
    assert after["params"].keys() == before["params"].keys()
    assert all(after["params"][k] is v for k, v in before["params"].items())
    assert all(after["buffers"][k] is v for k, v in before["buffers"].items())
    assert all(torch.equal(after["values"][k], v) for k, v in before["values"].items())
    assert all(not p.is_meta for p in model.parameters())
    for key in ("training", "hooks", "attrs"):
        assert after[key] == before[key], key


@pytest.mark.parametrize("fail", [None, "values", "caller"])
def test_the_model_is_left_as_it_was(fail: str | None) -> None:
    torch.manual_seed(0)
    model = Probe()
    model.train()
    model.blocks[1].eval()  # a mixed state stays mixed
    ids = torch.randint(0, 50, (2, 4))
    with torch.no_grad():
        want = model.eval()(ids)
    model.train()
    model.blocks[1].eval()
    model.seen.clear()
    del model.cache
    model.fail = fail
    before = _snapshot(model)
    if fail == "values":
        with pytest.raises(tp.TraceError, match=r"Probe's forward needs tensor values at Tensor.__bool__"):
            tp.trace_order(model, ids)
    elif fail == "caller":
        with pytest.raises(ValueError, match="the caller's own error") as err:
            tp.trace_order(model, ids)
        assert not isinstance(err.value, tp.TraceError)
    else:
        assert tp.trace_order(model, ids) == ["blocks.0.", "blocks.1.", "blocks.2."]
    # The forward saw stand-ins, never the real weight (nothing was copied), and the tie held.
    assert model.seen and model.seen[-1] is not before["params"]["blocks.0.up.weight"]
    model.seen.clear()
    _assert_unchanged(model, before)
    assert model.head.weight is model.embed.weight
    model.fail = None
    with torch.no_grad():
        assert torch.equal(model.eval()(ids), want)


# --- (d) a forward that needs values ----------------------------------------------------------------


class DataDependent(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
            if self.how == "if" and x.sum() > 0:  # control flow on the data
                x = -x
            if self.how == "item":
                x = x * x.abs().max().item()
            if self.how == "mask":
                x = x + x[x > 0].sum()  # a shape that depends on the data
        return x


@pytest.mark.parametrize(
    ("how", "op"), [("if", "Tensor.__bool__"), ("item", "Tensor.item"), ("mask", "Tensor.__getitem__")]
)
def test_a_forward_that_needs_values_raises_a_clear_error(how: str, op: str) -> None:
    model = DataDependent(how)
    with torch.no_grad():
        model(torch.randn(2, 8))  # it runs for real
    with pytest.raises(tp.TraceError) as err:
        tp.trace_order(model, torch.randn(2, 8))
    message = str(err.value)
    assert isinstance(err.value, tp.TrashPandaError)
    assert "DataDependent's forward needs tensor values" in message
    assert f"at {op}," in message
    assert "run it once for real" in message
    assert all(not m._forward_pre_hooks for m in model.modules())


def test_the_arguments_are_checked(tmp_path: Path) -> None:
    model = TextFirst()
    with pytest.raises(tp.ArgumentError, match="expected a torch.nn.Module"):
        tp.trace_order("model", X)  # type: ignore[arg-type]
    with pytest.raises(tp.ArgumentError, match="give write_to too"):
        tp.trace_order(model, X, order_file_destination=tmp_path)
    with pytest.raises(tp.ArgumentError, match="blocks: expected a list"):
        tp.trace_order(model, X, blocks="blocks")  # type: ignore[arg-type]
    with pytest.raises(tp.ArgumentError, match="found no blocks in Linear"):
        tp.trace_order(nn.Linear(4, 4), torch.randn(1, 4))
    # blocks= and skip_prefixes= as plan() takes them
    assert tp.trace_order(model, X, T, blocks=["text_blocks"]) == ["text_blocks.0.", "text_blocks.1."]
    assert tp.trace_order(model, X, T, skip_prefixes=["text_blocks."]) == DEFINED[:4]


def test_a_model_with_offload_hooks_on_is_refused(text_first: tuple[Path, nn.Module]) -> None:
    path, _ref = text_first
    with (
        tp.stage(build_text_first, path, device="cpu", resident_blocks=2) as (model, _p, _h),
        pytest.raises(tp.ArgumentError, match="offload hooks on"),
    ):
        tp.trace_order(model, X, T)


def test_an_order_file_that_cannot_be_written_raises(text_first: tuple[Path, nn.Module], tmp_path: Path) -> None:
    """A real run warns (its order file is a by-product); a trace was asked for the file."""
    path, _ref = text_first
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    with pytest.raises(tp.TrashPandaError, match="order file"):
        tp.trace_order(TextFirst(), X, T, write_to=path, order_file_destination=not_a_folder)
