"""The troubleshooting page's errors are checked against the code that raises them, both ways.

- The core's errors (every ``thiserror`` enum under crates/trash-panda/src) are not written on the
  page at all: scripts/error_docs.py makes that part from each variant's ``#[error]`` message and
  the ``What to do:`` paragraph of its doc comment, and the site's build fails on a variant with
  none (unless ``INTERNAL`` gives the reason no user meets it).
- The Python package's errors, and the binding's own, are quoted on the page by hand, as the
  warnings are (tests/docs/test_troubleshooting.py): a reworded message fails here until the page
  follows, and a new one fails until it has an entry. An ``ArgumentError`` that says what the
  argument takes (``expected ...``) needs none: its message is the fix, and one entry covers
  them. The binding's ``ArgumentError``s check the arguments the package passes to ``_core``;
  those of a user's values (sizes, dtypes, settings) are the core's errors, listed with them."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

import pytest

from support.doc_pages import HOLE, PAGE, ROOT, Site, gaps

# A script of the site, not a module of the package: loaded from its file (registered first, as
# its dataclasses look their module up).
_spec = importlib.util.spec_from_file_location("error_docs", ROOT / "scripts" / "error_docs.py")
assert _spec is not None and _spec.loader is not None
error_docs = importlib.util.module_from_spec(_spec)
sys.modules["error_docs"] = error_docs
_spec.loader.exec_module(error_docs)

PACKAGE = ROOT / "python" / "trash_panda"
BINDING = ROOT / "bindings" / "python" / "src"
SECTION = "### From the Python package"
ARGUMENTS = "### Argument errors"
# The classes of trash_panda.errors a message is raised as (ArgumentError's are checked apart).
CLASSES = {"TrashPandaError", "CheckpointError", "ReadError", "DtypeError", "PlanError", "StreamError"}
CLASSES |= {"OrderError", "SystemProbeError", "TraceError", "ValueError", "RuntimeError", "TypeError", "OSError"}

# Raises whose text is made elsewhere, with where: the entry for that text covers them.
# Named by file and enclosing function, not line, so an edit above them does not move them.
TEXT_FROM_ELSEWHERE = {
    "offload/cleanup.py:done": "the first error of a cleanup, raised again as it was",
    "offload/backends/cpu.py:done": "modified_error() in offload/backends/swap.py builds it (its return is quoted)",
    "offload/matching.py:_scale_kind": "the core's DtypeError::ScaleShape, listed with the core's errors",
    "dtype.py:expand": "the core's DtypeError::ScaleShape, listed with the core's errors",
    "offload/restore.py:check_restore_fits": "refusal() in offload/restore.py builds it (its return is quoted)",
    "trace.py:_trace": "_no_values() in trace.py builds it (its return is quoted)",
}
# Functions that return a message as text for a raise elsewhere: each returned text is quoted.
MESSAGE_BUILDERS = {"refusal"}
# The binding's raises no call can meet: a lock is poisoned only by a panic while it was held,
# itself a bug reported first; the hooks use a lease only while they hold it.
BINDING_INTERNAL = {"map cache poisoned", "engine lock poisoned", "lease lock poisoned", "the lease was released"}


def _text(arg: ast.expr | None) -> str | None:
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else HOLE for v in arg.values)  # type: ignore[misc]
    if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Add):
        left, right = _text(arg.left), _text(arg.right)
        return None if left is None else left + (right if right is not None else HOLE)
    return None


def python_sites(package: Path = PACKAGE) -> tuple[list[Site], list[str]]:
    """(each raise or built exception with its literal text, the raises with no literal text,
    named by file and enclosing function).
    An ArgumentError that says what it expects is left out: its class's entry covers it."""
    sites, opaque = [], []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        functions = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]

        def enclosing(line: int, functions: list[ast.FunctionDef | ast.AsyncFunctionDef] = functions) -> str:
            inside = [f for f in functions if f.lineno <= line <= (f.end_lineno or f.lineno)]
            return max(inside, key=lambda f: f.lineno).name if inside else "<module>"

        for f in ast.walk(tree):
            if isinstance(f, ast.FunctionDef) and f.name in MESSAGE_BUILDERS:
                for r in ast.walk(f):
                    text = _text(r.value) if isinstance(r, ast.Return) and r.value is not None else None
                    if text is not None:
                        sites.append(Site(f"{path.relative_to(package).as_posix()}:{r.lineno}", text))
        for node in ast.walk(tree):
            raised = node.exc if isinstance(node, ast.Raise) else node.value if isinstance(node, ast.Return) else None
            if raised is None:
                continue
            where = f"{path.relative_to(package).as_posix()}:{node.lineno}"
            call = raised if isinstance(raised, ast.Call) else None
            name = call.func.id if call is not None and isinstance(call.func, ast.Name) else None
            if isinstance(node, ast.Return) and name not in CLASSES:
                continue
            known = name in CLASSES or name == "ArgumentError"
            text = _text(call.args[0]) if call is not None and call.args and known else None
            if text is None:
                opaque.append(f"{path.relative_to(package).as_posix()}:{enclosing(node.lineno)}")
            elif name != "ArgumentError" or "expected" not in text:
                sites.append(Site(where, text))
    return sites, opaque


