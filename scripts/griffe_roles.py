"""A Griffe extension for the site's API pages: the package's docstrings name other objects with
Sphinx roles (``:func:`trash_panda.plan```, ``:class:`~.registry.HookRegistry```), which
mkdocstrings would show as written. Each becomes inline code with the name a reader knows (the
full path, or the last part where the role asks for it with ``~``), linked to the object's entry
where the package has that object; an object no API page shows stays plain code.

Names are looked up once the whole package is loaded, as Sphinx does: a leading dot is relative
to the docstring's module and its parents; a bare name is looked up in the docstring's scope
(its class, its module's imports), then among the package's exports.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import griffe

sys.path.insert(0, str(Path(__file__).resolve().parent))
from docs_hooks import roles_as_refs  # plain Python, tested without Griffe


def _walk(obj: griffe.Object) -> Iterator[griffe.Object]:
    yield obj
    for member in obj.members.values():
        if not member.is_alias:  # an alias's docstring is its target's, walked where it is defined
            yield from _walk(member)  # type: ignore[arg-type]


def _find(pkg: griffe.Module, path: str) -> Any:
    """The package's object at ``path`` (an alias followed to its target), or None."""
    if path != pkg.path and not path.startswith(f"{pkg.path}."):
        return None
    obj: Any = pkg
    for part in path.split(".")[1:]:
        try:
            obj = obj.members[part]
            if obj.is_alias:
                obj = obj.final_target
        except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            return None
    return obj


def _exists(pkg: griffe.Module, path: str) -> bool:
    return _find(pkg, path) is not None


def _function_over_module(pkg: griffe.Module, path: str) -> str:
    """``path``, or where it names a module that holds a function of the same name, that
    function: ``trash_panda.plan`` is the function at runtime (the package imports it over its
    module), which Griffe takes for the module."""
    found = _find(pkg, path)
    if found is not None and found.is_module:
        inner = found.members.get(found.name)
        if inner is not None and not inner.is_alias and inner.is_function:
            return f"{found.path}.{found.name}"
    return path


def target(obj: griffe.Object, pkg: griffe.Module, written: str) -> str | None:
    """The full path of the object a role in ``obj``'s docstring names, or None."""
    if written.startswith("."):
        module: Any = obj.module
        while module is not None:
            if _exists(pkg, module.path + written):
                return module.path + written
            module = module.parent
        return None
    if _exists(pkg, written):
        return _function_over_module(pkg, written)
    head, _, rest = written.partition(".")
    try:
        found = obj.resolve(head) + (f".{rest}" if rest else "")
    except griffe.NameResolutionError:
        found = f"{pkg.path}.{written}"
    # A name the package exports at its top is shown there: link to that entry.
    exported = f"{pkg.path}.{written}"
    if found != exported and _exists(pkg, exported):
        return _function_over_module(pkg, exported)
    return _function_over_module(pkg, found) if _exists(pkg, found) else None


class SphinxRoles(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for obj in _walk(pkg):
            if obj.docstring is not None:
                obj.docstring.value = roles_as_refs(obj.docstring.value, lambda w, o=obj: target(o, pkg, w))
