"""The troubleshooting page's "Warnings" section is checked against the code that gives them: each
entry quotes a piece of a warning's text as the code writes it, so a reworded warning fails here
until the page follows, and every warning the library gives has an entry saying what to do.

The warnings are the ``warnings.warn`` calls of the Python package, the plan's warnings
(``crates/trash-panda/src/plan/warnings.rs``) and the order file's (``order/mod.rs``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from support.doc_pages import HOLE, PAGE, ROOT, Site, gaps

PACKAGE = ROOT / "python" / "trash_panda"
RUST = [
    ROOT / "crates" / "trash-panda" / "src" / "plan" / "warnings.rs",
    ROOT / "crates" / "trash-panda" / "src" / "order" / "mod.rs",
]

# Calls whose text is made elsewhere, with where: the entry for that text covers them.
TEXT_FROM_ELSEWHERE = {"offload/order.py:60": "the order file's own warning, order/mod.rs"}


def python_sites(package: Path = PACKAGE) -> list[Site]:
    sites = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            func = node.func if isinstance(node, ast.Call) else None
            if not (isinstance(func, ast.Attribute) and func.attr == "warn" and isinstance(func.value, ast.Name)):
                continue
            if func.value.id != "warnings" or not isinstance(node, ast.Call) or not node.args:
                continue
            sites.append(Site(f"{path.relative_to(package).as_posix()}:{node.lineno}", _literal(node.args[0])))
    return sites


def _literal(arg: ast.expr) -> str:
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else HOLE for v in arg.values)  # type: ignore[misc]
    return HOLE


def rust_sites(files: list[Path] = RUST, root: Path = ROOT) -> list[Site]:
    """The first string of each ``format!`` in the files: a warning's text (a line ending in a
    backslash goes on after the next line's indent, as in Rust)."""
    sites = []
    for path in files:
        source = path.read_text(encoding="utf-8")
        for m in re.finditer(r'format!\(\s*"((?:[^"\\]|\\.)*)"', source, flags=re.S):
            text = re.sub(r"\\\n\s*", "", m.group(1)).replace('\\"', '"')
            text = re.sub(r"\{[^{}]*\}", HOLE, text)
            line = source.count("\n", 0, m.start()) + 1
            sites.append(Site(f"{path.relative_to(root).as_posix()}:{line}", text))
    return sites


def test_every_warning_has_an_entry_and_every_entry_is_a_warning() -> None:
    sites = python_sites() + rust_sites()
    assert len(rust_sites()) >= 9, "the plan's and the order file's warnings were not found"
    stale, missing = gaps(PAGE.read_text(encoding="utf-8"), sites, TEXT_FROM_ELSEWHERE)
    assert stale == [], f"troubleshooting.md quotes text no warning has (reworded?): {stale}"
    assert missing == [], f"warnings with no entry in troubleshooting.md: {missing}"
    # The calls whose text comes from elsewhere are still there, with no text of their own.
    here = {s.where: s.text for s in python_sites()}
    for where in TEXT_FROM_ELSEWHERE:
        assert here.get(where) == HOLE, f"{where} moved or has text of its own now: {here.get(where)!r}"


def test_the_check_fails_on_a_reworded_warning_and_on_a_new_one(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "m.py").write_text(
        'import warnings\nwarnings.warn(f"the cache of {n} blocks is cold; warm it first")\n'
        'warnings.warn("a brand new warning nobody wrote down")\n',
        encoding="utf-8",
    )
    rust = tmp_path / "w.rs"
    rust.write_text(
        'x => format!(\n    "the tier takes {} but \\\n     its budget is {}",\n    a, b),\n', encoding="utf-8"
    )
    sites = python_sites(package) + rust_sites([rust], tmp_path)
    page = (
        "# T\n\n## Warnings\n\n- `blocks is cold; warm it`: warm it.\n- `but its budget is`: lower it.\n"
        "- `the cache is frozen`: gone.\n"
    )
    stale, missing = gaps(page, sites, {})
    assert stale == ["the cache is frozen"]
    assert missing == ["m.py:3: 'a brand new warning nobody wrote down'"]
