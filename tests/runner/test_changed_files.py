"""A checkpoint rewritten while a model uses it. A pipeline's stage kept from an earlier run whose
checkpoint changed on disk since its load is loaded again from the file as it is now: the next
image is the new weights' (not the old ones', nor a mix of both read by the old header's
offsets), and the report says why it was not kept. A model streaming from a file written to
since its load gets an error naming the file instead of computing with the new bytes."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import trash_panda as tp
from trash_panda._core import Arrival, Departure

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import pipeline_stages as ps

from support.models import Tiny, save
from support.runner import fixed_holds, fixed_stages, one_run, stages


def rewrite(folder: Path, name: str, seed: int) -> None:
    """New random weights for component ``name``, written over its file (same names and shapes),
    with a modification time two seconds on, which no file system's clock confuses."""
    torch.manual_seed(seed)
    config = json.loads((folder / name / "config.json").read_text())
    model = ps.COMPONENTS[name](**config)
    path = folder / name / "diffusion_pytorch_model.safetensors"
    before = os.stat(path)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 2_000_000_000))


def test_a_kept_stage_whose_file_changed_is_loaded_again(tmp_path: Path) -> None:
    folder = ps.save_pipeline(tmp_path / "pipe")
    old = ps.plain(folder)
    with tp.Pipeline(stages(folder)) as pipe:
        assert torch.equal(one_run(pipe), old)
        assert pipe.loaded == list(ps.COMPONENTS)
        rewrite(folder, "transformer", seed=7)
        new = ps.plain(folder)
        assert not torch.equal(new, old)
        assert torch.equal(one_run(pipe), new)
        second = {r.stage: r for r in pipe.records if r.run == 2}
        assert second["text_encoder"].arrival == second["vae"].arrival == Arrival.KEPT
        assert second["text_encoder"].file_changed is None
        moved = second["transformer"]
        assert moved.arrival == Arrival.READ_AT_START
        assert moved.file_changed is not None and "diffusion_pytorch_model.safetensors" in moved.file_changed
        assert "not kept: its checkpoint changed since it was loaded" in pipe.report()
        # Loaded from the new file, it is kept again like any other stage.
        assert torch.equal(one_run(pipe), new)
        assert [r.arrival for r in pipe.records if r.run == 3] == [Arrival.KEPT, Arrival.KEPT, Arrival.KEPT]


def test_a_stage_whose_given_back_blocks_were_read_again_from_a_changed_file_is_loaded_again(
    tmp_path: Path,
) -> None:
    """Within a budget that fits one stage and half the encoder, the encoder is kept in part and
    its given-back blocks are read again behind the VAE of the run before; its file changes after
    that run: the next run loads it afresh instead of using the blocks read from the new file by
    the old offsets beside the blocks kept from the old one."""
    folder = ps.save_pipeline(tmp_path / "pipe")
    holds = fixed_holds(folder)
    budget = max(h.ram for h in holds.values()) + holds["text_encoder"].ram // 2
    old = ps.plain(folder)
    with tp.Pipeline(fixed_stages(folder), ram=budget) as pipe:
        assert torch.equal(one_run(pipe, final=False), old)
        encoder = pipe.records[0]
        assert encoder.departure == Departure.KEPT and encoder.given_back > 0
        rewrite(folder, "text_encoder", seed=11)
        new = ps.plain(folder)
        assert torch.equal(one_run(pipe, final=False), new)
        again = next(r for r in pipe.records if r.run == 2 and r.stage == "text_encoder")
        assert again.arrival == Arrival.READ_AT_START and again.file_changed is not None
        assert again.read_again == 0


def test_a_checkpoint_says_which_file_changed_and_how(tmp_path: Path) -> None:
    folder = ps.save_pipeline(tmp_path / "pipe")
    ckpt = tp.Checkpoint(folder / "vae")
    assert ckpt.changed() is None
    rewrite(folder, "vae", seed=3)
    change = ckpt.changed()
    assert change is not None
    assert change.startswith(str(folder / "vae" / "diffusion_pytorch_model.safetensors") + ": ")
    assert change.endswith(("it was written to", "another file is at its path now")), change


def _streamed(tmp_path: Path, tier: str) -> tuple[Path, nn.Module, nn.Module, Any]:
    torch.manual_seed(0)
    ref = Tiny(dim=64, layers=3, vocab=300).to(torch.bfloat16).eval()
    path = save(ref, tmp_path / "m.safetensors", torch.bfloat16)
    with torch.device("meta"):
        model = Tiny(dim=64, layers=3, vocab=300).to(torch.bfloat16).eval()
    plan = tp.Plan.manual(resident=["blocks.0."], streamed=["blocks.1.", "blocks.2."], streamed_tier=tier)
    tp.stream_load(model, path, plan=plan, device="cpu")
    return path, ref, model, tp.install_offload(model)


def _other(tmp_path: Path) -> Path:
    """Other weights of the same shapes, in a file of the same layout."""
    torch.manual_seed(1)
    return save(Tiny(dim=64, layers=3, vocab=300).to(torch.bfloat16).eval(), tmp_path / "o.safetensors", torch.bfloat16)


@pytest.mark.parametrize("tier", ["disk", "ram"])
def test_a_streamed_model_whose_file_was_written_over_is_an_error_naming_it(tmp_path: Path, tier: str) -> None:
    path, ref, model, handle = _streamed(tmp_path, tier)
    x = torch.tensor([[1, 2, 3]])
    try:
        with torch.no_grad():
            assert torch.equal(model(x), ref(x))
            # Copied over it as cp does: the same file, truncated and written again in place.
            before = os.stat(path)
            shutil.copyfile(_other(tmp_path), path)
            assert os.stat(path).st_ino == before.st_ino
            os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 2_000_000_000))
            # The embedding, left in the file's map, is checked before each lookup (the engine's
            # own reads are checked in the core's tests: crates/trash-panda/tests/stream_engine.rs).
            changed = r"m\.safetensors: tensor \"embed\.weight\" cannot be read: the file changed after it was opened"
            with pytest.raises(tp.CheckpointError, match=changed + r" \(it was written to\)"):
                model(x)
    finally:
        tp.release(model, handle)


@pytest.mark.parametrize("tier", ["disk", "ram"])
def test_a_streamed_model_whose_file_was_replaced_keeps_reading_the_one_it_opened(tmp_path: Path, tier: str) -> None:
    """safetensors' save_file puts a new file at the path: the engine's open file and its map are
    still the old one, whole, so the model computes as loaded."""
    path, ref, model, handle = _streamed(tmp_path, tier)
    x = torch.tensor([[1, 2, 3]])
    try:
        with torch.no_grad():
            assert torch.equal(model(x), ref(x))
            before = os.stat(path).st_ino
            os.replace(_other(tmp_path), path)
            assert os.stat(path).st_ino != before
            for _ in range(3):
                assert torch.equal(model(x), ref(x))
    finally:
        tp.release(model, handle)
