"""The ```python blocks of a Markdown page, run in order as one session, the way a reader would
paste them one after another; and its shell blocks (```console: the lines after ``$ ``; ```sh:
every line), each command run on its own.

A block is left out only when the paragraph right before it starts with ``Not run by the
tests:`` and gives a reason, so the reason is in the page for its readers too. Paths that stand
for a large model (``"target/demo-llama-6gb"``) are put in place of tiny folders the test makes.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import trash_panda

ROOT = Path(__file__).resolve().parents[2]
SKIP = "Not run by the tests:"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
SHELL = ("console", "sh")

# Each block is compiled as its page, shifted down to its place there, so a traceback gives the
# page's own line.
DRIVER = """
import json, sys
namespace = {"__name__": "__main__"}
for page, line, code in json.load(open(sys.argv[1], encoding="utf-8")):
    exec(compile("\\n" * line + code, page, "exec"), namespace)
"""


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence
    code: str
    skip: str | None
    language: str = "python"

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def python_blocks(text: str, page: str) -> list[Block]:
    """Every ```python block of ``text``; ``page`` names it in errors and tracebacks."""
    return fenced_blocks(text, page, ("python",))


def shell_blocks(text: str, page: str) -> list[Block]:
    """Every ```console and ```sh block of ``text``."""
    return fenced_blocks(text, page, SHELL)


def commands(block: Block) -> list[list[str]]:
    """The commands of a shell block, each split into words as the shell would (comments gone)."""
    lines = block.code.splitlines()
    if block.language == "console":
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    return [words for line in lines if (words := shlex.split(line, comments=True))]


def fenced_blocks(text: str, page: str, languages: tuple[str, ...]) -> list[Block]:
    blocks = []
    for match in FENCE.finditer(text):
        if match.group(1) not in languages:
            continue
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip().rsplit("\n\n", 1)[-1].strip()
        skip = None
        if before.startswith(SKIP):
            skip = before[len(SKIP) :].strip()
            if not skip:
                raise ValueError(f"{page}:{line}: a block left out of the tests must say why")
        blocks.append(Block(page, line, match.group(2), skip, match.group(1)))
    return blocks


def page_blocks(path: Path) -> list[Block]:
    return python_blocks(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())


def run_blocks(
    blocks: list[Block], cwd: Path, folders: dict[str, Path] | None = None
) -> subprocess.CompletedProcess[str]:
    """Runs the blocks not left out, in order, in one interpreter with ``cwd`` as its folder.

    ``folders`` maps a quoted path as the page writes it to the folder used in its place.
    """
    script = []
    for b in blocks:
        if b.skip is not None:
            continue
        code = b.code
        for written, folder in (folders or {}).items():
            code = code.replace(written, repr(str(folder)))
        script.append((b.page, b.line, code))
    payload = cwd / "blocks.json"
    payload.write_text(json.dumps(script), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(Path(trash_panda.__file__).parent.parent)}
    return subprocess.run(
        [sys.executable, "-c", DRIVER, str(payload)], cwd=cwd, capture_output=True, text=True, timeout=600, env=env
    )
