"""The diffusers chain and the hook registry keep to torch's hook semantics: neither reads nor
reorders a module's torch hook dicts (the registry walks its own ranked list), neither plants
accelerate's ``_hf_hook`` on a component (a chained pipeline reports its device through its
``device`` property), and the chain uses the pipeline runner only through its public methods."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import trash_panda
from support.hf_folders import make_sd
from support.sd import STREAM, sd_image
from trash_panda.pipeline import Pipeline

pytest.importorskip("diffusers")
pytest.importorskip("transformers")

from diffusers import StableDiffusionPipeline

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "trash_panda"
SOURCES = [PACKAGE / "diffusers.py", PACKAGE / "offload" / "registry.py"]
# torch's own hook dicts, and accelerate's hook attribute.
FORBIDDEN = {
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_hf_hook",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    runner_privates = {n for n, v in vars(Pipeline).items() if _private(n) and callable(v)}
    found = []
    for node in ast.walk(tree):
        where = f"{path.name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute):
            if node.attr in FORBIDDEN:
                found.append(f"{where}: .{node.attr}")
            elif _private(node.attr) and "runner" in ast.unparse(node.value).lower():
                found.append(f"{where}: the runner's private {ast.unparse(node)}")
            elif node.attr in runner_privates:
                found.append(f"{where}: {ast.unparse(node)}, a private method of Pipeline")
        elif isinstance(node, ast.Constant) and node.value in FORBIDDEN:
            found.append(f"{where}: {node.value!r}")  # setattr(m, "_hf_hook", ...), __dict__.pop(...)
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_torch_hook_dicts_no_hf_hook_no_private_runner_calls(path: Path) -> None:
    assert _offences(path) == []


def test_the_check_sees_what_it_looks_for(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def f(module, chain, c):\n"
        "    had = set(module._forward_pre_hooks)\n"
        "    chain.runner._settle()\n"
        "    c.model._hf_hook = None\n"
        "    c.model.__dict__.pop('_hf_hook', None)\n",
        encoding="utf-8",
    )
    assert len(_offences(bad)) == 4


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_sd(tmp_path_factory.mktemp("sd-guards"))


def _hf_hooked(pipe: object) -> list[str]:
    found = []
    for name, component in pipe.components.items():  # type: ignore[attr-defined]
        if isinstance(component, torch.nn.Module):
            found += [f"{name}.{n}" for n, m in component.named_modules() if hasattr(m, "_hf_hook")]
    return found


def test_a_chained_pipeline_plants_no_hf_hook_and_reports_its_device(folder: Path) -> None:
    pipe = trash_panda.diffusers.load_pipeline(
        StableDiffusionPipeline, folder, stream=STREAM, chain=True, device="cpu", resident_blocks=0
    )
    try:
        assert isinstance(pipe, StableDiffusionPipeline) and type(pipe).__name__ == "StableDiffusionPipeline"
        assert _hf_hooked(pipe) == []
        # Nothing loaded yet, and each component says where its load will put it: a pipeline
        # sends a component's inputs to its device (diffusers' get_module_execution_device).
        assert all(next(getattr(pipe, n).parameters()).is_meta for n in STREAM)
        assert all(getattr(pipe, n).device == torch.device("cpu") for n in STREAM)
        assert [type(getattr(pipe, n)).__name__ for n in STREAM] == [
            "CLIPTextModel",
            "UNet2DConditionModel",
            "AutoencoderKL",
        ]
        assert pipe.device == torch.device("cpu") and pipe._execution_device == torch.device("cpu")
        image = sd_image(pipe)
        assert torch.isfinite(image).all()
        assert _hf_hooked(pipe) == []
    finally:
        trash_panda.diffusers.release_pipeline(pipe)
    assert type(pipe) is StableDiffusionPipeline
    from diffusers import UNet2DConditionModel

    assert type(pipe.unet) is UNet2DConditionModel
