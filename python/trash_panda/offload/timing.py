"""Where the main thread's time went for one block, as the backends measure it for the timing
hook and the profile."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Timing:
    """Where the main thread's time went for one block."""

    staged_wait: float = 0.0  # waiting for the engine to stage the block
    gpu_wait: float = 0.0  # the compute stream's wait for the block's copy (device-timed)
    bytes: int = 0
    expanded: int = 0  # bytes its expansions wrote in the compute dtype
    copy_seconds: float = 0.0  # the copy engine's time for the block's bytes (device-timed)
