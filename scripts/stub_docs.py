"""Writes the runtime docstrings of ``trash_panda._core`` into its stub, ``_core.pyi``.

The binding builds each class's and function's ``__doc__`` from the Rust doc comments; the site
reads ``_core`` from the stub without importing it, so the stub has to carry the same words. Run
this after changing a doc comment (tests/docs/test_api_docs.py fails until it is run):

    .venv/bin/python scripts/stub_docs.py

The module's own classes and functions are written, and the public methods and properties of its
classes (``Class.member``: a property's doc is its getter's; a setter gets none, as the site
shows the property once), and the attributes a class declares (``seconds: float``, a property
with a setter), each followed by its docstring. A name whose runtime doc is empty gets no
docstring, and one the stub documents by itself is replaced, so the runtime doc always wins.

Every one of these names must have a runtime doc: the script lists those that have none, and
tests/docs/test_api_docs.py fails on them (a setter and a dunder method need none).
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


def _attributes(cls: ast.ClassDef) -> list[tuple[str, ast.AnnAssign, ast.Expr | None]]:
    """Each public attribute the class declares (``name: type``), with the string statement
    right after it, its docstring, or None."""
    found = []
    for node, after in zip(cls.body, [*cls.body[1:], None], strict=True):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and not node.target.id.startswith("_"):
            doc = (
                after if isinstance(after, ast.Expr) and isinstance(getattr(after.value, "value", None), str) else None
            )
            found.append((f"{cls.name}.{node.target.id}", node, doc))
    return found


def _all_attributes(tree: ast.Module) -> list[tuple[str, ast.AnnAssign, ast.Expr | None]]:
    return [a for node in _public(tree.body) if isinstance(node, ast.ClassDef) for a in _attributes(node)]


def _attribute_doc(doc: ast.Expr | None) -> str:
    return normal(doc.value.value) if doc is not None and isinstance(doc.value, ast.Constant) else ""


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


def _names(tree: ast.Module) -> list[str]:
    """The documented names, in the stub's order."""
    nodes: list[tuple[str, ast.stmt]] = [*_documented(tree), *((n, a) for n, a, _ in _all_attributes(tree))]
    return [name for name, _ in sorted(nodes, key=lambda named: named[1].lineno)]


def runtime_docs(source: str, module: ModuleType) -> dict[str, str]:
    """The runtime doc of each public class, function, member and attribute of the stub (empty
    when it has none)."""
    return {name: _runtime(module, name) for name in _names(ast.parse(source))}


def undocumented(source: str, module: ModuleType) -> list[str]:
    """The public classes, functions, members and attributes of the stub with no runtime doc:
    their Rust items have no doc comment. A property's setter and a dunder method are not
    counted (the getter holds the property's doc; the stub leaves dunders out)."""
    return sorted(name for name, doc in runtime_docs(source, module).items() if not doc)


def _runtime(module: ModuleType, name: str) -> str:
    obj: object = module
    for part in name.split("."):
        obj = getattr(obj, part, None)
    return normal(getattr(obj, "__doc__", None))


def drift(source: str, module: ModuleType) -> list[str]:
    """The names whose stub docstring is not the runtime one, each with what differs."""
    tree = ast.parse(source)
    stub = {name: normal(ast.get_docstring(node)) for name, node in _documented(tree)}
    stub |= {name: _attribute_doc(doc) for name, _, doc in _all_attributes(tree)}
    found = []
    for name in _names(tree):
        want, have = _runtime(module, name), stub[name]
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
    tree = ast.parse(source)
    nodes: list[tuple[str, ast.stmt]] = [(name, n) for name, n in _documented(tree) if name in docs]
    attributes = {name: doc for name, _, doc in _all_attributes(tree) if name in docs}
    nodes += [(name, n) for name, n, _ in _all_attributes(tree) if name in docs]
    # Bottom up: an edit changes the line numbers of what follows it, never of what precedes (a
    # class's members come after its own first line, so they are written before it).
    for name, node in sorted(nodes, key=lambda named: named[1].lineno, reverse=True):
        if isinstance(node, ast.AnnAssign):
            _attribute_with_doc(lines, node, attributes[name], docs[name])
            continue
        assert isinstance(node, Def)
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


def _attribute_with_doc(lines: list[str], node: ast.AnnAssign, old: ast.Expr | None, doc: str) -> None:
    """Sets the docstring after attribute ``node`` (``old``, if it has one) to ``doc``, in place."""
    body = [_literal(doc, " " * node.col_offset)] if doc else []
    if old is not None:
        lines[old.lineno - 1 : old.end_lineno or old.lineno] = body
    else:
        end = node.end_lineno or node.lineno
        lines[end:end] = body


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
    empty = undocumented(updated, module)
    print(f"stub_docs: {STUB.relative_to(ROOT)} matches the runtime docs; no runtime doc: {empty or 'none'}")
    print(f"stub_docs: {len(empty)} of {len(runtime_docs(updated, module))} names have no runtime doc")
    if empty:
        print(
            "stub_docs: give each a /// doc comment in bindings/python/src "
            "(tests/docs/test_api_docs.py fails until then)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
