"""The stages a pipeline holds and the memory between them: which are loaded (kept from a run,
or read ahead), what each is planned for, the room a stage's start makes by taking from the
others, the stage read ahead on a thread of its own, and each turn's record.

:class:`~.runner.Pipeline` is what the caller holds; :class:`~.run.PipelineRun` starts and ends
each stage's turn here.
"""

from __future__ import annotations

import functools
import os
import traceback
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import _core
from ..checkpoint import Checkpoint
from ..errors import ArgumentError
from ..options import (
    LOAD_OPTIONS,
    checkpoint_key,
    remember_activation,
    remembered_activation,
    with_remembered_activation,
)
from ..plan import plan as make_plan
from .ahead import Pending
from .pace import Pacer, Rates
from .spec import Group, Stage
from .staging import SharedStaging
from .turn import Turn

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ..plan import Plan
    from .loaded import LoadedStage

__all__ = ["StageKeeper"]


def _reads_now(stage: LoadedStage) -> int:
    """What the stage's loader has still to read and may read now: all of it, or for a stage
    read ahead, as far as its allowance goes (nothing while it is held: paused where reading
    ahead costs more than it saves, or waiting for a quiet pass)."""
    left = stage.pending().ram
    gate = stage.allowance
    if gate is None:
        return left
    if gate.is_held:
        return 0
    available = gate.available
    return left if available is None else min(left, available)


