"""The site's build (scripts/docs_hooks.py, mkdocs.yml): the settings table comes from the core,
a link to a repository file works, and a broken link fails the strict build."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
from pathlib import Path

import pytest

from support.doc_examples import ROOT
from trash_panda import _core

# The hooks are a script of the site, not a module of the package: loaded from their file.
_spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
assert _spec is not None and _spec.loader is not None
docs_hooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(docs_hooks)

SETTINGS_PAGE = ROOT / "docs" / "guides" / "settings.md"
MKDOCS = ROOT / ".venv-docs" / "bin" / "mkdocs"


def test_the_settings_page_has_no_table_of_its_own() -> None:
    text = SETTINGS_PAGE.read_text(encoding="utf-8")
    assert text.count(docs_hooks.SETTINGS_MARKER) == 1
    # A row written by hand would drift from the core's defaults.
    assert [line for line in text.splitlines() if "TRASH_PANDA_" in line and line.startswith("|")] == []


def test_the_settings_table_has_every_setting_of_the_core() -> None:
    rows = _core.settings()
    table = docs_hooks.settings_table(rows).splitlines()
    assert len(table) == 2 + len(rows)
    for s, line in zip(rows, table[2:], strict=True):
        assert line.startswith(f"| `{s['variable']}` |") and s["doc"] in line, line
        assert (f"`{s['default']}`" if s["default"] else "(unset)") in line, line


def test_a_pipe_in_a_description_stays_in_its_cell() -> None:
    row = {"variable": "TRASH_PANDA_X", "kind": "choice: a|b", "default": "a", "doc": "a|b"}
    line = docs_hooks.settings_table([row]).splitlines()[2]
    assert line.count("|") - line.count("\\|") == 5, line


def _site(tmp_path: Path, index: str, config: str = "") -> subprocess.CompletedProcess[str]:
    (tmp_path / "docs").mkdir(exist_ok=True)
    (tmp_path / "docs" / "index.md").write_text(index, encoding="utf-8")
    (tmp_path / "data.txt").write_text("beside the docs\n", encoding="utf-8")
    hooks = (ROOT / "scripts" / "docs_hooks.py").as_posix()
    (tmp_path / "mkdocs.yml").write_text(f"site_name: t\nstrict: true\nhooks: ['{hooks}']\n{config}", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": "", "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [str(MKDOCS), "build", "-f", str(tmp_path / "mkdocs.yml")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.skipif(not MKDOCS.exists(), reason="no docs environment: `make docs` makes .venv-docs")
def test_links_to_repository_files_work_and_broken_ones_fail(tmp_path: Path) -> None:
    good = _site(tmp_path, "# Home\n\n[the data](../data.txt)\n")
    assert good.returncode == 0, good.stderr
    assert (tmp_path / "site" / "repo" / "data.txt").read_text(encoding="utf-8") == "beside the docs\n"
    assert 'href="repo/data.txt"' in (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    broken = _site(tmp_path, "# Home\n\n[the data](../data.txt) and [gone](../gone.txt)\n")
    assert broken.returncode != 0 and "gone.txt" in broken.stderr, broken.stderr


# A hook after the site's own: it keeps the Markdown each page was built from, for the checks.
DUMP_HOOK = """
from pathlib import Path

def on_page_markdown(markdown, page, config, files):
    out = Path(config["config_file_path"]).parent / "dumped" / page.file.src_uri
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown, encoding="utf-8")
    return markdown
