"""The rule of who gives memory to a stage that needs more, as the runner asks the core for it."""

from __future__ import annotations

import pytest

from trash_panda import _core
from trash_panda.errors import ArgumentError

GB = 10**9


def ram(n: int) -> _core.Holds:
    return _core.Holds(ram=n)


def holder(name: str, index: int, held: int, *, has_run: bool = True) -> _core.Holder:
    return _core.Holder(name, index, ram(held), held, has_run)


def test_the_stage_needed_again_last_gives_first_by_blocks_then_the_next_whole() -> None:
    # llm, text, transformer, vae: the transformer needs 1 GB; text's next turn is the furthest.
    got = _core.make_room(2, 4, ram(GB), [holder("llm", 0, 2 * GB), holder("text", 1, GB // 2)], keep=True)
    assert [(g.stage, g.whole, g.blocks) for g in got] == [("text", True, 0), ("llm", False, GB // 2)]
    # Keeping nothing, every giver goes whole.
    got = _core.make_room(2, 4, ram(GB), [holder("llm", 0, 2 * GB), holder("text", 1, GB // 2)], keep=False)
    assert [(g.stage, g.whole) for g in got] == [("text", True), ("llm", True)]


def test_a_stage_offered_wrongly_is_an_argument_error_naming_it() -> None:
    with pytest.raises(ArgumentError, match='holder "vae": stage index 5 is not in a pipeline of 4 stages'):
        _core.make_room(0, 4, ram(1), [holder("vae", 5, 1)], keep=True)
    with pytest.raises(ArgumentError, match='stage "llm" needs room'):
        _core.make_room(0, 4, ram(1), [holder("llm", 0, 1)], keep=True)
