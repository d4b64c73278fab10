"""docs/architecture.md names every module of the torch layer, and only modules that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "trash_panda"


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_the_layout_page_names_every_python_module() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = [line for line in _section(text, "The torch layer").splitlines() if line.startswith("| `")]
    named = {m for line in table for m in re.findall(r"`([\w/]+\.py)`", line.split("|")[1])}
    files = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    assert named - files == set(), "the page names modules that do not exist"
    assert files - named == set(), "modules the page does not name"