class StageKeeper:
    """The stages of one pipeline as loaded now; the caller's thread and the read-ahead's share it
    (see :attr:`loaded`)."""

    def __init__(
        self,
        stages: Sequence[Stage],
        device: torch.device,
        *,
        prefetch: bool,
        keep: bool,
        ram: int | None,
        vram: int | None,
        groups: Sequence[Group] = (),
    ) -> None:
        self.stages = list(stages)
        self.groups = {g.name: g for g in groups}
        # Each group's schedule learned from its last run's calls, and that run's number.
        self.learned: dict[str, tuple[_core.Schedule, int]] = {}
        self.group_records: list[_core.GroupRecord] = []
        # Each group's blocks, across members loaded together, in the order they first ran.
        self.run_orders: dict[str, list[tuple[str, int]]] = {}
        self._sharing: dict[str, _core.Sharing] = {}  # how each group's last run shared
        self._underway: dict[str, _core.Sharing] = {}  # how the group whose turn runs shares
        # The members of a group loaded together while its turn runs: each is running (a room
        # made for another stage takes from them only at their end).
        self.running_members: list[LoadedStage] = []
        self.device = device
        self.prefetch = prefetch
        self.keep = keep
        self.ram = ram
        self.vram = vram
        # The RAM left to the rest of the machine, kept once from what the machine has free
        # rather than by each stage's plan: ``ram`` is then all the stages' (see _free, _plan).
        self._floor = _core.ram_floor([s.options.get("min_free_ram") for s in stages])
        # No lock guards it: while a read-ahead is being set up (``pending``), its thread alone
        # touches it, and every other reader waits for that thread first (``settle``).
        self.loaded: dict[str, LoadedStage] = {}
        self.pending: Pending | None = None  # the read-ahead being set up on its own thread
        self._rates = Rates()  # what loads at a stage's start read at (pace.py)
        self._deferred: LoadedStage | None = None  # a read-ahead given memory only at the stage's end
        self.models: dict[str, nn.Module] = {}  # each stage's model, built once
        self._ticks = 0  # stage starts so far: a stage's last use, for keeping the recent ones
        self.records: list[_core.StageRecord] = []
        self.staging = SharedStaging(device)  # one staging pool for every stage
        # The pages the stages' weights are read into on the CPU: a stage's pages given back
        # (released, or blocks a final pass freed) take the reads still to come, already
        # faulted (_want_pages says how many those take).
        self.pages = _core.PagePool() if device.type == "cpu" and _core.PagePool.keeps_pages() else None
        self._reads: _core.LoadReads | None = None  # through the page cache or past it (_load_args)
        self._changes: dict[str, str] = {}  # kept stages let go because their file changed, why

    def loaded_names(self) -> list[str]:
        """The stages loaded now, in pipeline order; waits for the stage read ahead to be set up."""
        self.settle()
        return [s.name for s in self.stages if s.name in self.loaded]

    def report(self) -> str:
        text = _core.pipeline_report(self.records, self.group_records)
        if self.pages is not None and self.pages.reused + self.pages.fresh:
            reused, fresh = self.pages.reused / 1e9, self.pages.fresh / 1e9
            text = f"pages: {reused:.2f} GB read into pages given back, {fresh:.2f} GB into new ones\n{text}"
        return text if self._reads is None else f"loads: {self._reads}\n{text}"

    def _want_pages(self, coming: int = 0) -> None:
        """Tells the pool of pages what the reads to come will take: what the loaded stages'
        loaders have still to read and may read now (a stage read ahead, as far as its
        allowance goes), and ``coming`` bytes about to be read (a stage's need, or what a stage
        frees for the one read ahead). It keeps no more of the pages given back: the rest go to
        the system at once. A page kept for a read that waits for memory would be memory held
        for nothing meanwhile, which the stages' activations cannot use (they take theirs from
        the system)."""
        if self.pages is None:
            return
        import torch

        from ..offload.meter import meter_for

        wanted = sum(_reads_now(s) for s in self.loaded.values()) + coming
        # What it gives back is not the running stage's: its window's baseline moves down by it
        # (a drop it did not see would make its peak look smaller than it was).
        meter_for(torch.device("cpu")).freed_beside(functools.partial(self.pages.want, wanted))

    def _following(self, index: int) -> LoadedStage | None:
        """The stage after ``index``, where it is loaded: what the stage at ``index`` frees goes
        to it. After the last stage comes the first of the next run (see _start)."""
        return self.loaded.get(self.stages[(index + 1) % len(self.stages)].name)

    def _freeing_for(self, index: int, nbytes: int | None = None) -> None:
        """The stage at ``index`` is about to free ``nbytes`` (released or given back; None: as
        much as a final pass frees), which go to the stage after it: its pages are kept for that
        stage's reads still waiting, as far as they go."""
        following = self._following(index)
        waiting = max(0, following.pending().ram - _reads_now(following)) if following is not None else 0
        self._want_pages(waiting if nbytes is None else min(nbytes, waiting))

    def feeding(self, index: int) -> None:
        """The stage at ``index`` starts a final pass: the blocks it frees go to the stage after
        it, and their pages to that stage's reads still waiting."""
        if self._following(index) is not None:
            self._freeing_for(index)

    def end_run(self) -> None:
        """At a run's end: the pages no stage took back go to the system (a pipeline between
        runs holds only its stages)."""
        if self.pages is not None:
            self.pages.trim()

    def close(self) -> None:
        """Releases every stage still loaded (each step runs; the first error is raised after)."""
        from ..offload.cleanup import Cleanup

        self.settle()
        steps = Cleanup()
        for name in list(self.loaded):
            steps.run(self._release, name)
        self.models.clear()
        steps.run(self.staging.close)
        if self.pages is not None:
            steps.run(self.pages.close)
        steps.done()

    # -- the memory between stages --------------------------------------------------------

    def _free(self, reading: LoadedStage | None = None) -> _core.Free:
        """The memory free now for the pipeline: the machine's less what the stages' reads in
        flight will take, within its budget less what its stages hold once those are in. For
        ``reading``, the stage whose own reads to come are asked about, what it holds now."""
        from .loaded import free_now

        assert self._owns_loaded()
        coming, held = _core.Holds(), _core.Holds()
        for s in self.loaded.values():
            if s is reading:
                held = held.plus(s.held_now())
            else:
                coming, held = coming.plus(s.pending()), held.plus(s.committed())
        # Every plan counts the shared pool as its own staging: its RAM comes back here, once.
        # The pages kept for the next reads are the stages' too: they take them before new ones.
        kept = self.pages.idle_bytes if self.pages is not None else 0
        machine = free_now(self.device).keeping(self._floor).with_shared_pool(self.staging.bytes)
        machine = machine.with_kept_pages(kept).less(coming)
        return machine.within(self.ram, self.vram, held)

    def _held(self) -> _core.Holds:
        """What the loaded stages hold together once the reads they have begun are in."""
        held = _core.Holds()
        for s in self.loaded.values():
            held = held.plus(s.committed())
        return held

    def _plan(self, spec: Stage, model: nn.Module, ckpt: Checkpoint, free: _core.Free, pool: bool = True) -> Plan:
        """The stage's plan for ``free``, with its remembered activation memory; ``pool``: it
        may stage into the shared pool (members of a group loaded together do not)."""
        # The pipeline keeps the stages' floor of free RAM itself (``_floor``, in ``_free``).
        options = with_remembered_activation({**spec.options, "min_free_ram": 0}, spec.memo_key)
        sizes: dict[str, Any] = {"ram": free.ram}
        if free.vram is not None:
            sizes["vram"] = free.vram
        sizes.update({k: options.pop(k) for k in ("ram", "vram") if options.get(k) is not None})

        def make(**kw: Any) -> Plan:
            return make_plan(model, ckpt, device=self.device, **{**sizes, **options, **kw})

        if pool:
            return self.staging.planned(make, sizes["ram"])
        # Buffers of its own: the pipeline's free memory has the pool back only for the plans
        # that count it (see SharedStaging.planned).
        return make() if self.staging.pool is None else make(ram=max(0, sizes["ram"] - self.staging.bytes))

    def _room(
        self, spec: Stage, model: nn.Module, ckpt: Checkpoint, running: LoadedStage | None
    ) -> tuple[_core.Free, Plan]:
        """Plans ``spec`` for the best memory it can get (every other stage given back), then
        makes that room, taking from the stages needed again last first (see
        :meth:`_make_room`). Returns the memory predicted free at its start and the plan."""
        free = self._free()
        others = [s for s in self.loaded.values() if s.name != spec.name]
        everything = free
        for s in others:
            everything = everything.after_release(s.committed())  # a release stops its reads
        best = self._plan(spec, model, ckpt, everything)
        gained = self._make_room(spec, best.needs(spec.name), free, others, running)
        return free.after_release(gained), best

    def _make_room(
        self,
        spec: Stage,
        need: _core.Holds,
        free: _core.Free,
        others: list[LoadedStage],
        running: LoadedStage | None,
    ) -> _core.Holds:
        """Takes what ``spec`` needs beyond ``free`` from the other stages, as the core's
        ``make_room`` decides (the stage needed again last first; from a stage that has run only
        the blocks missing, those it runs last). The running stage gives at its end (or as its
        final pass frees). Returns what is given."""
        self._want_pages(need.ram)  # the pages of what it releases for it go to its reads
        by_name = {s.name: s for s in others}
        # What each frees whole: all it holds once the reads it has begun are in (a release
        # stops them).
        whole = {s.name: s.committed() for s in others}
        holders = [_core.Holder(s.name, self.index(s.name), whole[s.name], s.sheddable(), s.runs > 0) for s in others]
        gained = _core.Holds()
        short = need.beyond(free)
        for giving in _core.make_room(self.index(spec.name), len(self.stages), short, holders, keep=self.keep):
            s = by_name[giving.stage]
            runs_now = s is running or s in self.running_members
            if giving.whole:
                took = whole[s.name]
                if runs_now:
                    s.release_at_end()
                else:
                    self._release(s.name)
            elif runs_now:
                s.give_at_end(giving.blocks)
                took = s.holds_in(giving.blocks)
            else:
                took = s.holds_in(s.give_back(giving.blocks))
            gained = gained.plus(took)
        return gained

    def start(self, index: int) -> tuple[LoadedStage, Turn]:
        """The stage at ``index`` starts: the one read ahead opens (or is planned again), a kept
        one is used as it is, any other is loaded now; then the stage after it starts being read
        ahead, on a thread of its own."""
        from .loaded import load_stage

        self.settle()
        spec = self.stages[index]
        self._ticks += 1
        self._drop_changed(spec.name)
        turn = Turn(file_changed=self._changes.pop(spec.name, None))
        loaded = self.loaded.get(spec.name)
        if loaded is not None and loaded.runs == 0:
            before = loaded.holds.compute_part(loaded.holds)
            turn.read_before_start = max(0, before - loaded.holds.compute_part(loaded.pending()))
            actual, why = loaded.start(self._free(reading=loaded))
            turn.predicted, turn.actual = loaded.predicted, actual
            if why is not None and not self._still_fits(spec, loaded, actual):
                turn.arrival, turn.replan = _core.Arrival.REPLANNED, why
                self._release(spec.name)
                loaded = None
            else:
                turn.arrival = _core.Arrival.READ_AHEAD
        elif loaded is not None:
            turn.arrival = _core.Arrival.KEPT
            if loaded.given:  # given back since its last run, and not read ahead: read now
                self._make_room(spec, loaded.holds_in(loaded.given_back), self._free(), self._others(spec), None)
                loaded.refill(None)
            elif loaded.allowance is not None:  # read again ahead of its turn
                loaded.allowance.open()
            turn.read_again = loaded.take_read_again()
            if loaded.state.lane is not None:
                loaded.state.lane.priority = _core.Priority.RUN
        if loaded is None:
            model = self._model(spec)
            ckpt = Checkpoint(spec.path)
            predicted, p = self._room(spec, model, ckpt, None)
            if not self.staging.sized and p.budgets is not None and p.budgets.staging_buffers:
                self._size_staging()  # it streams: the pool first, then its plan that counts it
                predicted, p = self._room(spec, model, ckpt, None)
            # Found before its load (the idle stages it needed released): what it planned with.
            found = self._free()
            loaded = load_stage(spec.name, model, ckpt, p, predicted, **self._load_args(spec), ahead=False)
            turn.arrival = turn.arrival or _core.Arrival.READ_AT_START
            turn.predicted = turn.predicted or predicted
            turn.actual = turn.actual or found
        loaded.begin_turn(self._ticks, self.keep)
        self.loaded[spec.name] = loaded
        group = self.group_of(spec.name)
        if group is not None:  # members that take turns: each at its own
            kept = turn.arrival == _core.Arrival.KEPT
            turn.share = _core.Share.kept(group.name) if kept else _core.Share.turn(group.name)
        self._want_pages()
        if self.prefetch and self.device.type == "cpu":
            # Times its blocks beside the read-ahead, and pauses that where it costs more than
            # it saves (on a GPU a block's time on the host is not its compute's).
            # Its own loader's reads (its blocks still arriving) are neither quiet nor the
            # read-ahead's; one read at its start also tells what a read takes alone.
            at_start = turn.arrival == _core.Arrival.READ_AT_START
            loaded.pacer = Pacer(len(loaded.state.blocks), loaded.loader, self._rates, measures_drive=at_start)
            loaded.handle.hooks.add(loaded.pacer)
        if self.prefetch and index + 1 < len(self.stages):
            self._read_ahead_later(self.stages[index + 1], loaded)
        elif self.prefetch and self.keep and index > 0:
            # The last stage: a pipeline runs again more often than not, and its first stage,
            # kept in part, reads its given-back blocks behind this one's compute (nothing
            # else is read for a run that may not come).
            self._read_ahead_later(self.stages[0], loaded)
        return loaded, turn

    def _still_fits(self, spec: Stage, loaded: LoadedStage, actual: _core.Free) -> bool:
        """Whether a stage read ahead whose start missed the prediction is kept as it was
        loaded: the core's ``still_fits`` compares the loaded plan with a fresh one for the
        memory found (made here: planning needs torch). The report still shows the prediction
        against what was found."""
        fresh = self._plan(spec, loaded.model, Checkpoint(spec.path), actual)
        return _core.still_fits(spec.name, loaded.plan, fresh, actual)

    # -- groups ------------------------------------------------------------------------------

    def group_of(self, name: str) -> Group | None:
        """The group the stage ``name`` is a member of (None: none)."""
        for g in self.groups.values():
            if name in g.members:
                return g
        return None

    def schedule_for(self, group: Group) -> tuple[_core.Schedule | None, int | None]:
        """The schedule a run of ``group`` follows when the run gives none: the group's own,
        else the one learned from its last run (and that run's number), else none."""
        if isinstance(group.schedule, _core.Schedule):  # Group made it so
            return group.schedule, None
        learned = self.learned.get(group.name)
        return (learned[0], learned[1]) if learned is not None else (None, None)

    def new_sharing(self, group: Group, sharing: _core.Sharing) -> None:
        """A run of ``group`` shares the memory as ``sharing``: when its last run shared it
        the other way, its members kept from that run are released, to be planned for the new
        way (members planned together hold a part of the budget each; one planned for its
        turn, all of it)."""
        before = self._sharing.get(group.name)
        self._sharing[group.name] = sharing
        self._underway[group.name] = sharing
        if before is None or before == sharing:
            return
        self.settle()
        for name in group.members:
            if name in self.loaded:
                self._release(name)

    def end_together(self, run: int, members: list[tuple[LoadedStage, Turn]], failure: BaseException | None) -> None:
        """Members loaded together end, in pipeline order: what the last one frees goes to the
        stage read after the group (each step runs; the first error is raised after)."""
        from ..offload.cleanup import Cleanup

        self.running_members = []
        steps = Cleanup()
        for loaded, turn in sorted(members, key=lambda pair: self.index(pair[0].name)):
            steps.run(self.end, run, self.index(loaded.name), loaded, turn, failure)
        steps.done()

    def group_ended(
        self,
        group: Group,
        record: _core.GroupRecord,
        learned: _core.Schedule | None,
        run_order: list[tuple[str, int]],
    ) -> None:
        """The turn of ``group`` ended as ``record`` says: its next run's sharing is predicted
        from its schedule, and what it learned (its calls, its blocks' run order across
        members; None and empty after a failure) is kept for the runs after it."""
        self._underway.pop(group.name, None)
        self.group_records.append(record)
        if learned is not None:
            self.learned[group.name] = (learned, record.run)
        if run_order:
            self.run_orders[group.name] = list(run_order)

    def loads_together(self, name: str) -> bool:
        """Whether the stage ``name`` is a member its group's next run loads with the others
        (so nothing reads it ahead for a plan of its own): as the group's turn under way shares,
        else as its schedule says; a group with no schedule yet loads together."""
        group = self.group_of(name)
        if group is None:
            return False
        underway = self._underway.get(group.name)
        if underway is not None:
            return underway == _core.Sharing.TOGETHER
        schedule, _ = self.schedule_for(group)
        return schedule is None or schedule.sharing == _core.Sharing.TOGETHER

    def start_together(
        self, group: Group, order: list[str], schedule: _core.Schedule | None
    ) -> list[tuple[LoadedStage, Turn]]:
        """The members of ``group`` start at once, planned one after the other in ``order``:
        each for the memory free (the other stages given back as needed) less what the members
        before it hold and the least the members after it need. Each has staging buffers of its
        own, sized for its blocks (their engines stage at once; the shared pool serves one
        engine at a time). Returns them in ``order``, each with its turn; then the stage after
        the group starts being read ahead."""
        from .loaded import load_stage

        self.settle()
        members = [self.stages[self.index(n)] for n in order]
        # The least each member needs (every block streamed): what the ones planned before it
        # leave for it at least.
        least = {}
        for spec in members:
            kept = self.loaded.get(spec.name)
            if kept is None or kept.runs == 0:
                empty = _core.Free(0, None if self.device.type == "cpu" else 0)
                plan = self._plan(spec, self._model(spec), Checkpoint(spec.path), empty, pool=False)
                least[spec.name] = plan.holds(spec.name)
        started: list[tuple[LoadedStage, Turn]] = []
        for at, spec in enumerate(members):
            self._ticks += 1
            self._drop_changed(spec.name)
            turn = Turn(file_changed=self._changes.pop(spec.name, None))
            loaded = self.loaded.get(spec.name)
            if loaded is not None and loaded.runs == 0:
                # Read ahead for a plan of its own (the schedule changed): planned again here.
                self._release(spec.name)
                loaded = None
            calls = schedule.calls(spec.name) if schedule is not None else None
            if loaded is not None:
                turn.arrival, turn.share = _core.Arrival.KEPT, _core.Share.kept(group.name)
                if loaded.given:
                    outside = [s for s in self._others(spec) if s.name not in group.members]
                    self._make_room(spec, loaded.holds_in(loaded.given_back), self._free(), outside, None)
                    loaded.refill(None)
                turn.read_again = loaded.take_read_again()
            else:
                model = self._model(spec)
                ckpt = Checkpoint(spec.path)
                free = self._free()
                outside = [s for s in self._others(spec) if s.name not in group.members]
                everything = free
                for s in outside:
                    everything = everything.after_release(s.committed())
                after = _core.Holds()
                for later in members[at + 1 :]:
                    if later.name in least:
                        after = after.plus(least[later.name])
                p = self._plan(spec, model, ckpt, everything.less(after), pool=False)
                gained = self._make_room(spec, p.needs(spec.name), free, outside, None)
                predicted = free.after_release(gained)
                found = self._free()
                loaded = load_stage(
                    spec.name, model, ckpt, p, predicted, **self._load_args(spec, pool=False), ahead=False
                )
                before = [m.name for m in members[:at]]
                turn.share = (
                    _core.Share.after(group.name, before, calls) if before else _core.Share.first(group.name, calls)
                )
                turn.arrival, turn.predicted, turn.actual = _core.Arrival.READ_AT_START, predicted, found
            if loaded.state.lane is not None:
                loaded.state.lane.priority = _core.Priority.RUN
            loaded.begin_turn(self._ticks, self.keep)
            self.loaded[spec.name] = loaded
            started.append((loaded, turn))
        self.running_members = [loaded for loaded, _ in started]
        self._want_pages()
        last = max(self.index(n) for n in group.members)
        if self.prefetch and last + 1 < len(self.stages):
            self._read_ahead_later(self.stages[last + 1], started[0][0])
        return started

    # -- the stage read ahead ---------------------------------------------------------------

    def _read_ahead_later(self, spec: Stage, running: LoadedStage) -> None:
        """Starts reading ``spec`` ahead on a thread of its own (building, planning and setting up
        its load take up to a second, which the stage starting now must not wait for); whatever
        needs that stage waits for the thread first (:meth:`settle`). The thread may release
        idle stages (``_room``) and add the stage to ``_loaded`` meanwhile: neither is the running
        stage nor the one read ahead, the only two the caller touches, and every other use of
        ``_loaded`` settles first. The releases stay on that thread because the load after them
        needs their memory."""
        kept = self.loaded.get(spec.name)
        if (kept is None and self.index(spec.name) == 0) or (kept is not None and not kept.given):
            return
        if self.loads_together(spec.name):
            return  # planned with the other members at the group's start, for what they hold
        self.pending = Pending(spec.name, functools.partial(self._read_ahead, spec, running))

    def settle(self) -> None:
        """Waits for the stage being read ahead to be set up. When that failed, what it had
        loaded is released and a warning says why: the stage is then loaded at its start, on
        the caller's thread, where the same error (a build_fn that fails) is raised again."""
        pending = self.pending
        if pending is None:
            return
        error = pending.join()
        self.pending = None
        if error is None:
            return
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__)).rstrip()
        del error  # its frames hold the half-loaded stage, which the release below lets go
        if pending.name in self.loaded:
            self._release(pending.name)
        warnings.warn(
            f"reading stage {pending.name} ahead failed; it will be loaded at its start instead:\n{text}",
            RuntimeWarning,
            stacklevel=3,
        )

    def _owns_loaded(self) -> bool:
        """Whether this thread may use ``_loaded`` now: no read-ahead is being set up, or this
        is its thread."""
        return self.pending is None or self.pending.is_current()

    def ahead_allowance(self, index: int) -> _core.Allowance | None:
        """The allowance of the stage after ``index`` when it is loaded (its set-up waited
        for): what the stage at ``index`` frees goes to it. A stage that has started has its
        allowance open already, where more changes nothing."""
        self.settle()
        following = self._following(index)
        return following.allowance if following is not None else None

    def _read_ahead(self, spec: Stage, running: LoadedStage) -> None:
        """On the read-ahead's thread: plans the next stage for the memory predicted free at its
        start and starts its reads into the memory free beside the running stage (its
        activations and the floor of free RAM left alone); the rest comes as the running
        stage gives memory back (its end waits for this to be done, so none of it is lost)."""
        from .loaded import load_stage

        if self._drop_changed(spec.name) and self.index(spec.name) == 0:
            return  # a first stage not kept is loaded at its start (see _read_ahead_later)
        kept = self.loaded.get(spec.name)
        if kept is not None:  # kept from the run before, with blocks given back: read them again
            self._make_room(spec, kept.holds_in(kept.given_back), self._free(), self._others(spec), running)
            kept.refill(_core.Allowance(spec.name, 0))
            if self.index(spec.name) == 0 and remembered_activation(running.key) is None:
                # Read for a run that may not come, beside a stage whose working memory no run
                # has measured yet: it would take the memory that stage is about to need. It
                # waits for the stage's end instead (``_end``).
                self._deferred = kept
                self._want_pages()  # the pages freed for it would hold that memory meanwhile
                return
            self._watch(running, kept)
            self._give_now(kept, running)
            self._want_pages()
            return
        self._size_staging()
        model = self._model(spec)
        ckpt = Checkpoint(spec.path)
        predicted, p = self._room(spec, model, ckpt, running)
        if not self._free().fits_beside(p.at_once(spec.name), **self._beside(running)):
            # Its own staging buffers (no stage streamed when the shared pool was sized) are
            # taken as its load is set up, and the memory free beside the running stage cannot
            # hold them: it is loaded at its start instead, when that memory is free.
            return
        loaded = load_stage(spec.name, model, ckpt, p, predicted, **self._load_args(spec), ahead=True)
        self.loaded[spec.name] = loaded
        self._watch(running, loaded)
        self._give_now(loaded, running)
        self._want_pages()

    @staticmethod
    def _watch(running: LoadedStage, ahead: LoadedStage) -> None:
        """The running stage's pacer weighs the read-ahead of ``ahead`` from now on."""
        if running.pacer is not None and ahead.loader is not None and ahead.allowance is not None:
            running.pacer.watch(ahead.loader, ahead.allowance)

    def _size_staging(self) -> None:
        """Makes the shared staging pool (pipeline_staging.py) once, before the first stage that
        streams: on the read-ahead's thread, or at the start of a first stage that streams (it
        builds and plans every stage, which the caller's thread should not wait for)."""
        if self.staging.sized:
            return
        # Each stage as it would plan with the budget to itself: one that streams only while
        # others are loaded gets room from them (_make_room), not a pool for its whole life.
        free = self._free().after_release(self._held())

        def planned(spec: Stage) -> Plan:
            return self._plan(spec, self._model(spec), Checkpoint(spec.path), free)

        self.staging.size_for(functools.partial(planned, s) for s in self.stages)

    def _beside(self, running: LoadedStage) -> dict[str, int]:
        """The working memory of ``running`` that a stage read ahead beside it leaves alone: its
        measured peak, and its plan's reserve (which counts with a GPU)."""
        budgets = running.plan.budgets
        return {"peak": remembered_activation(running.key) or 0, "reserve": budgets.reserve if budgets else 0}

    def _give_now(self, loaded: LoadedStage, running: LoadedStage) -> None:
        """Lets the reads of ``loaded`` into the memory free now beside ``running`` (its
        activations left alone; the floor of free RAM is out of ``_free`` already), measured once
        the load made its staging pool."""
        free = self._free(reading=loaded)
        assert loaded.allowance is not None
        loaded.allowance.give(free.for_reads_beside(**self._beside(running)))

    def end(self, run: int, index: int, loaded: LoadedStage, turn: Turn, failure: BaseException | None) -> None:
        """The stage ends: its peak and order file are remembered after a block that went well;
        it is kept, whole or but the blocks the next stage needs, or released, the memory going
        to the stage read ahead."""
        from ..offload.order import write_order

        following = self.ahead_allowance(index)
        spec = self.stages[index]
        if failure is None:
            peak = turn.peak
            if turn.overlapped:
                # The next stage's set-up paused the meter while this one ran: a peak of its own
                # then was not seen. Never remember less than it needed before.
                peak = max(peak, remembered_activation(loaded.key) or 0)
            remember_activation(loaded.key, peak)
            write_order(loaded.choice, loaded.handle.ran, loaded.handle.outside_ran)
        beside = None
        if loaded.pacer is not None:
            beside = loaded.pacer.beside()
            loaded.handle.hooks.remove(Pacer.name)
            loaded.pacer = None
        passed = 0
        if loaded.final:
            loaded.stop_feeding()
            passed = loaded.passed()
        if not loaded.park():  # the shared staging pool goes to the next stage
            loaded.release_at_end()
        leaving = _core.depart(
            failed=failure is not None,
            final_pass=loaded.final,
            release_after=loaded.release_after,
            keep=self.keep,
            to_give=loaded.to_give,
            passed=passed,
            sheddable=loaded.sheddable(),
        )
        departure = leaving.departure
        if leaving.give:
            self._freeing_for(index, leaving.give)
        given = loaded.give_back(leaving.give) if leaving.give else 0
        kept = turn.arrival == _core.Arrival.KEPT
        self.records.append(
            _core.StageRecord(
                run,
                spec.name,
                turn.arrival or _core.Arrival.READ_AT_START,
                departure,
                predicted=turn.predicted,
                actual=turn.actual,
                replan=turn.replan,
                read_before_start=turn.read_before_start,
                holds=loaded.holds.compute_part(loaded.holds),
                file_bytes=0 if kept else loaded.file_bytes,
                cached_at_load=0 if kept else loaded.cached_at_load,
                waited=0.0 if loaded.loader is None else loaded.loader.waited_seconds,
                seconds=turn.seconds,
                peak=turn.peak,
                read_again=turn.read_again,
                given_back=passed + given if departure == _core.Departure.KEPT else 0,
                file_changed=turn.file_changed,
                beside=beside,
                plan_warnings=[] if kept else list(loaded.plan.warnings),
                share=turn.share,
            )
        )
        if departure == _core.Departure.KEPT:
            given_now = given
            if self.device.type == "cpu":
                # The stage's activations went back to the heap: hand them to the system now, as
                # a release would (glibc keeps them otherwise, over the budget).
                _core.trim_heap()
        else:
            held = loaded.held_now()
            given_now = loaded.holds.compute_part(held)
            self._freeing_for(index, held.ram)
            self._release(spec.name)
        deferred, self._deferred = self._deferred, None
        if deferred is not None and deferred.allowance is following and following is not None:
            # Its memory was held back while this stage ran: it gets what is free now.
            following.give(self._free(reading=deferred).for_reads_beside())
        elif following is not None and given_now:
            # No CUDA event waited for here. A block given back recorded, as it was freed, every
            # stream it ran on (a caller's own too): the allocator hands its memory to no one
            # before their work has run. A stage released waited for the device first. And the
            # loader, which copies on a stream of its own, takes memory from the default
            # stream's pool only behind an event recorded there (loader_copies.py).
            following.give(given_now)
        self._want_pages()

    def _drop_changed(self, name: str) -> bool:
        """Releases the stage ``name`` kept from an earlier run when its checkpoint changed on disk
        since its load: its blocks read again by the old header's offsets would not be its
        tensors, and the user who rewrote the file means the new ones. Why goes to its record."""
        loaded = self.loaded.get(name)
        if loaded is None or loaded.runs == 0:
            return False
        change = loaded.state.checkpoint.changed()
        if change is None:
            return False
        self._changes[name] = change
        self._release(name)
        return True

    def _others(self, spec: Stage) -> list[LoadedStage]:
        return [s for s in self.loaded.values() if s.name != spec.name]

    def _model(self, spec: Stage) -> nn.Module:
        """The stage's model: built by its ``build_fn`` the first time, then the same module
        again (a release leaves it on the meta device, ready to load): building a large model
        on meta takes a second of the caller's thread, every time it would be built again."""
        from torch import nn

        from ..offload.empty import no_init_on_meta

        model = self.models.get(spec.name)
        if model is None:
            with no_init_on_meta():
                model = spec.build_fn()
            if not isinstance(model, nn.Module):
                raise ArgumentError(
                    f"stage {spec.name}: build_fn returned {type(model).__name__}, not a torch.nn.Module"
                )
            self.models[spec.name] = model
        return model

    def model_of(self, name: str) -> nn.Module:
        """The model of the stage ``name``, built once (see :meth:`_model`)."""
        return self._model(self.stages[self.index(name)])

    def _load_args(self, spec: Stage, pool: bool = True) -> dict[str, Any]:
        if self._reads is None:
            # Decided once, at the first load, for the budget with nothing held.
            files = sum(os.path.getsize(f) for s in self.stages for f in Checkpoint(s.path).files)
            budget = self._free().after_release(self._held())
            self._reads = _core.load_reads(files, budget.ram, budget.vram, keep=self.keep)
        return {
            "device": self.device,
            "order": spec.order,
            "destination": spec.order_file_destination,
            "shared": {k: spec.options[k] for k in LOAD_OPTIONS if k in spec.options},
            "key": checkpoint_key(spec.memo_key),
            "staging_pool": self.staging.pool if pool else None,
            "direct": self._reads.direct,
            "pages": self.pages,
        }

    def _release(self, name: str) -> None:
        from ..offload import release

        assert self._owns_loaded()
        loaded = self.loaded.pop(name)
        loaded.close()
        release(loaded.model, loaded.handle)

    def index(self, name: str) -> int:
        for i, s in enumerate(self.stages):
            if s.name == name:
                return i
        raise ArgumentError(f"stage {name!r}: not a stage of this pipeline; its stages are {', '.join(self.names())}")

    def names(self) -> list[str]:
        return [s.name for s in self.stages]
