"""A model released, or whose hooks were taken off, is used again: loaded again (stream_load,
stage(), from_pretrained), released through a stale handle, restored after a final pass or in
the middle of an overlap load. Each output equals the plain model's."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from torch import nn

import trash_panda as tp
from conftest import ReadsWith
from support.models import Tiny, save
from trash_panda.offload import overlap
from trash_panda.offload.state import get_state

IDS = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(3))


def every_tier() -> tp.Plan:
    p = tp.Plan.manual(resident=["blocks.0.", "blocks.1."], streamed=[f"blocks.{i}." for i in range(2, 6)])
    return p.assign(tp.Tier.DISK, prefixes=["blocks.3.", "blocks.5."])


class Scaled(Tiny):
    """A model with a buffer of its own making, which no checkpoint holds (as rotary tables)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("gain", torch.linspace(0.5, 1.5, 64), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) * self.gain
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x))


@pytest.fixture
def scaled(tmp_path: Path) -> tuple[Path, Scaled]:
    torch.manual_seed(0)
    ref = Scaled().eval()
    return save(ref, tmp_path / "scaled.safetensors"), ref


def build_scaled() -> Scaled:
    with tp.empty_weights():  # parameters on meta, the buffer real
        return Scaled()


def hooked_modules(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if m._forward_pre_hooks or m._forward_hooks]


def test_stream_load_after_release_runs_again(scaled: tuple[Path, Scaled]) -> None:
    path, ref = scaled
    model = build_scaled()
    with torch.no_grad():
        want = ref(IDS)
        for _ in range(3):
            tp.stream_load(model, path, plan=every_tier(), device="cpu")
            handle = tp.install_offload(model)
            assert torch.equal(model(IDS), want)
            tp.release(model, handle)
            assert model.gain.is_meta and model.blocks[0].up.weight.is_meta
            with pytest.raises(tp.TrashPandaError, match="released"):
                model(IDS)


def test_stage_of_the_same_model_twice(scaled: tuple[Path, Scaled]) -> None:
    path, ref = scaled
    model = build_scaled()
    for _ in range(2):
        with tp.stage(lambda: model, path, device="cpu", resident_blocks=2) as (m, _p, _h), torch.no_grad():
            assert m is model
            assert torch.equal(m(IDS), ref(IDS))
    with pytest.raises(tp.TrashPandaError, match="released"):
        model(IDS)


def test_from_pretrained_after_release(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from support.hf_folders import make_llama

    folder = make_llama(tmp_path / "llama", 4)
    plain = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.randint(0, 200, (1, 7), generator=torch.Generator().manual_seed(1))
    p = tp.Plan.manual(resident=["model.layers.0."], streamed=[f"model.layers.{i}." for i in range(1, 4)])
    with torch.no_grad():
        want = plain(ids).logits
        model = tp.from_pretrained(transformers.AutoModelForCausalLM, folder, plan=p)
        assert torch.equal(model(ids).logits, want)
        tp.release(model)
        again = tp.from_pretrained(transformers.AutoModelForCausalLM, folder, plan=p)
        assert torch.equal(again(ids).logits, want)
        tp.release(again)
        # The released model itself, loaded again: its rotary tables (no checkpoint has them)
        # were kept aside by the release.
        tp.stream_load(model, tp.hf.checkpoint_of(folder), plan=p, device="cpu")
        tp.install_offload(model)
        assert torch.equal(model(ids).logits, want)
        tp.release(model)


def test_release_with_a_stale_handle_releases_the_live_hooks(scaled: tuple[Path, Scaled]) -> None:
    path, ref = scaled
    model = build_scaled()
    tp.stream_load(model, path, plan=every_tier(), device="cpu")
    old = tp.install_offload(model)
    old.remove()
    live = tp.install_offload(model)
    with torch.no_grad():
        assert torch.equal(model(IDS), ref(IDS))
    assert hooked_modules(model)
    expansion = live.backend.expansion
    tp.release(model, old)
    assert live.removed
    assert hooked_modules(model) == [""]  # only the refusal of a released model
    assert expansion.raw.numel() == 0  # the live backend was closed
    assert get_state(model) is None and model.blocks[2].up.weight.is_meta


def test_remove_after_a_final_pass_restores_the_freed_blocks(scaled: tuple[Path, Scaled]) -> None:
    path, ref = scaled
    model = build_scaled()
    tp.stream_load(model, path, plan=every_tier(), device="cpu")
    handle = tp.install_offload(model)
    with torch.no_grad():
        want = ref(IDS)
        with handle.final_pass() as fp:
            assert torch.equal(model(IDS), want)
        assert len(fp.freed) == 6 and model.blocks[0].up.weight.is_meta
        handle.remove()
        assert not model.blocks[0].up.weight.is_meta
        assert torch.equal(model(IDS), want)  # plainly, every block back
    tp.release(model)


def test_remove_during_an_overlap_load_restores_what_it_had_not_read(
    loader_reads: ReadsWith, scaled: tuple[Path, Scaled], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, ref = scaled
    real = overlap.load_block
    first_read = threading.Event()
    go_on = threading.Event()

    def held(block, *args):  # type: ignore[no-untyped-def]
        real(block, *args)
        first_read.set()
        go_on.wait(10)  # the first block read, the rest wait until the hooks are off

    loader_reads(block=held)
    with tp.stage(build_scaled, path, device="cpu", resident_blocks=4, overlap=True) as (model, _p, handle):
        assert first_read.wait(10)
        unread = [i for i in range(4) if model.blocks[i].up.weight.is_meta]
        assert len(unread) == 3
        # The loader is told to stop, then let go: it ends after the block it is in.
        threading.Timer(0.2, go_on.set).start()
        handle.remove()
        assert not any(model.blocks[i].up.weight.is_meta for i in unread)
        with torch.no_grad():
            assert torch.equal(model(IDS), ref(IDS))