"""

ONE = "# One (`bench/one.py`)\n\n- date: 2026-01-02 03:04 UTC; machine: nproc 2 (a CPU; of a kind), 1 GiB RAM\n\n"
ONE += "| a | b |\n|---|---|\n| 1 | 2 |\n"
# A plot as the bench scripts link it, from the repository's root (for BENCHMARK.md's copy).
TWO = "# Two\n\nNo date, no machine.\n\n![plot](bench/results/two.png)\n"


def left_out(results: list[Path], pages: dict[str, str]) -> list[str]:
    """The result files no page was built from: a page starts with the file's title and holds the
    rest of its text (the date, machine and method come between; plot links are relinked)."""

    def shown(path: Path, page: str) -> bool:
        title, _, rest = path.read_text(encoding="utf-8").split("\n![", 1)[0].partition("\n")
        return page.startswith(title + "\n") and rest in page

    return [p.name for p in results if not any(shown(p, page) for page in pages.values())]


@pytest.mark.skipif(not MKDOCS.exists(), reason="no docs environment: `make docs` makes .venv-docs")
def test_every_result_file_is_a_page_with_its_date_machine_and_method(tmp_path: Path) -> None:
    results = tmp_path / "bench" / "results"
    results.mkdir(parents=True)
    (results / "one.md").write_text(ONE, encoding="utf-8")
    (results / "two.md").write_text(TWO, encoding="utf-8")
    (results / "two.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (tmp_path / "dump.py").write_text(DUMP_HOOK, encoding="utf-8")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n", encoding="utf-8")
    (tmp_path / "docs" / "figures.md").write_text(f"# Figures\n\n{docs_hooks.RESULTS_MARKER}\n", encoding="utf-8")
    hooks = [(ROOT / "scripts" / "docs_hooks.py").as_posix(), (tmp_path / "dump.py").as_posix()]
    config = f"site_name: t\nstrict: true\nhooks: {hooks}\nnav:\n  - index.md\n  - Figures:\n    - figures.md\n"
    (tmp_path / "mkdocs.yml").write_text(config, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": "", "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run(
        [str(MKDOCS), "build", "-f", str(tmp_path / "mkdocs.yml")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    pages = {
        p.relative_to(tmp_path / "dumped").as_posix(): p.read_text(encoding="utf-8")
        for p in (tmp_path / "dumped").rglob("*.md")
    }
    assert left_out(sorted(results.glob("*.md")), pages) == []
    # The check sees a result file left out of the site.
    assert left_out(sorted(results.glob("*.md")), {k: v for k, v in pages.items() if "two" not in k}) == ["two.md"]
    one = pages["repo/bench/results/one.md"]
    assert "Date: 2026-01-02 03:04 UTC. Machine: nproc 2 (a CPU; of a kind), 1 GiB RAM. Method: `bench/one.py`." in one
    assert f"Date: {docs_hooks.NOT_STATED}. Machine: {docs_hooks.NOT_STATED}." in pages["repo/bench/results/two.md"]
    table = pages["figures.md"]
    assert "| [One (one)](repo/bench/results/one.md) | 2026-01-02 03:04 UTC | `bench/one.py` |" in table, table
    site = tmp_path / "site"
    assert '<img alt="plot" src="../two.png"' in (site / "repo" / "bench" / "results" / "two" / "index.html").read_text(
        encoding="utf-8"
    )
    assert (site / "repo" / "bench" / "results" / "two.png").exists()
    assert "One (one)" in (site / "index.html").read_text(encoding="utf-8")  # in the nav


def test_the_figures_page_shows_every_result_file_of_the_repository() -> None:
    assert (ROOT / "docs" / "figures.md").read_text(encoding="utf-8").count(docs_hooks.RESULTS_MARKER) == 1
    assert docs_hooks.result_files() == sorted((ROOT / "bench" / "results").glob("*.md"))


def test_sphinx_roles_in_docstrings_show_as_code_or_links() -> None:
    """The API pages show ``:func:`trash_panda.plan``` as code, not as the role's markup, and link
    it where the target is found."""
    roles_as_code = docs_hooks.roles_as_code
    text = "see :func:`trash_panda.plan`, :class:`~.registry.HookRegistry` and :meth:`.Plan.edit`"
    assert roles_as_code(text) == "see `trash_panda.plan`, `HookRegistry` and `Plan.edit`"
    assert roles_as_code("no roles: `x`") == "no roles: `x`"
    found = {"trash_panda.plan": "trash_panda.plan.plan", ".registry.HookRegistry": "p.registry.HookRegistry"}
    linked = docs_hooks.roles_as_refs(text, found.get)
    assert linked == (
        'see <autoref identifier="trash_panda.plan.plan" optional><code>trash_panda.plan</code></autoref>, '
        '<autoref identifier="p.registry.HookRegistry" optional><code>HookRegistry</code></autoref> and `Plan.edit`'
    )


ROLES_PACKAGE = {
    "__init__.py": ('"""A package."""\n\nfrom .tools import shown, tool\n\n__all__ = ["shown", "tool"]\n'),
    "tools.py": (
        '"""Tools."""\n\n\n'
        "def shown() -> None:\n"
        '    """Calls :func:`tool`, :class:`~.hidden.Thing` and :func:`not_there`."""\n\n\n'
        "def tool() -> None:\n"
        '    """A tool; see :func:`pkg.shown`."""\n'
    ),
    "hidden.py": '"""Not on any page."""\n\n\nclass Thing:\n    """A thing."""\n',
}


@pytest.mark.skipif(not MKDOCS.exists(), reason="no docs environment: `make docs` makes .venv-docs")
def test_roles_link_to_documented_names_and_stay_code_otherwise(tmp_path: Path) -> None:
    """The extension in a real build: a role to a name the page shows is a link, one to an
    object no page shows (or to none at all) is code, and the strict build stays clean."""
    (tmp_path / "pkg").mkdir()
    for name, text in ROLES_PACKAGE.items():
        (tmp_path / "pkg" / name).write_text(text, encoding="utf-8")
    roles = (ROOT / "scripts" / "griffe_roles.py").as_posix()
    config = (
        "use_directory_urls: false\nplugins:\n  - mkdocstrings:\n      handlers:\n        python:\n"
        f"          paths: [.]\n          options:\n            extensions: ['{roles}:SphinxRoles']\n"
        "            show_source: false\n"
    )
    built = _site(tmp_path, "# API\n\n::: pkg\n", config)
    assert built.returncode == 0, built.stderr
    page = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert re.search(r'<a class="autorefs[^"]*"[^>]*href="#pkg\.tool"><code>tool</code></a>', page), page
    assert re.search(r'href="#pkg\.shown"><code>pkg\.shown</code></a>', page)
    assert '<span title="pkg.hidden.Thing"><code>Thing</code></span>' in page
    assert "<code>not_there</code>" in page and ":func:" not in page
