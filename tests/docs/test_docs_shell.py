"""The shell examples of the site's pages and the README run: each ```console and ```sh command
that calls `trash-panda` runs on a tiny stand-in for the model it names and must exit with 0
(doc_examples.py says how a block is read and how one is left out)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import trash_panda
from support.doc_examples import FENCE, ROOT, SHELL, SKIP, Block, commands, shell_blocks
from support.models import Tiny, save

PAGES = sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"])
ENV = {**os.environ, "PYTHONPATH": str(Path(trash_panda.__file__).parent.parent)}
# The Python package's entry point: it has every command, `generate` included, which the native
# binary lacks.
CLI = [sys.executable, "-m", "trash_panda.cli"]

# Shell blocks left out of the tests, with the reason each page gives for its readers.
LEFT_OUT = {
    "README.md:29": "they install the package and the binary, which the tests use from the\ncheckout instead.",
    "README.md:41": "`make test` is what runs the tests, and `make demo` builds a 6 GB model\nfirst, minutes of work.",
    "docs/guides/getting-started.md:10": (
        "they install the package and the binary, which the tests use from the\ncheckout instead."
    ),
    "docs/guides/getting-started.md:22": (
        "`make test` is what runs the tests, and `make demo` builds a 6 GB model\nfirst, minutes of work."
    ),
}


def _checkpoint(folder: Path) -> Path:
    torch.manual_seed(0)
    return save(Tiny(layers=4), folder / "tiny.safetensors", torch.bfloat16)


def _gguf(folder: Path) -> Path:
    pytest.importorskip("gguf")
    from support.gguf_models import write_llama

    return write_llama(folder / "model.Q4_K_M.gguf", "Q4_K")


def _llama(folder: Path) -> Path:
    pytest.importorskip("transformers")
    from support.hf_folders import make_llama

    return make_llama(folder / "llama", 4)


# The models the commands name, as whole words, and the tiny ones made in their place.
STAND_INS: dict[str, Callable[[Path], Path]] = {
    "target/big.safetensors": _checkpoint,
    "model.safetensors": _checkpoint,
    "model.Q4_K_M.gguf": _gguf,
    "FOLDER": _llama,
}


def blocks() -> list[Block]:
    return [b for p in PAGES for b in shell_blocks(p.read_text(encoding="utf-8"), p.relative_to(ROOT).as_posix())]


RUN = [b for b in blocks() if b.skip is None]


def in_place(words: list[str], tmp_path: Path) -> list[str]:
    """The command as the test runs it: `trash-panda` as the package's CLI, models as stand-ins."""
    assert words[0] == "trash-panda", f"a shell example the tests run calls `trash-panda`: {words}"
    made: dict[str, Path] = {}
    out = []
    for word in words[1:]:
        if word in STAND_INS and word not in made:
            (tmp_path / str(len(made))).mkdir()
            made[word] = STAND_INS[word](tmp_path / str(len(made)))
        out.append(str(made[word]) if word in made else word)
    return [*CLI, *out]


def test_the_site_has_shell_examples() -> None:
    # A page whose commands lost their fence's language would drop out of the run unseen.
    assert {b.page for b in RUN} >= {"docs/guides/plans.md"}, RUN
    assert sum(len(commands(b)) for b in RUN) >= 4


@pytest.mark.parametrize("block", RUN, ids=lambda b: b.name)
def test_shell_example_runs(block: Block, tmp_path: Path) -> None:
    for i, words in enumerate(commands(block)):
        work = tmp_path / f"command{i}"
        work.mkdir()
        r = subprocess.run(in_place(words, work), cwd=work, capture_output=True, text=True, timeout=300, env=ENV)
        assert r.returncode == 0, f"{block.name}: {' '.join(words)}\n{r.stderr[-4000:]}"


def test_left_out_shell_blocks_are_listed_with_their_reason() -> None:
    assert {b.name: b.skip for b in blocks() if b.skip is not None} == LEFT_OUT


def test_every_stand_in_is_used() -> None:
    named = {w for b in RUN for words in commands(b) for w in words}
    assert [w for w in STAND_INS if w not in named] == []


def hidden_commands(text: str, page: str) -> list[str]:
    """Blocks of another language (or none) that hold a command: shown to readers, never run."""
    found = []
    for match in FENCE.finditer(text):
        lines = match.group(2).splitlines()
        if match.group(1) not in SHELL and any(line.startswith(("trash-panda ", "$ ")) for line in lines):
            found.append(f"{page}:{text.count(chr(10), 0, match.start()) + 1}")
    return found


def test_no_command_hides_in_a_block_of_another_language() -> None:
    assert [h for p in PAGES for h in hidden_commands(p.read_text(encoding="utf-8"), p.name)] == []


PAGE = f"""# A page

```console
$ trash-panda inspect model.safetensors   # a comment
what it prints, not run
$ trash-panda inspect --no-such-flag model.safetensors
```

{SKIP} it installs things.

```sh
pip install .
```

```
trash-panda doctor
```
"""


def test_a_failing_command_fails_and_a_bare_block_is_seen(tmp_path: Path) -> None:
    found = shell_blocks(PAGE, "page.md")
    assert [b.skip for b in found] == [None, "it installs things."]
    assert commands(found[0]) == [
        ["trash-panda", "inspect", "model.safetensors"],
        ["trash-panda", "inspect", "--no-such-flag", "model.safetensors"],
    ]
    for folder in "ab":
        (tmp_path / folder).mkdir()
    good, bad = (in_place(words, tmp_path / name) for words, name in zip(commands(found[0]), "ab", strict=True))
    ok = subprocess.run(good, capture_output=True, text=True, timeout=120, env=ENV)
    assert ok.returncode == 0, ok.stderr
    assert subprocess.run(bad, capture_output=True, text=True, timeout=120, env=ENV).returncode != 0
    with pytest.raises(AssertionError, match="calls `trash-panda`"):
        in_place(["pip", "install", "."], tmp_path)
    assert hidden_commands(PAGE, "page.md") == ["page.md:15"]
