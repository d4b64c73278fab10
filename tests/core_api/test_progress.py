"""The progress bar: hidden for short steps, shown on a terminal after 2 s, off with the setting."""

from __future__ import annotations

import io

import pytest

from trash_panda import progress
from trash_panda.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(stream: io.StringIO) -> str:
    with Progress("loading x", 4_000_000_000, stream=stream) as bar:
        for _ in range(4):
            bar.advance(1_000_000_000)
    return stream.getvalue()


def test_short_steps_print_nothing() -> None:
    assert _run(Terminal()) == ""  # done well within the 2 s delay


def test_shown_on_a_terminal_after_the_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "_DELAY", 0.0)
    monkeypatch.setattr(progress, "_EVERY", 0.0)
    out = _run(Terminal())
    assert out.startswith("\rloading x [") and out.endswith("\n"), out
    assert "4.00/4.00 GB" in out.splitlines()[-1]
    assert "#" * 30 in out


def test_not_on_a_pipe_and_off_with_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "_DELAY", 0.0)
    assert _run(io.StringIO()) == ""  # not a terminal
    monkeypatch.setenv("TRASH_PANDA_PROGRESS", "0")
    assert _run(Terminal()) == ""
