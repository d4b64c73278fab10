"""Every public name has a description for the site's API pages, and every public module a page.

Public: the names in ``trash_panda.__all__``, in the ``__all__`` of the modules it exports (and
of :mod:`trash_panda.settings`), the public methods and properties of those classes, and the
classes and functions of ``_core.pyi``. The site reads ``_core`` from its stub, without
importing it, so there the stub's own docstring is what counts.
"""

from __future__ import annotations

import ast
import inspect
import types

import trash_panda
import trash_panda.settings
from doc_examples import ROOT

STUB = ROOT / "python" / "trash_panda" / "_core.pyi"
API_PAGES = ROOT / "docs" / "api"

# The names of _core.pyi that have no docstring in the stub yet (their Rust functions have doc
# comments, which the stub does not repeat). This list may only shrink: a name documented in the
# stub must leave it, and a new undocumented name fails the test.
STUB_UNDOCUMENTED = {
    "Allowance", "AllowanceStats", "BlockPlan", "Budgets", "Checkpoint", "DriveRate", "Engine",
    "EngineConfig", "EngineStats", "Free", "HeldPlace", "Holds", "Lease", "LoadReport", "OrderRead",
    "Plan", "ReadLane", "Replan", "RssSampler", "StageRecord", "StagedTensor", "Staging",
    "TensorBytes", "TensorInfo", "TierLoad", "asked_staging_buffers", "available_ram",
    "cached_bytes", "cast", "check_block_prefixes", "cli_main", "clock", "current_rss",
    "drop_cache", "dtype_header_name", "expand", "file_to_write", "full_order",
    "infer_compute_dtype", "is_float_dtype", "is_scale_name", "make_plan", "measure_drive",
    "needs_expansion", "order_file_path", "order_to_write", "paired_scale", "parse_size",
    "pipeline_report", "private_memory", "profile_report", "quantize_fp8", "read_block",
    "read_order_file", "read_tensors", "replan", "rows_cols", "scale_layout", "setting", "settings",
    "staging_buffers", "storage_conversion", "tier_name", "trim_heap", "weight_of_scale",
    "write_order_file",
}  # fmt: skip


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
    assert {m.__name__ for m in public_modules()} | {"trash_panda._core"} == directives
