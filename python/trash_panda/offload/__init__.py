"""The streaming runtime: stream_load, the offload hooks, release, and the tuning settings."""

from __future__ import annotations

from .. import _core
from . import config
from .empty import empty_weights
from .handle import OffloadHandle, install_offload, offload_blocks
from .load import stream_load
from .release import measure_activation_vram, release

# The report stream_load returns: the core's type, its table formatted by the core.
LoadReport = _core.LoadReport

__all__ = [
    "LoadReport",
    "OffloadHandle",
    "config",
    "empty_weights",
    "install_offload",
    "measure_activation_vram",
    "offload_blocks",
    "release",
    "stream_load",
]
