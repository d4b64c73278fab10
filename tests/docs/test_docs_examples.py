"""Every ```python block of the site's pages runs, on the CPU with tiny models, so an example
that stops working fails the tests (doc_examples.py says how a page is run)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from support.doc_examples import ROOT, SKIP, page_blocks, python_blocks, run_blocks

DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if any(b.skip is None for b in page_blocks(p)))

# Blocks left out of the tests, each with the reason its page gives: a block added here has to say
# in its page why it cannot run (it needs CUDA, say), and this list shows them all.
LEFT_OUT: dict[str, str] = {
    "docs/guides/transformers-diffusers.md:170": (
        "a Flux pipeline's text encoders and VAE are more than a test builds;\n"
        "`tests/integrations/test_gguf_diffusers.py` makes the same call on a Flux-shaped transformer."
    ),
    "docs/guides/platforms.md:50": (
        "they run on the CPU; the GPU path is checked by `scripts/gpu-check.sh` on a\nGPU machine."
    ),
}


def _llama(folder: Path) -> Path:
    from support.hf_folders import make_llama

    return make_llama(folder, 4)


def _sd(folder: Path) -> Path:
    from support.hf_folders import make_sd

    return make_sd(folder)


def _sd_lora(folder: Path) -> Path:
    from support.adapters import sd_loras
    from support.hf_folders import make_sd

    folder.mkdir()
    return sd_loras(make_sd(folder / "sd"), folder)["a"]


def _llama_gguf(folder: Path) -> Path:
    pytest.importorskip("gguf")
    from support.gguf_models import write_llama

    folder.mkdir()
    write_llama(folder / "model-Q4_K_M.gguf", "Q4_K")
    return folder


def _llama_lora(folder: Path) -> Path:
    from support.adapters import llama_lora
    from support.hf_folders import make_llama

    folder.mkdir()
    return llama_lora(make_llama(folder / "llama", 4), folder / "llama-lora")


def _llama_draft(folder: Path) -> Path:
    from support.hf_folders import make_llama

    return make_llama(folder, 3)  # the same tokenizer as the stand-in target's


def _wan22(folder: Path) -> Path:
    from support.two_models import make_wan22

    return make_wan22(folder)


def _wan_lora(folder: Path) -> Path:
    from support.two_models import make_wan22, wan_lora

    folder.mkdir()
    return wan_lora(make_wan22(folder / "wan"), folder / "lora")


# The large models the pages name, and the tiny ones made in their place.
FOLDERS: dict[str, Callable[[Path], Path]] = {
    '"target/demo-llama-6gb"': _llama,
    '"path/to/stable-diffusion"': _sd,
    '"path/to/raccoon-lora"': _sd_lora,
    '"path/to/llama-lora"': _llama_lora,
    '"path/to/llama-gguf"': _llama_gguf,
    '"path/to/llama-draft"': _llama_draft,
    '"path/to/wan2.2"': _wan22,
    '"path/to/wan-lora"': _wan_lora,
}


def tiny_folders(text: str, tmp_path: Path) -> dict[str, Path]:
    """The tiny folders for the large models ``text`` names, made under ``tmp_path``."""
    made = {}
    for written, make in FOLDERS.items():
        if written in text:
            pytest.importorskip("transformers")
            pytest.importorskip("diffusers")
            made[written] = make(tmp_path / f"model{len(made)}")
    return made


def test_the_site_has_examples() -> None:
    names = {p.relative_to(DOCS).as_posix() for p in PAGES}
    # The guides that show code; a page that lost its examples would drop out of the run unseen.
    assert {"guides/getting-started.md", "guides/pipeline.md", "guides/transformers-diffusers.md"} <= names, names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(DOCS).as_posix())
def test_page_examples_run(page: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    folders = tiny_folders(page.read_text(encoding="utf-8"), tmp_path)
    r = run_blocks(page_blocks(page), work, folders)
    assert r.returncode == 0, r.stderr[-4000:]


def test_left_out_blocks_are_listed_with_their_reason() -> None:
    found = {b.name: b.skip for p in DOCS.rglob("*.md") for b in page_blocks(p) if b.skip is not None}
    assert found == LEFT_OUT


def test_every_stand_in_model_is_used() -> None:
    # A page that no longer names a model would leave its stand-in here, unused and unchecked.
    text = "".join(p.read_text(encoding="utf-8") for p in [*DOCS.rglob("*.md"), ROOT / "README.md"])
    assert [w for w in FOLDERS if w not in text] == []


PAGE = """# A page

```python
numbers = [1, 2, 3]
```

Text between the blocks.

```python
total = sum(numbers)  # the names of the blocks before are there
assert total == {want}, total
```
"""


def test_a_broken_example_fails_and_names_its_line(tmp_path: Path) -> None:
    good = run_blocks(python_blocks(PAGE.format(want=6), "page.md"), tmp_path)
    assert good.returncode == 0, good.stderr
    broken = run_blocks(python_blocks(PAGE.format(want=7), "page.md"), tmp_path)
    assert broken.returncode != 0
    assert 'File "page.md", line 11' in broken.stderr and "AssertionError: 6" in broken.stderr, broken.stderr


def test_a_block_is_left_out_only_with_a_reason() -> None:
    text = PAGE.replace("Text between the blocks.", f"{SKIP} it needs a GPU.")
    blocks = python_blocks(text, "page.md")
    assert [b.skip for b in blocks] == [None, "it needs a GPU."]
    with pytest.raises(ValueError, match="must say why"):
        python_blocks(PAGE.replace("Text between the blocks.", SKIP), "page.md")


def test_other_languages_are_not_run() -> None:
    text = "```powershell\n$env:X = 1\n```\n\n```\nmake test\n```\n\n```python\nx = 1\n```\n"
    assert [b.code for b in python_blocks(text, "page.md")] == ["x = 1\n"]
