"""MkDocs hooks for the site (`make docs`), run by the docs environment, which has no torch.

- The settings page's table is made from the core's own table, read through the built
  extension, so the page cannot drift from the defaults the code uses.
- Pages link to repository files (examples, BENCHMARK.md, plots) with paths that work on
  GitHub; the site copies each such file under ``repo/`` and points the link there, so the same
  link works on both, and one to a file that does not exist fails the strict build.
- Each benchmark's result file (``bench/results/*.md``, written by the benchmark scripts) is a
  page of its own under Figures, as the script wrote it, headed by the date, machine and method
  the file states; the figures page's table of them is made from the same files.
- The troubleshooting page's part on the core's errors, and its table of the Python exceptions,
  are made from the code (scripts/error_docs.py); an error with no advice fails the build.
- The build ends with one line: pages written and the time it took.
"""

from __future__ import annotations

import html
import importlib.machinery
import importlib.util
import os.path
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

# The repository and its docs/ as the config names them (a test builds a site of its own).
ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
EXTENSION = ROOT / "python" / "trash_panda" / "_core.abi3.so"
SETTINGS_MARKER = "<!-- settings-table -->"
MIRROR = Path("repo")
RESULTS_MARKER = "<!-- bench-results -->"
RESULTS_NAV = "Benchmark results"
NOT_STATED = "not stated in the file"
# A Markdown link or image target; titles and angle brackets are not used in these pages.
LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import error_docs  # noqa: E402  (beside this file, plain Python)

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
        path = _resolve(page.parent, target)
        if path.is_relative_to(ROOT) and not path.is_relative_to(DOCS):
            found.append(path)
    return found


def _resolve(here: Path, target: str) -> Path:
    """``target`` from ``here``. The bench scripts write their plots' paths from the repository's
    root (for BENCHMARK.md's copy of their tables), so outside docs/ a path that is not there but
    is under the root is taken from the root."""
    path = (here / target).resolve()
    if not path.exists() and not here.is_relative_to(DOCS) and (ROOT / target).exists():
        return (ROOT / target).resolve()
    return path


def _mirrored(page_src: str) -> Path:
    """Where a page's own file is in the repository (mirrored pages included)."""
    if page_src.startswith(f"{MIRROR}/"):
        return ROOT / page_src[len(str(MIRROR)) + 1 :]
    return DOCS / page_src


def result_files() -> list[Path]:
    return sorted((ROOT / "bench" / "results").glob("*.md"))


def _results_uri(path: Path) -> str:
    return (MIRROR / path.relative_to(ROOT)).as_posix()


def _header(text: str) -> list[str]:
    """The file's opening statements (before its first table or second heading), one a string:
    each bullet or paragraph with its wrapped lines joined, split at semicolons."""
    items: list[str] = []
    for line in text.splitlines()[1:]:
        if line.startswith(("|", "#")):
            break
        if not line.strip() or line.startswith("- "):
            items.append("")
        items[-1:] = [(items[-1] if items else "") + " " + line.strip().removeprefix("- ")]
    return [part.strip() for item in items for part in _statements(item) if part.strip()]


def _statements(item: str) -> list[str]:
    # At "; " and at a sentence's end, but not inside brackets: "(figures drift; compare ratios)".
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(item):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and (item.startswith("; ", i) or re.match(r"\. [A-Z]", item[i : i + 3])):
            parts.append(item[start : i + (ch == ".")])
            start = i + 2
    return [*parts, item[start:]]


def _writer(path: Path) -> str | None:
    """The benchmark source that names the result file, for a file whose title names none."""
    bench = ROOT / "bench"
    for source in sorted([*bench.rglob("*.py"), *bench.rglob("*.rs")]):
        if f"results/{path.name}" in source.read_text(encoding="utf-8"):
            return source.relative_to(ROOT).as_posix()
    return None


def provenance(text: str) -> dict[str, str]:
    """The date, machine and method a result file states, each as the file words it."""
    header = _header(text)
    date = re.search(r"\d{4}-\d{2}-\d{2}(?: \d{2}:\d{2} UTC)?", " ".join(header))
    machine = next((h for h in header if re.search(r"machine:|nproc|\d+ (?:v?CPUs|cores)\b", h, re.I)), None)
    if machine is not None:
        machine = re.sub(r"^(?:machine:\s*)", "", machine, flags=re.I)
    title = text.split("\n", 1)[0]
    command = re.search(r"`([^`]+)`", title) or next(
        (m for h in header if h.lower().startswith("method") for m in [re.search(r"`([^`]+)`", h)] if m), None
    )
    return {
        "date": date.group(0) if date else NOT_STATED,
        "machine": (machine or NOT_STATED).rstrip("."),
        "method": f"`{command.group(1)}`" if command else NOT_STATED,
    }


def stated(path: Path) -> dict[str, str]:
    """``provenance`` of a result file, its method taken from the source that writes it where the
    file names none."""
    found = provenance(path.read_text(encoding="utf-8"))
    writer = _writer(path) if found["method"] == NOT_STATED else None
    if writer is not None:
        found["method"] = f"written by `{writer}`"
    return found


