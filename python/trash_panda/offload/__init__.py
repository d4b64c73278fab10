"""The streaming runtime: settings now; stream_load and the offload hooks build on them."""

from __future__ import annotations

from . import config

__all__ = ["config"]