def binding_sites(root: Path = BINDING) -> tuple[list[Site], list[str]]:
    """The binding's own raises, but ArgumentError's: (those with literal text, those without)."""
    sites, opaque = [], []
    for path in sorted(root.glob("*.rs")):
        source = path.read_text(encoding="utf-8")
        found = re.finditer(r"raise\(\s*Kind::(\w+),\s*(format!\(\s*)?(\"(?:[^\"\\]|\\.)*\")?", source, flags=re.S)
        for m in found:
            if m.group(1) == "Argument" or path.name == "errors.rs":
                continue
            where = f"{path.name}:{source.count(chr(10), 0, m.start()) + 1}"
            if m.group(3) is None:
                functions = re.findall(r"\bfn (\w+)", source[: m.start()])
                opaque.append(f"{path.name}:{functions[-1] if functions else '<module>'}")
                continue
            text = re.sub(r"\\\n\s*", "", m.group(3)[1:-1]).replace('\\"', '"')
            sites.append(Site(where, re.sub(r"\{[^{}]*\}", HOLE, text)))
    return sites, opaque


def _sections(page: str) -> str:
    """The page's two sections of quoted errors, one after the other."""
    return "\n".join(page.split(f"\n{title}\n", 1)[1].split("\n#", 1)[0] for title in (ARGUMENTS, SECTION))


def _page_gaps(page: str, sites: list[Site]) -> tuple[list[str], list[str]]:
    # The warnings' check, on these sections' quotes: it reads "## Warnings" by name.
    return gaps(f"\n## Warnings\n{_sections(page)}", sites, {})


def test_every_python_error_has_an_entry_and_every_entry_is_an_error() -> None:
    py, py_opaque = python_sites()
    rs, rs_opaque = binding_sites()
    rs = [s for s in rs if s.text not in BINDING_INTERNAL]
    assert len(py) >= 20 and len(rs) >= 5, "the raises were not found"
    page = PAGE.read_text(encoding="utf-8")
    stale, missing = _page_gaps(page, py + rs)
    assert stale == [], f"troubleshooting.md quotes text no error has (reworded?): {stale}"
    assert missing == [], f"errors with no entry in troubleshooting.md: {missing}"
    # Every raise with no text of its own is one whose text comes from a place named here.
    assert sorted(py_opaque + rs_opaque) == sorted(TEXT_FROM_ELSEWHERE), "a raise's text moved"
    internal = {s.text for s in binding_sites()[0]} & BINDING_INTERNAL
    assert internal == BINDING_INTERNAL, (
        f"no longer raised, take out of BINDING_INTERNAL: {BINDING_INTERNAL - internal}"
    )


