"""The read-ahead's set-up thread of a :class:`~trash_panda.pipeline.Pipeline`: building,
planning and setting up the next stage's load while the running stage computes."""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["Pending"]


class Pending:
    """A stage whose read-ahead is being set up by ``set_up`` on a thread of its own."""

    def __init__(self, name: str, set_up: Callable[[], None]) -> None:
        self.name = name
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(set_up,), name=f"trash-panda-ahead-{name}", daemon=True)
        self._thread.start()

    def _run(self, set_up: Callable[[], None]) -> None:
        try:
            set_up()
        except BaseException as e:  # handed to the caller's thread by join()
            self._error = e

    def is_current(self) -> bool:
        """Whether the caller runs on the set-up's thread."""
        return threading.current_thread() is self._thread

    def join(self) -> BaseException | None:
        """Waits for the set-up; returns why it failed (None: it did not). The error is taken
        off the record: its traceback holds this thread's frames, which hold the record, a
        cycle only a full collection would free."""
        assert not self.is_current(), "a read-ahead cannot wait for itself"
        self._thread.join()
        error, self._error = self._error, None
        return error
