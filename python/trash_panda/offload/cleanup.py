"""Tearing down in steps that all run: a release that stops at its first error would leave a
model half-loaded (weights in memory, hooks gone), which is worse than the error itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Cleanup"]


class Cleanup:
    """Runs each step even when an earlier one raised; :meth:`done` raises the first error."""

    def __init__(self) -> None:
        self.error: BaseException | None = None

    def run(self, step: Callable[..., Any], *args: Any) -> Any:
        """``step(*args)``, or None once its error is kept (the first one only)."""
        try:
            return step(*args)
        except BaseException as e:  # KeyboardInterrupt too: the rest must still run
            if self.error is None:
                self.error = e
            return None

    def done(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error