def test_the_check_fails_on_a_python_error_with_no_entry(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "def f(x):\n"
        '    raise StreamError(f"block {x} was eaten; feed it again")\n'
        "def g():\n"
        '    raise ArgumentError("x: expected a number")\n'
        "def h():\n"
        '    raise StreamError("a new error nobody wrote down")\n'
        "def i():\n"
        '    raise ArgumentError("x: a new argument error")\n',
        encoding="utf-8",
    )
    sites, opaque = python_sites(tmp_path)
    assert [s.where for s in sites] == ["m.py:2", "m.py:6", "m.py:8"] and opaque == []
    page = f"# T\n\n{ARGUMENTS}\n\n- `gone too`: gone.\n\n{SECTION}\n\n- `was eaten; feed it`: feed it.\n"
    page += "- `gone error`: gone.\n\n## Next\n"
    stale, missing = _page_gaps(page, sites)
    assert stale == ["gone too", "gone error"]
    assert missing == ["m.py:6: 'a new error nobody wrote down'", "m.py:8: 'x: a new argument error'"]


def test_every_core_error_has_advice_or_a_reason() -> None:
    enums = error_docs.core_enums()
    assert sum(len(e.variants) for e in enums) >= 100, "the core's error enums were not found"
    assert error_docs.problems(enums, error_docs.MAPPING.read_text(encoding="utf-8")) == []
    page = PAGE.read_text(encoding="utf-8")
    assert page.count(error_docs.MARKER) == 1, "the page's core errors are made at build time"
    assert "#[error" not in page


SYNTHETIC = """
/// Errors of a made-up module.
#[derive(Debug, thiserror::Error)]
pub enum FakeError {
    /// The widget is {not} there.
    ///
    /// What to do: put it back.
    #[error("widget {name:?} is missing from {}: {{braces}}", path.display())]
    Missing {
        /// The widget.
        name: String,
        /// Where.
        path: PathBuf,
    },
    /// A new error whose doc comment says nothing of what to do.
    #[error(
        "the gadget {} broke \\
         at {at}",
        crate::fmt::list(.parts)
    )]
    Broken { parts: Vec<String>, at: u64 },
    /// Handed on.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
"""
MAPPING = """
Kind::Stream => "StreamError",
impl ToPyErr for FakeError {
    fn to_py(self) -> PyErr {
        match self {
            FakeError::Io(e) => e.to_py(),
            other => raise(Kind::Stream, other.to_string()),
        }
    }
}
"""


def test_the_core_check_fails_on_a_variant_with_no_advice(tmp_path: Path) -> None:
    enums = error_docs.parse(SYNTHETIC, tmp_path / "fake.rs")
    [fake] = enums
    assert [v.name for v in fake.variants] == ["Missing", "Broken", "Io"]
    assert fake.variants[0].template == "widget <name> is missing from <path>: {braces}"
    assert fake.variants[1].template == "the gadget <parts> broke at <at>"
    assert fake.variants[2].template is None
    assert error_docs.python_classes(MAPPING) == {"FakeError": ("StreamError", {"Io": None})}
    found = error_docs.problems(enums, MAPPING, internal={})
    assert found == ["FakeError::Broken (fake.rs:21): no 'What to do:' paragraph in its doc comment"]
    # The build's entry point turns that into a failure naming the variant.
    with pytest.raises(SystemExit, match="FakeError::Broken"):
        error_docs.checked(enums, MAPPING, internal={})
    # Advice (or a reason in INTERNAL) clears it; the page then has both, and the bug apart.
    md = error_docs.markdown(enums, MAPPING, internal={"FakeError::Broken": "it cannot happen"})
    assert "- `widget <name> is missing from <path>: {braces}`: The widget is {not} there." in md
    assert "**What to do:** put it back." in md and "[`StreamError`][trash_panda.errors.StreamError]" in md
    assert "- `the gadget <parts> broke at <at>` (FakeError): it cannot happen." in md
    stale = error_docs.problems(enums, MAPPING, internal={"FakeError::Broken": "x", "FakeError::Gone": "y"})
    assert stale == ["FakeError::Gone: in INTERNAL but no such variant"]
