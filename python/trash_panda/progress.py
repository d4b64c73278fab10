"""A progress bar on stderr for long steps (a load, writing a checkpoint).

It stays hidden for the first 2 seconds, so short steps print nothing, and appears only when
stderr is a terminal and the ``progress`` setting is on (``TRASH_PANDA_PROGRESS=0`` turns it off).
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import TextIO

from .settings import setting

__all__ = ["Progress"]

_DELAY = 2.0  # seconds before the bar appears
_EVERY = 0.2  # seconds between two redraws
_WIDTH = 30


class Progress:
    """``with Progress("loading", total_bytes) as bar: ... bar.advance(n)``."""

    def __init__(self, label: str, total: int, *, stream: TextIO | None = None, force: bool = False) -> None:
        self.label = label
        self.total = max(int(total), 1)
        self.done = 0
        self._stream = stream if stream is not None else sys.stderr
        self._on = force or (bool(setting("progress")) and _is_terminal(self._stream))
        self._start = time.perf_counter()
        self._drawn = 0.0
        self.shown = False

    def advance(self, n: int) -> None:
        self.done += int(n)
        if not self._on:
            return
        now = time.perf_counter()
        if now - self._start >= _DELAY and now - self._drawn >= _EVERY:
            self._draw(now)

    def _draw(self, now: float) -> None:
        frac = min(self.done / self.total, 1.0)
        filled = int(frac * _WIDTH)
        elapsed = now - self._start
        rate = self.done / elapsed / 1e9 if elapsed > 0 else 0.0
        self._stream.write(
            f"\r{self.label} [{'#' * filled}{'.' * (_WIDTH - filled)}] {self.done / 1e9:.2f}/{self.total / 1e9:.2f} GB"
            f" {rate:.2f} GB/s {elapsed:.0f} s "
        )
        self._stream.flush()
        self._drawn = now
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self._draw(time.perf_counter())
            self._stream.write("\n")
            self._stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None) -> None:
        self.close()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
