"""Writes the runtime docstrings of ``trash_panda._core`` into its stub, ``_core.pyi``.

The binding builds each class's and function's ``__doc__`` from the Rust doc comments; the site
reads ``_core`` from the stub without importing it, so the stub has to carry the same words. Run
this after changing a doc comment (tests/test_api_docs.py fails until it is run):

    .venv/bin/python scripts/stub_docs.py

The module's own classes and functions are written, and the public methods and properties of its
classes (``Class.member``: a property's doc is its getter's; a setter gets none, as the site
shows the property once). A name whose runtime doc is empty gets no docstring, and one the stub
documents by itself is replaced, so the runtime doc always wins.
"""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from docs_hooks import load_core  # noqa: E402  (the extension alone, as the site build loads it)

STUB = ROOT / "python" / "trash_panda" / "_core.pyi"
COMMAND = ".venv/bin/python scripts/stub_docs.py"


def normal(doc: str | None) -> str:
    """A docstring as the stub's parser returns it; trailing spaces go, as the formatter drops them."""
    return "\n".join(line.rstrip() for line in inspect.cleandoc(doc or "").splitlines()).strip()


Def = ast.ClassDef | ast.FunctionDef


def _public(nodes: list[ast.stmt]) -> list[Def]:
    return [n for n in nodes if isinstance(n, Def) and not n.name.startswith("_")]


def _is_setter(node: Def) -> bool:
    return any(isinstance(d, ast.Attribute) and d.attr in ("setter", "deleter") for d in node.decorator_list)


def _documented(tree: ast.Module) -> list[tuple[str, Def]]:
    """Each public class and function with its name, and each public member of a class as
    ``Class.member`` (its property setters left out: the getter holds the property's doc)."""
    found: list[tuple[str, Def]] = []
    for node in _public(tree.body):
        found.append((node.name, node))
        if isinstance(node, ast.ClassDef):
            found += [(f"{node.name}.{m.name}", m) for m in _public(node.body) if not _is_setter(m)]
    return found


def runtime_docs(source: str, module: ModuleType) -> dict[str, str]:
    """The runtime doc of each public class, function and member of the stub (empty when it has
    none)."""
    return {name: _runtime(module, name) for name, _ in _documented(ast.parse(source))}


def _runtime(module: ModuleType, name: str) -> str:
    obj: object = module
    for part in name.split("."):
        obj = getattr(obj, part, None)
    return normal(getattr(obj, "__doc__", None))


def drift(source: str, module: ModuleType) -> list[str]:
    """The names whose stub docstring is not the runtime one, each with what differs."""
    found = []
    for name, node in _documented(ast.parse(source)):
        want, have = _runtime(module, name), normal(ast.get_docstring(node))
        if want != have:
            found.append(f"{name}: stub {have[:60]!r}, runtime {want[:60]!r}")
    return found


def _literal(doc: str, indent: str) -> str:
    # Escaped so the parser reads back the very text; the closing quotes go on their own line
    # for a doc of several lines, as the formatter would put them.
    text = doc.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    if text.endswith('"'):
        text = text[:-1] + '\\"'
    lines = text.split("\n")
    if len(lines) == 1:
        return f'{indent}"""{text}"""'
    rest = [f"{indent}{line}" if line else "" for line in lines[1:]]
    return "\n".join([f'{indent}"""{lines[0]}', *rest, f'{indent}"""'])


def with_docs(source: str, docs: dict[str, str]) -> str:
    """``source`` with the docstring of each class, function and member in ``docs`` set to its value."""
    lines = source.split("\n")
    nodes = [(name, n) for name, n in _documented(ast.parse(source)) if name in docs]
    # Bottom up: an edit changes the line numbers of what follows it, never of what precedes (a
    # class's members come after its own first line, so they are written before it).
    for name, node in sorted(nodes, key=lambda named: named[1].lineno, reverse=True):
        doc, first = docs[name], node.body[0]
        indent = " " * (node.col_offset + 4)
        old = ast.get_docstring(node, clean=False) is not None
        # A decorated first member starts at its first decorator, above its `def`.
        start = min([first.lineno, *(d.lineno for d in getattr(first, "decorator_list", []))]) - 1
        end = (first.end_lineno or first.lineno) - 1
        head, tail = lines[start][: first.col_offset], lines[end][first.end_col_offset or 0 :]
        inline = start == first.lineno - 1 and head.strip() != ""  # `def f() -> int: ...` or `class A: """doc"""`
        if not doc and not old:
            continue
        # A docstring taken out of a body that had nothing else leaves `...`: a body cannot be empty.
        body = [_literal(doc, indent)] if doc else [f"{indent}..."] if len(node.body) == 1 else []
        if inline:
            # The docstring takes the place of the one-line body (`...`); a comment after it stays.
            lines[start : end + 1] = [head.rstrip(), *body] + ([indent + tail.strip()] if tail.strip() else [])
        elif old:
            lines[start : end + 1] = body
        else:
            lines[start:start] = body
    return "\n".join(lines)


def main() -> int:
    source = STUB.read_text(encoding="utf-8")
    module = load_core()
    updated = with_docs(source, runtime_docs(source, module))
    if drift(updated, module):
        print("stub_docs: the stub still differs:\n" + "\n".join(drift(updated, module)), file=sys.stderr)
        return 1
    if updated != source:
        STUB.write_text(updated, encoding="utf-8")
        # The blank lines around the new docstrings are the formatter's to choose (`make lint`).
        subprocess.run([sys.executable, "-m", "ruff", "format", "--quiet", str(STUB)], check=True)
    empty = sorted(n for n, d in runtime_docs(updated, module).items() if not d)
    print(f"stub_docs: {STUB.relative_to(ROOT)} matches the runtime docs; no runtime doc: {empty or 'none'}")
    print(f"stub_docs: {len(empty)} of {len(runtime_docs(updated, module))} names have no runtime doc")
    return 0


if __name__ == "__main__":
    sys.exit(main())
