"""The site's build (scripts/docs_hooks.py, mkdocs.yml): the settings table comes from the core,
a link to a repository file works, and a broken link fails the strict build."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

from doc_examples import ROOT
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


def _site(tmp_path: Path, index: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "docs").mkdir(exist_ok=True)
    (tmp_path / "docs" / "index.md").write_text(index, encoding="utf-8")
    (tmp_path / "data.txt").write_text("beside the docs\n", encoding="utf-8")
    hooks = (ROOT / "scripts" / "docs_hooks.py").as_posix()
    (tmp_path / "mkdocs.yml").write_text(f"site_name: t\nstrict: true\nhooks: ['{hooks}']\n", encoding="utf-8")
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
