"""Where a raise's message is quoted in a documentation page (the troubleshooting page's checks)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


PAGE = ROOT / "docs" / "guides" / "troubleshooting.md"


HOLE = "\x00"  # where a value goes into the text: a quote never spans one


@dataclass(frozen=True)
class Site:
    where: str
    text: str  # the literal text, HOLE for each value


def gaps(page: str, sites: list[Site], elsewhere: dict[str, str]) -> tuple[list[str], list[str]]:
    """(quotes no warning's text holds, warnings no quote is from)."""
    found = quotes(page)
    stale = [q for q in found if not any(q in s.text for s in sites)]
    missing = [
        f"{s.where}: {s.text.replace(HOLE, '...')!r}"
        for s in sites
        if s.where not in elsewhere and not any(q in s.text for q in found)
    ]
    return stale, missing


def quotes(page: str) -> list[str]:
    """The quoted text that starts each entry of the page's "Warnings" section."""
    section = page.split("\n## Warnings\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^- `([^`]+)`", section, flags=re.M)
