"""The torch layer's modules import each other without a circle, and none reads another's private
names: the Python side of the core's ``module_graph.rs``.

Every import counts, also one inside a function (it runs as surely as one at the top, only
later); an import under ``if TYPE_CHECKING:`` does not (it never runs). ``from pkg import name``
points at the submodule ``pkg.name`` when there is one, else at the package itself. The
extension ``_core`` is a leaf and is left out.

A private name is one with a single leading underscore that a module defines: a module-level
name, or an attribute its classes define (``def _x``, ``self._x = ...``, ``_x = ...`` in a
class body). Another module may neither import it nor read it as ``something._x``. Names that
no module of the package defines (torch's own) are not this test's business.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "trash_panda"


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    rel: str  # its path as the failures show it
    imports: dict[str, list[int]] = field(default_factory=dict)  # module -> lines
    private_names: set[str] = field(default_factory=set)  # module-level
    private_attributes: set[str] = field(default_factory=set)  # its classes'


def _name_of(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                skipped.update(id(n) for n in ast.walk(inner))
    return skipped


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def read_package(root: Path) -> dict[str, Module]:
    """Every module under ``root`` with the project modules it imports and the private names it
    defines."""
    modules: dict[str, Module] = {}
    # Extension modules (their stubs name them): leaves, left out of the graph.
    native = {_name_of(p.with_suffix(".py"), root) for p in root.rglob("*.pyi")}
    for path in sorted(root.rglob("*.py")):
        name = _name_of(path, root)
        rel = path.relative_to(root.parent).as_posix()
        modules[name] = Module(name, path, ast.parse(path.read_text(), str(path)), rel)
    for m in modules.values():
        is_package = m.path.name == "__init__.py"
        skipped = _type_checking_nodes(m.tree)
        for node in ast.walk(m.tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.ImportFrom):
                base = _absolute(m.name, is_package, node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in native:
                        continue
                    target = sub if sub in modules else base
                    if target in modules and target != m.name:
                        m.imports.setdefault(target, []).append(node.lineno)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules and alias.name != m.name and alias.name not in native:
                        m.imports.setdefault(alias.name, []).append(node.lineno)
        m.private_names = _private_defs(m.tree.body)
        for node in ast.walk(m.tree):
            if isinstance(node, ast.ClassDef):
                m.private_attributes |= _private_defs(node.body)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _private(node.attr):
                m.private_attributes.add(node.attr)
    return modules


def _private_defs(body: list[ast.stmt]) -> set[str]:
    """The private names a module's or a class's body defines."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return {n for n in names if _private(n)}


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def circles(modules: dict[str, Module]) -> list[list[str]]:
    """The strongly connected groups of two or more modules (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in modules[v].imports:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(modules):
        if v not in index:
            visit(v)
    return found


def describe_circle(modules: dict[str, Module], group: list[str]) -> str:
    inside = set(group)
    lines = [f"circle of {len(group)} modules:"]
    for name in group:
        m = modules[name]
        for target, at in sorted(m.imports.items()):
            if target in inside:
                lines.append(f"  {name} -> {target}  ({m.rel}:{', '.join(map(str, at))})")
    return "\n".join(lines)


def private_reads(modules: dict[str, Module]) -> list[str]:
    """Each place a module imports or reads a private name that another module defines."""
    owners: dict[str, set[str]] = {}
    for m in modules.values():
        for name in m.private_attributes:
            owners.setdefault(name, set()).add(m.name)
    found: list[str] = []
    for m in modules.values():
        is_package = m.path.name == "__init__.py"
        bound: dict[str, str] = {}  # a name this module binds to a module of the package
        for node in ast.walk(m.tree):
            if isinstance(node, ast.ImportFrom):
                base = _absolute(m.name, is_package, node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in modules:
                        bound[alias.asname or alias.name] = sub
                    elif base in modules and alias.name in modules[base].private_names:
                        found.append(f"{m.rel}:{node.lineno}: imports {alias.name} from {base}")
        for node in ast.walk(m.tree):
            if not isinstance(node, ast.Attribute) or not _private(node.attr) or isinstance(node.ctx, ast.Store):
                continue
            target = bound.get(node.value.id) if isinstance(node.value, ast.Name) else None
            if target is not None and node.attr in modules[target].private_names:
                found.append(f"{m.rel}:{node.lineno}: reads {ast.unparse(node)}, private to {target}")
            elif m.name not in owners.get(node.attr, {m.name}):
                who = ", ".join(sorted(owners[node.attr]))
                found.append(f"{m.rel}:{node.lineno}: reads {ast.unparse(node)}, private to {who}")
    return sorted(found)


def test_no_import_circle() -> None:
    modules = read_package(PACKAGE)
    found = circles(modules)
    assert not found, "\n".join(describe_circle(modules, g) for g in found)


def test_no_module_reads_another_modules_private_names() -> None:
    found = private_reads(read_package(PACKAGE))
    assert not found, "\n".join(found)


@pytest.fixture
def package(tmp_path: Path) -> Path:
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("")
    return root


def test_a_circle_through_a_function_level_import_is_caught(package: Path) -> None:
    (package / "a.py").write_text("from .sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from ..a import thing\n")
    found = circles(read_package(package))
    assert found == [["pkg.a", "pkg.sub.b"]]


def test_an_import_under_type_checking_is_no_arrow(package: Path) -> None:
    (package / "a.py").write_text("from .sub import b\n")
    (package / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import thing\n"
    )
    assert circles(read_package(package)) == []


def test_reading_another_modules_private_name_is_caught(package: Path) -> None:
    (package / "a.py").write_text(
        "def _helper(): ...\nclass A:\n    def _hidden(self): ...\n    def ok(self): self._hidden()\n"
    )
    (package / "b.py").write_text("from .a import _helper\ndef f(x):\n    return x._hidden()\n")
    found = private_reads(read_package(package))
    assert len(found) == 2 and "imports _helper from pkg.a" in found[0] and "x._hidden, private to pkg.a" in found[1]
