"""The tuning settings, where the spec's users look for them; they live in :mod:`trash_panda.config`."""

from __future__ import annotations

from ..config import DEFAULTS, describe, setting

__all__ = ["DEFAULTS", "describe", "setting"]
