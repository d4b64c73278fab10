"""A group's turn in a run: its members' models, the hooks that count their calls, and what the
schedule does with the memory.

Members that take turns (the schedule's sharing is ``TURNS``) are stages run one after the
other: the first starts with the group, the next is read ahead while it runs, and a member's
first call ends the turn of the one before it. With a schedule given for the run, a member's
last call is a final pass: each block is freed as it runs, its memory going to the next
member's reads. A learned schedule is not trusted to count calls (a run may make more than the
one it was learned from): the member's memory then goes at the next member's first call.

Members that alternate (``TOGETHER``, and any group with no schedule yet) are loaded at the
group's start, planned together (see :meth:`~.keeper.StageKeeper.start_together`), and end
with it. Their blocks' first runs across members are recorded, one run order for them all;
from the next run on, their lanes of the drive's read queue share that order (the core's
``join_lanes``), so the queue reads the members' blocks in the order they run.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from .. import _core
from ..errors import ArgumentError
from ..offload.registry import BlockHook, model_hooks

if TYPE_CHECKING:
    from torch import nn

    from ..offload.final_pass import FinalPass
    from ..offload.state import BlockState
    from .keeper import StageKeeper
    from .loaded import LoadedStage
    from .run import PipelineRun
    from .spec import Group
    from .turn import Turn

__all__ = ["GROUP_HOOK", "GroupTurn"]

# The name, in each member's hook registry, of the module hooks that count its calls.
GROUP_HOOK = "pipeline_group"


class RunAcross(BlockHook):
    """Notes each block's first run, across the members loaded together: one run order."""

    name = "group_order"

    def __init__(self, member: str, order: list[tuple[str, int]], seen: set[tuple[str, int]]) -> None:
        self._member, self._order, self._seen = member, order, seen

    def pre_forward(self, block: BlockState) -> None:
        key = (self._member, block.index)
        if key not in self._seen:
            self._seen.add(key)
            self._order.append(key)


