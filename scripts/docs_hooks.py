"""MkDocs hooks for the site (`make docs`), run by the docs environment, which has no torch.

- The settings page's table is made from the core's own table, read through the built
  extension, so the page cannot drift from the defaults the code uses.
- Pages link to repository files (examples, BENCHMARK.md, plots) with paths that work on
  GitHub; the site copies each such file under ``repo/`` and points the link there, so the same
  link works on both, and one to a file that does not exist fails the strict build.
- The build ends with one line: pages written and the time it took.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os.path
import re
import time
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

# The repository and its docs/ as the config names them (a test builds a site of its own).
ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
EXTENSION = ROOT / "python" / "trash_panda" / "_core.abi3.so"
SETTINGS_MARKER = "<!-- settings-table -->"
MIRROR = Path("repo")
# A Markdown link or image target; titles and angle brackets are not used in these pages.
LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")

_started = 0.0
_pages = 0


def load_core() -> ModuleType:
    """The extension alone: importing the ``trash_panda`` package would need torch."""
    if not EXTENSION.exists():
        raise SystemExit(f"docs: {EXTENSION} is not built; `make docs` builds it first")
    loader = importlib.machinery.ExtensionFileLoader("trash_panda._core", str(EXTENSION))
    spec = importlib.util.spec_from_file_location("trash_panda._core", EXTENSION, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def settings_table(rows: list[dict[str, str]]) -> str:
    """The Markdown table of every setting, in the core's order."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| variable | kind | default | what it does |", "|---|---|---|---|"]
    for s in rows:
        default = f"`{s['default']}`" if s["default"] else "(unset)"
        lines.append(f"| `{s['variable']}` | {cell(s['kind'])} | {default} | {cell(s['doc'])} |")
    return "\n".join(lines)


def _outside_links(page: Path) -> list[Path]:
    """Repository files outside docs/ that a Markdown file links to, resolved."""
    found = []
    for match in LINK.finditer(page.read_text(encoding="utf-8")):
        target = match.group(2)
        if "://" in target or target.startswith(("/", "mailto:")):
            continue
        path = (page.parent / target).resolve()
        if path.is_relative_to(ROOT) and not path.is_relative_to(DOCS):
            found.append(path)
    return found


def _mirrored(page_src: str) -> Path:
    """Where a page's own file is in the repository (mirrored pages included)."""
    if page_src.startswith(f"{MIRROR}/"):
        return ROOT / page_src[len(str(MIRROR)) + 1 :]
    return DOCS / page_src


def on_config(config: Any) -> Any:
    global _started, _pages, ROOT, DOCS
    _started, _pages = time.monotonic(), 0
    ROOT = Path(config["config_file_path"]).resolve().parent
    DOCS = Path(config["docs_dir"]).resolve()
    return config


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    # Breadth-first: a mirrored Markdown file (BENCHMARK.md) brings the plots it shows.
    queue = list(DOCS.rglob("*.md"))
    seen: set[Path] = set()
    while queue:
        for path in _outside_links(queue.pop()):
            # A missing file is left to the strict build, which names the page and the link.
            if path in seen or not path.is_file():
                continue
            seen.add(path)
            uri = (MIRROR / path.relative_to(ROOT)).as_posix()
            files.append(File.generated(config, uri, abs_src_path=str(path)))
            if path.suffix == ".md":
                queue.append(path)
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    here = _mirrored(page.file.src_uri).parent

    def relink(match: re.Match[str]) -> str:
        target = match.group(2)
        if "://" in target or target.startswith(("/", "mailto:")):
            return match.group(0)
        path = (here / target).resolve()
        if not path.is_relative_to(ROOT) or (here.is_relative_to(DOCS) and path.is_relative_to(DOCS)):
            return match.group(0)
        site = path.relative_to(DOCS) if path.is_relative_to(DOCS) else MIRROR / path.relative_to(ROOT)
        new = os.path.relpath(site, PurePosixPath(page.file.src_uri).parent)
        return f"{match.group(1)}{PurePosixPath(new)}{match.group(3) or ''}{match.group(4)}"

    markdown = LINK.sub(relink, markdown)
    if SETTINGS_MARKER in markdown:
        markdown = markdown.replace(SETTINGS_MARKER, settings_table(load_core().settings()))
    return markdown


def on_post_page(output: str, page: Any, config: Any) -> str:
    global _pages
    _pages += 1
    return output


def on_post_build(config: Any) -> None:
    took = time.monotonic() - _started
    print(f"docs: {_pages} pages written to {config['site_dir']} in {took:.1f} s")
