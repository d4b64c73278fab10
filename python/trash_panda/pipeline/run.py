"""PipelineRun: one run of a :class:`~trash_panda.pipeline.Pipeline`, stage by stage."""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from .. import _core
from ..errors import ArgumentError
from .spec import schedule_of

if TYPE_CHECKING:
    from torch import nn

    from ..offload.final_pass import FinalPass
    from .group import GroupTurn
    from .keeper import StageKeeper
    from .loaded import LoadedStage
    from .spec import Calls

__all__ = ["PipelineRun"]


class PipelineRun:
    """One run: :meth:`stage` enters each stage in pipeline order (stages may be skipped,
    never gone back to), :meth:`group` each group of stages run together; :meth:`final_pass`
    wraps the running stage's last call."""

    def __init__(self, keeper: StageKeeper, number: int) -> None:
        self._keeper = keeper
        self.number = number
        self._next = 0  # the first stage that may still run
        self._current: LoadedStage | None = None
        self._in_group: str | None = None  # the group whose turn runs

    @contextlib.contextmanager
    def stage(self, name: str | None = None) -> Iterator[nn.Module]:
        """Starts the stage ``name`` (default: the next one): loads it unless it was read
        ahead or kept, starts reading the stage after it, and yields its model. At the end of
        the block it is kept (when the stage after it does not need its memory) or released,
        its memory going to the stage read ahead."""
        from ..offload.meter import measured

        if self._current is not None:
            raise ArgumentError(f"stage {self._current.name} is still running; stages run one at a time")
        keeper = self._keeper
        index = self._next if name is None else keeper.index(name)
        if index >= len(keeper.stages):
            raise ArgumentError(f"every stage of the pipeline ran in this run ({', '.join(keeper.names())})")
        if index < self._next:
            raise ArgumentError(
                f"stage {name!r} comes before {keeper.stages[self._next - 1].name!r}, which this run reached; "
                "stages run in pipeline order (start a new run to go back)"
            )
        group = keeper.group_of(keeper.stages[index].name)
        if group is not None and self._in_group != group.name:
            raise ArgumentError(
                f"stage {keeper.stages[index].name!r} is a member of group {group.name!r}; "
                f"expected run.group({group.name!r}) to start it"
            )
        self._next = index + 1
        started = time.perf_counter()
        loaded, turn = keeper.start(index)
        self._current = loaded
        failure: BaseException | None = None
        try:
            with measured(keeper.device) as peak:
                yield loaded.model
            turn.peak, turn.overlapped = peak[0], bool(peak[1])
        except BaseException as e:
            failure = e
            raise
        finally:
            self._current = None
            turn.seconds = time.perf_counter() - started
            if failure is None:
                keeper.end(self.number, index, loaded, turn, None)
            else:
                try:
                    keeper.end(self.number, index, loaded, turn, failure)
                except Exception as e:  # the block's error is the one to see
                    warnings.warn(
                        f"ending stage {loaded.name} after the error in its block also failed: {e!r}", stacklevel=3
                    )

    @contextlib.contextmanager
    def group(self, name: str, schedule: Calls | _core.Schedule | None = None) -> Iterator[GroupTurn]:
        """Starts the group ``name`` (see :class:`~trash_panda.Group`) and yields its members'
        models by name. ``schedule`` says which member is called how many times in what
        order in this run (``{"high": 20, "low": 20}``, or ``[("controlnet", 1), ("unet",
        1)] * 30``); without it, the group's own, else the one learned from its last run's
        calls, else none: the members are then loaded together, and this run's calls learned.

        Members that each run in one stretch take turns: one loaded at a time, the next read
        while it runs; with a schedule given, a member's last call frees its blocks as they
        run, for the next member. Members that alternate are loaded at once, planned together:
        the one called most often first, for the budget less the least the others need."""
        from .group import group_turn

        keeper = self._keeper
        group = keeper.groups.get(name) if isinstance(name, str) else None
        if group is None:
            have = ", ".join(keeper.groups) or "none"
            raise ArgumentError(f"group {name!r}: not a group of this pipeline; expected one of its groups ({have})")
        if self._current is not None or self._in_group is not None:
            running = self._current.name if self._current is not None else f"group {self._in_group}"
            raise ArgumentError(f"{running} is still running; expected a group to start once it ends")
        first = min(keeper.index(m) for m in group.members)
        if first < self._next:
            raise ArgumentError(
                f"group {name!r} comes before {keeper.stages[self._next - 1].name!r}, which this run reached; "
                "expected stages in pipeline order (start a new run to go back)"
            )
        given: _core.Schedule | None
        learned_in: int | None
        if schedule is not None:
            given, learned_in = schedule_of(name, group.members, schedule), None
        else:
            given, learned_in = keeper.schedule_for(group)
        if given is not None and given.sharing == _core.Sharing.TURNS:
            order = given.order()
            if order != sorted(order, key=keeper.index):
                if learned_in is not None:
                    given, learned_in = None, None  # learned in another order: loaded together
                else:
                    raise ArgumentError(
                        f"group {name!r}: the schedule {given} takes turns in the order {', '.join(order)}; "
                        f"members that take turns run in pipeline order: expected {', '.join(group.members)}"
                    )
        keeper.new_sharing(group, given.sharing if given is not None else _core.Sharing.TOGETHER)
        self._next = first
        self._in_group = name
        try:
            with group_turn(self, keeper, group, given, learned_in) as turn:
                yield turn
        finally:
            self._in_group = None
            self._next = max(self._next, max(keeper.index(m) for m in group.members) + 1)

    @contextlib.contextmanager
    def final_pass(self, keep_prefixes: Sequence[str] = ()) -> Iterator[FinalPass]:
        """Around the running stage's last call: each block is freed right after it runs
        (see ``handle.final_pass()``) and its memory goes to the stage read ahead as it frees.
        A stage kept for the next run frees only the blocks the next stage needs (those it runs
        last), and reads them again at its next turn; any other is released at its end."""
        current = self._current
        if current is None:
            raise ArgumentError("final_pass(): no stage is running; call it inside run.stage(...)")
        index = self._keeper.index(current.name)
        following = self._keeper.ahead_allowance(index)
        self._keeper.feeding(index)
        current.final = True
        from ..offload.final_pass import final_pass

        wanted: Callable[[], int] | None = None
        passing: list[FinalPass] = []
        if not current.release_after:
            # Kept for the next run: a block is freed only while the next stage still needs
            # memory (what the stage is to give back at its end), its resident blocks only.
            def wanted() -> int:
                done = _core.resident_among(current.plan, list(passing[0].freed)).bytes if passing else 0
                return current.to_give - done

        # A run of the pipeline again finds the freed RAM-tier pages in the page cache.
        with final_pass(current.handle, list(keep_prefixes), keep_page_cache=True, wanted=wanted) as fp:
            passing.append(fp)
            current.feed(fp, following)
            yield fp
        current.stop_feeding()
