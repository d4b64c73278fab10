"""Tuning settings, each with a default and a ``TRASH_PANDA_<NAME>`` environment variable.

A function's argument wins over the environment, and the environment over the default. The
environment is read each time a setting is asked for, so it can change between two runs.
The table itself lives in the core; ``DEFAULTS`` and ``describe()`` show it.
"""

from __future__ import annotations

from . import _core

__all__ = ["DEFAULTS", "describe", "setting"]

DEFAULTS: dict[str, str] = {s["name"]: s["default"] for s in _core.settings()}


def setting(name: str, argument: object = None) -> bool | int | str:
    """The value of setting ``name``; :class:`ArgumentError` names a bad value and what is accepted."""
    return _core.setting(name, argument)


def describe() -> str:
    """A table of every setting, its variable, default and meaning."""
    rows = [f"{s['variable']:<28} {s['default'] or '-':<6} {s['doc']}" for s in _core.settings()]
    return "\n".join(rows)