def result_title(path: Path) -> str:
    title = path.read_text(encoding="utf-8").split("\n", 1)[0].lstrip("#").strip()
    # The script the title names is the method column's; the nav keeps the words, and the file's
    # name tells apart two runs of one script.
    title = re.sub(r"\s*\(`[^`]*`[^)]*\)|`", "", title).split(":")[0].strip()
    return f"{title} ({path.stem})"


def results_page(path: Path) -> str:
    """The page of one result file: its title, what it says of its run, then the file as is."""
    text = path.read_text(encoding="utf-8")
    title, _, rest = text.partition("\n")
    p = stated(path)
    note = (
        f"*Date: {p['date']}. Machine: {p['machine']}. Method: {p['method']}. Below, "
        f"`{path.relative_to(ROOT).as_posix()}` as its benchmark wrote it, read when the site was built.*"
    )
    return f"{title}\n\n{note}\n{rest}"


def results_table(paths: list[Path], page_uri: str) -> str:
    """The table of every result file for the figures page: a link, and date, machine, method."""
    lines = ["| result | date | method | machine |", "|---|---|---|---|"]
    for path in paths:
        p = stated(path)
        link = os.path.relpath(_results_uri(path), PurePosixPath(page_uri).parent)
        cells = [f"[{result_title(path)}]({PurePosixPath(link)})", p["date"], p["method"], p["machine"]]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def on_config(config: Any) -> Any:
    global _started, _pages, ROOT, DOCS
    _started, _pages = time.monotonic(), 0
    ROOT = Path(config["config_file_path"]).resolve().parent
    DOCS = Path(config["docs_dir"]).resolve()
    pages = [{result_title(p): _results_uri(p)} for p in result_files()]
    for entry in config["nav"] or []:
        if isinstance(entry, dict) and isinstance(entry.get("Figures"), list) and pages:
            entry["Figures"].append({RESULTS_NAV: pages})
    return config


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    # Breadth-first: a mirrored Markdown file (BENCHMARK.md) brings the plots it shows.
    queue = list(DOCS.rglob("*.md"))
    seen: set[Path] = set()
    for path in result_files():
        files.append(File.generated(config, _results_uri(path), content=results_page(path)))
        seen.add(path.resolve())
        queue.append(path)
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
        path = _resolve(here, target)
        if not path.is_relative_to(ROOT) or (here.is_relative_to(DOCS) and path.is_relative_to(DOCS)):
            return match.group(0)
        site = path.relative_to(DOCS) if path.is_relative_to(DOCS) else MIRROR / path.relative_to(ROOT)
        new = os.path.relpath(site, PurePosixPath(page.file.src_uri).parent)
        return f"{match.group(1)}{PurePosixPath(new)}{match.group(3) or ''}{match.group(4)}"

    markdown = LINK.sub(relink, markdown)
    if RESULTS_MARKER in markdown:
        markdown = markdown.replace(RESULTS_MARKER, results_table(result_files(), page.file.src_uri))
    if SETTINGS_MARKER in markdown:
        markdown = markdown.replace(SETTINGS_MARKER, settings_table(load_core().settings()))
    if error_docs.MARKER in markdown:
        markdown = markdown.replace(error_docs.MARKER, error_docs.section())
    if error_docs.CLASSES_MARKER in markdown:
        markdown = markdown.replace(error_docs.CLASSES_MARKER, error_docs.classes_section())
    return markdown


def on_post_page(output: str, page: Any, config: Any) -> str:
    global _pages
    _pages += 1
    return output


def on_post_build(config: Any) -> None:
    took = time.monotonic() - _started
    print(f"docs: {_pages} pages written to {config['site_dir']} in {took:.1f} s")


ROLE = re.compile(r":(?:func|class|meth|attr|mod|data|exc|obj):`(~?)(\.?[^`]+)`")


def roles_as_refs(text: str, target: Callable[[str], str | None]) -> str:
    """``text`` with every Sphinx role (``:func:`trash_panda.plan```) as inline code showing the
    full name, or its last part where the role asks for that (``~``). Where ``target`` finds the
    object the role names (it is given the name as written, a leading dot included), the code is
    a cross-reference to it: an autorefs link marked optional, so an object that no API page
    shows stays code instead of failing the strict build. For griffe_roles.py."""

    def one(m: re.Match[str]) -> str:
        written = m.group(2)
        name = written.lstrip(".")
        code = f"`{name.rsplit('.', 1)[-1] if m.group(1) else name}`"
        found = target(written)
        if found is None:
            return code
        shown = html.escape(code.strip("`"))
        return f'<autoref identifier="{html.escape(found)}" optional><code>{shown}</code></autoref>'

    return ROLE.sub(one, text)


def roles_as_code(text: str) -> str:
    """``text`` with every Sphinx role as inline code (``roles_as_refs`` finding no target)."""
    return roles_as_refs(text, lambda _name: None)
