"""Every public name has a description for the site's API pages, and every public module a page.

Public: the names in ``trash_panda.__all__``, in the ``__all__`` of the modules it exports (and
of :mod:`trash_panda.settings`), the public methods and properties of those classes, and the
classes and functions of ``_core.pyi``. The site reads ``_core`` from its stub, without
importing it, so there the stub's own docstring is what counts.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import types

import trash_panda
import trash_panda.settings
from support.doc_examples import ROOT
from trash_panda import _core

# The writer of the stub's docstrings is a script of the repository, loaded from its file.
_spec = importlib.util.spec_from_file_location("stub_docs", ROOT / "scripts" / "stub_docs.py")
assert _spec is not None and _spec.loader is not None
stub_docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stub_docs)

STUB = ROOT / "python" / "trash_panda" / "_core.pyi"
API_PAGES = ROOT / "docs" / "api"

# The names of _core.pyi with no docstring in the stub. The stub's docstrings are the runtime
# ones (the Rust doc comments), written in by scripts/stub_docs.py; a name lands here only if its
# Rust item has no doc comment. This list may only shrink: a name documented in the stub must
# leave it, and a new undocumented name fails the test.
STUB_UNDOCUMENTED: set[str] = set()
# The exported functions whose names are also modules of the package: the API page has a
# directive for each (docs/api/trash_panda.md says why).
SHADOWED = {"trash_panda.plan.plan", "trash_panda.stage.stage", "trash_panda.offload.release.release"}


def public_modules() -> list[types.ModuleType]:
    exported = [getattr(trash_panda, n) for n in trash_panda.__all__]
    return [trash_panda, *(m for m in exported if isinstance(m, types.ModuleType)), trash_panda.settings]


def _own_doc(obj: object) -> bool:
    # __doc__, not inspect.getdoc: a class must say what it is itself, not borrow its base's words.
    return bool((getattr(obj, "__doc__", None) or "").strip())


def undocumented(module: types.ModuleType) -> list[str]:
    """The public names of ``module`` with no docstring; data (a version, a table) has none."""
    missing = [] if _own_doc(module) else [module.__name__]
    for name in module.__all__:
        obj = getattr(module, name)
        if not (isinstance(obj, types.ModuleType) or callable(obj)):
            continue
        if not _own_doc(obj):
            missing.append(f"{module.__name__}.{name}")
        if inspect.isclass(obj) and obj.__module__.startswith("trash_panda"):
            for attr, value in vars(obj).items():
                member = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
                if not attr.startswith("_") and callable(member) and not _own_doc(member):
                    missing.append(f"{module.__name__}.{name}.{attr}")
    return missing


def stub_undocumented(source: str) -> set[str]:
    tree = ast.parse(source)
    defs = (n for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef) and not n.name.startswith("_"))
    return {n.name for n in defs if not ast.get_docstring(n)}


def test_public_names_have_docstrings() -> None:
    assert [name for m in public_modules() for name in undocumented(m)] == []


def test_the_check_finds_an_undocumented_name() -> None:
    module = types.ModuleType("trash_panda.example", "A module.")

    def documented() -> None:
        """Does something."""

    def bare() -> None:
        pass

    class Thing:
        """A thing."""

        def method(self) -> None:
            pass

    Thing.__module__ = module.__name__
    module.documented, module.bare, module.Thing = documented, bare, Thing  # type: ignore[attr-defined]
    module.__all__ = ["documented", "bare", "Thing"]  # type: ignore[attr-defined]
    assert undocumented(module) == ["trash_panda.example.bare", "trash_panda.example.Thing.method"]


def test_stub_names_without_docstrings_only_shrink() -> None:
    missing = stub_undocumented(STUB.read_text(encoding="utf-8"))
    assert missing - STUB_UNDOCUMENTED == set(), "document these in _core.pyi"
    assert STUB_UNDOCUMENTED - missing == set(), "documented now: take them off STUB_UNDOCUMENTED"


def test_the_stub_check_sees_a_docstring() -> None:
    source = 'class A:\n    """Documented."""\n\nclass B: ...\n\ndef f() -> None: ...\n\ndef _private() -> None: ...\n'
    assert stub_undocumented(source) == {"B", "f"}


def test_every_public_module_has_a_page() -> None:
    directives = {
        line.removeprefix(":::").strip()
        for page in API_PAGES.glob("*.md")
        for line in page.read_text(encoding="utf-8").splitlines()
        if line.startswith(":::")
    }
    # Beside the modules, the functions Griffe takes for the modules they share a name with.
    modules = {d for d in directives if d not in SHADOWED}
    assert {m.__name__ for m in public_modules()} | {"trash_panda._core"} == modules
    assert directives >= SHADOWED


def test_the_functions_named_like_modules_are_the_ones_exported() -> None:
    # `from .plan import plan`: at runtime the package's name is the function, and the
    # directive names it by its module (Griffe lists the module under that name).
    for path in SHADOWED:
        module, _, name = path.rpartition(".")
        assert getattr(trash_panda, name) is getattr(importlib.import_module(module), name), path


def test_stub_docstrings_are_the_rust_doc_comments() -> None:
    drift = stub_docs.drift(STUB.read_text(encoding="utf-8"), _core)
    assert drift == [], f"_core.pyi differs from the binding's docs; run `{stub_docs.COMMAND}`:\n" + "\n".join(drift)


def test_every_core_member_has_a_doc() -> None:
    # Each class, function, method, property and attribute of _core the stub declares; stubtest
    # holds the stub to the runtime's names, so a new member is in both.
    missing = stub_docs.undocumented(STUB.read_text(encoding="utf-8"), _core)
    assert missing == [], "give these a /// doc comment in bindings/python/src, then run " + (
        f"`{stub_docs.COMMAND}`: {missing}"
    )


def test_the_member_check_finds_an_undocumented_member() -> None:
    source = '''class A:
    """A thing."""

    size: int
    count: int
    @property
    def x(self) -> int: ...
    @x.setter
    def x(self, value: int) -> None: ...
    def f(self) -> None: ...
    def g(self) -> None: ...
    def __len__(self) -> int: ...

def h() -> None: ...
'''

    def documented(self: object) -> None:
        """Does something."""

    def bare(self: object) -> None:
        pass

    class Runtime:
        # The setter of `x` and the dunder need no doc of their own; `count`, `g` and `h` do.
        A = type(
            "A",
            (),
            {
                "__doc__": "A thing.",
                "size": property(doc="Bytes."),
                "count": property(),
                "x": property(lambda self: 1, lambda self, value: None, doc="The x."),
                "f": documented,
                "g": bare,
                "__len__": lambda self: 0,
            },
        )
        h = bare

    assert stub_docs.undocumented(source, Runtime) == ["A.count", "A.g", "h"]


STUB_SOURCE = '''@final
class A:
    @property
    def x(self) -> int: ...

class B:
    """Old words."""

    n: int
    m: str
    """Old words of m."""
    def f(self) -> None: ...

def g(
    n: int,
) -> int: ...
def h() -> None:
    """Gone from the runtime."""
'''


def test_the_drift_check_fails_until_the_script_writes_the_runtime_docs() -> None:
    class Runtime:
        A = type("A", (), {"__doc__": "A thing.", "x": property(doc="The x.")})
        B = type(
            "B",
            (),
            {
                "__doc__": 'New words, on\ntwo lines with a \\ and a quote: "',
                "n": property(doc="Bytes."),
                "m": property(),
            },
        )
        g = type("g", (), {"__doc__": "Doubles `n`."})
        h = type("h", (), {"__doc__": None})

    found = stub_docs.drift(STUB_SOURCE, Runtime)
    assert [line.split(":")[0] for line in found] == ["A", "A.x", "B", "B.n", "B.m", "g", "h"], found
    written = stub_docs.with_docs(STUB_SOURCE, stub_docs.runtime_docs(STUB_SOURCE, Runtime))
    assert stub_docs.drift(written, Runtime) == [], written
    # Written twice, the stub is unchanged, and the members' decorators stay with their members.
    assert stub_docs.with_docs(written, stub_docs.runtime_docs(written, Runtime)) == written
    assert '    """A thing."""\n    @property\n    def x(self) -> int:\n        """The x."""\n' in written, written
    assert "def h() -> None:\n    ...\n" in written, written
    # An attribute's docstring is the string right after it: written there, and taken out when
    # the runtime has none.
    assert '    n: int\n    """Bytes."""\n    m: str\n    def f(self) -> None: ...\n' in written, written