class GroupTurn(Mapping[str, "nn.Module"]):
    """What ``run.group(name)`` yields: each member's model by name (``turn["high"]``), the
    schedule the run follows (:attr:`schedule`, None while none is known) and how the members
    share the memory (:attr:`sharing`). Call the models as the pipeline does; the group starts
    and ends members around those calls."""

    def __init__(
        self,
        run: PipelineRun,
        keeper: StageKeeper,
        group: Group,
        schedule: _core.Schedule | None,
        learned_in: int | None,
    ) -> None:
        self._run = run
        self._keeper = keeper
        self.group = group
        self.schedule = schedule
        self.learned_in = learned_in
        self.sharing = schedule.sharing if schedule is not None else _core.Sharing.TOGETHER
        self.calls: list[str] = []  # each call's member, in order
        self._counts = dict.fromkeys(group.members, 0)
        self._depth = dict.fromkeys(group.members, 0)  # calls under way (a member calling itself)
        keeper.settle()
        self._models = {m: keeper.model_of(m) for m in group.members}
        # Turns: the member whose stage runs, and its stage's and final pass's open blocks.
        self._current: str | None = None
        self._stage: contextlib.AbstractContextManager[Any] | None = None
        self._final: contextlib.AbstractContextManager[FinalPass] | None = None
        self._final_of: str | None = None
        # Together: the members loaded, each with its turn; their blocks' first runs across
        # members, and whether the reads followed the order learned before.
        self._together: list[tuple[LoadedStage, Turn]] = []
        self.run_order: list[tuple[str, int]] = []
        self._seen: set[tuple[str, int]] = set()
        self.reads_in_order = False

    # -- the mapping --------------------------------------------------------------------------

    def __getitem__(self, name: str) -> nn.Module:
        return self._models[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._models)

    def __len__(self) -> int:
        return len(self._models)

    # -- start and end ----------------------------------------------------------------------

    def begin(self) -> None:
        """Installs the call hooks and starts the members: all of them when they run together,
        the first in the schedule's order when they take turns."""
        for name, model in self._models.items():
            hooks = model_hooks(model)
            hooks.on_module_start(GROUP_HOOK, model, _bound(self._before, name))
            hooks.on_module_end(GROUP_HOOK, model, _bound(self._after, name))
        if self.sharing == _core.Sharing.TURNS:
            assert self.schedule is not None
            self._enter(self.schedule.order()[0])
            return
        members = list(self.group.members)
        order = self.schedule.planning_order(members) if self.schedule is not None else members
        self._together = self._keeper.start_together(self.group, order, self.schedule)
        for loaded, _turn in self._together:
            loaded.handle.hooks.add(RunAcross(loaded.name, self.run_order, self._seen))
        learned = self._keeper.run_orders.get(self.group.name)
        if learned:
            self.reads_in_order = _join_reads([loaded for loaded, _ in self._together], learned)

    def end(self, failure: BaseException | None, peak: int, overlapped: bool, seconds: float) -> None:
        """Ends the members still running, removes the hooks, learns the run's schedule (when
        it went well) and records the group's run."""
        from ..offload.cleanup import Cleanup

        steps = Cleanup()
        for model in self._models.values():
            steps.run(model_hooks(model).remove, GROUP_HOOK)
        if self.sharing == _core.Sharing.TURNS:
            steps.run(self._close_final, failure)
            steps.run(self._leave, failure)
        else:
            for loaded, turn in self._together:
                steps.run(loaded.handle.hooks.remove, RunAcross.name)
                if loaded.state.lane is not None:
                    steps.run(loaded.state.lane.leave_joint)
                turn.peak, turn.overlapped, turn.seconds = peak, overlapped, seconds
            steps.run(self._keeper.end_together, self._run.number, self._together, failure)
        ran = _core.Schedule.learned(self.group.name, list(self.group.members), self.calls) if self.calls else None
        record = _core.GroupRecord(
            self._run.number,
            self.group.name,
            self.sharing,
            schedule=self.schedule,
            learned_in=self.learned_in,
            ran=ran,
            run_order=self.run_order,
            reads_in_order=self.reads_in_order,
        )
        ok = failure is None
        steps.run(self._keeper.group_ended, self.group, record, ran if ok else None, self.run_order if ok else [])
        steps.done()

    # -- the call hooks ---------------------------------------------------------------------

    def _before(self, name: str) -> None:
        self._depth[name] += 1
        if self._depth[name] > 1:
            return  # a call inside its own call: one call of the member
        self.calls.append(name)
        self._counts[name] += 1
        if self.sharing != _core.Sharing.TURNS:
            return
        if name != self._current:
            self._switch(name)
        schedule = self.schedule
        assert schedule is not None
        if self.learned_in is None:
            scheduled = schedule.calls(name)
            if self._counts[name] > scheduled:
                raise ArgumentError(
                    f"group {self.group.name}: {name} called {self._counts[name]} times, and the schedule "
                    f"gives it {scheduled}: its last call freed its blocks; expected at most {scheduled} calls, or the "
                    f"run's own schedule (run.group({self.group.name!r}, schedule=...))"
                )
            if schedule.is_last_call(name, self._counts[name]):
                self._final = self._run.final_pass()
                self._final.__enter__()
                self._final_of = name

    def _after(self, name: str) -> None:
        self._depth[name] = max(0, self._depth[name] - 1)
        if self._depth[name] == 0 and self._final_of == name:
            self._close_final(None)

    # -- turns --------------------------------------------------------------------------------

    def _switch(self, name: str) -> None:
        """``name``'s first call: the member before it ends, ``name`` starts."""
        keeper = self._keeper
        current = self._current
        if current is not None and keeper.index(name) < keeper.index(current):
            raise ArgumentError(
                f"group {self.group.name}: {name} called after {current}, and its members take turns "
                f"in the order {', '.join(self.group.members)} by the schedule {self.schedule}; "
                "expected calls in that order, or a schedule where they alternate (run.group(..., schedule=[...]))"
            )
        self._close_final(None)
        self._leave(None)
        self._enter(name)

    def _enter(self, name: str) -> None:
        stage = self._run.stage(name)
        stage.__enter__()  # left at the next member's first call, or at the group's end
        self._stage, self._current = stage, name

    def _leave(self, failure: BaseException | None) -> None:
        stage, self._stage = self._stage, None
        if stage is not None:
            if failure is None:
                stage.__exit__(None, None, None)
            else:
                stage.__exit__(type(failure), failure, failure.__traceback__)

    def _close_final(self, failure: BaseException | None) -> None:
        final, self._final, self._final_of = self._final, None, None
        if final is not None:
            if failure is None:
                final.__exit__(None, None, None)
            else:
                final.__exit__(type(failure), failure, failure.__traceback__)


def _join_reads(members: list[LoadedStage], order: list[tuple[str, int]]) -> bool:
    """Gives the members' lanes of the read queue one run order, ``order`` ((member, block
    index) as they first ran), each block not in it after all of it; returns whether they share
    it (not when their checkpoints lie on different drives, whose queues are apart)."""
    lanes = [(m, m.state.lane) for m in members if m.state.lane is not None]
    if len(lanes) < 2 or len({lane.queue_id for _, lane in lanes}) != 1:
        return False
    place = {key: at for at, key in enumerate(order)}
    length = len(order)
    joined: list[tuple[_core.ReadLane, list[int]]] = []
    for m, lane in lanes:
        run = m.state.run_order or list(range(len(m.state.blocks)))
        places = []
        for index in run:
            at = place.get((m.name, index))
            if at is None:  # it did not run in the run the order was learned in: after it
                at, length = length, length + 1
            places.append(at)
        joined.append((lane, places))
    return _core.join_lanes(joined, length)


def _bound(fn: Any, name: str) -> Any:
    def call() -> None:
        fn(name)

    return call


@contextlib.contextmanager
def group_turn(
    run: PipelineRun, keeper: StageKeeper, group: Group, schedule: _core.Schedule | None, learned_in: int | None
) -> Iterator[GroupTurn]:
    """The group's turn around the caller's block: see :meth:`PipelineRun.group`."""
    from ..offload.meter import measured

    turn = GroupTurn(run, keeper, group, schedule, learned_in)
    started = time.perf_counter()
    failure: BaseException | None = None
    peak = [0, 0]
    try:
        if turn.sharing == _core.Sharing.TURNS:
            turn.begin()
            yield turn
        else:
            with measured(keeper.device) as peak:
                turn.begin()
                yield turn
    except BaseException as e:
        failure = e
        raise
    finally:
        turn.end(failure, peak[0], bool(peak[1]), time.perf_counter() - started)
