"""A Griffe extension for the site's API pages: the package's docstrings name other objects with
Sphinx roles (``:func:`trash_panda.plan```, ``:class:`~.registry.HookRegistry```), which
mkdocstrings shows as written. Each becomes inline code with the name a reader knows: the full
path, or the last part where the role asks for it (``~``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import griffe

sys.path.insert(0, str(Path(__file__).resolve().parent))
from docs_hooks import roles_as_code  # plain Python, tested without Griffe


class SphinxRoles(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = roles_as_code(obj.docstring.value)
