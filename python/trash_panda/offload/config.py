"""The tuning settings, where the spec's users look for them; they live in :mod:`trash_panda.settings`."""

from __future__ import annotations

from ..settings import DEFAULTS, describe, setting

__all__ = ["DEFAULTS", "describe", "setting"]
