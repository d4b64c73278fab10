"""Pipeline: runs the stages of a pipeline in order and moves the memory between them.

Each stage is a model of its own (a build function, a checkpoint, plan options). While one
stage computes, the next is built, planned for the memory predicted free when it starts and read
into the memory free now, behind the running stage's reads, all on a thread of its own; a final
pass hands each freed block's memory to it; a stage the next ones do not need the memory of
stays loaded for the next run.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from .. import _core
from ..errors import ArgumentError
from .keeper import StageKeeper
from .run import PipelineRun
from .spec import Group, Stage

if TYPE_CHECKING:
    import torch

__all__ = ["Pipeline"]


class Pipeline:
    """Runs ``stages`` in order, as many times as asked, on ``device``::

        with Pipeline([Stage("text", build_text, "te.safetensors"), ...]) as pipe:
            for prompt in prompts:
                with pipe.run() as run:
                    with run.stage("text") as encoder:
                        emb = encoder(ids)
                    ...

    ``groups`` are stages that run together under the pipeline's budget (see
    :class:`~trash_panda.Group` and :meth:`PipelineRun.group`): two experts of a denoiser,
    a ControlNet beside its denoiser, a draft model beside its target.

    ``prefetch=False`` loads each stage only at its turn; ``keep=False`` releases each stage
    at its end. ``ram`` and ``vram`` (bytes, or sizes such as ``"8GB"``) cap what the
    pipeline's stages hold together, below what the machine has free; the RAM left to the
    rest of the machine (the largest ``min_free_ram`` of the stages' options, auto by default)
    is kept from the machine's free memory, not from ``ram``. Close it (or leave its
    ``with`` block) to release every stage still loaded.

    The stage after the running one is built, planned and set up on a thread of the pipeline's
    own; when that fails, a warning says why and the stage is loaded at its start instead.

    Between runs the stages stay loaded as far as the budget allows. When a stage needs memory
    that others hold, it is taken from the stage needed again last (the runs going round the
    pipeline), and from that stage only the blocks missing, those it runs last: the rest stays,
    and the blocks given back are read again ahead of its next turn (for the first stage,
    behind the last stage of the run before). A kept stage whose checkpoint changed on disk
    since its load (written to, replaced, resized or removed) is loaded again from the file as
    it is now, and the report says why.
    """

    def __init__(
        self,
        stages: Sequence[Stage],
        *,
        device: str | torch.device | None = None,
        prefetch: bool = True,
        keep: bool = True,
        ram: int | str | None = None,
        vram: int | str | None = None,
        groups: Sequence[Group] = (),
    ) -> None:
        from ..device import resolve_device

        stages = list(stages)
        if not stages or not all(isinstance(s, Stage) for s in stages):
            raise ArgumentError("stages: expected a non-empty list of trash_panda.Stage")
        names = [s.name for s in stages]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ArgumentError(f"stages: {', '.join(twice)} named twice; each stage needs a name of its own")
        for flag, value in (("prefetch", prefetch), ("keep", keep)):
            if not isinstance(value, bool):
                raise ArgumentError(f"{flag}: expected True or False, got {value!r}")
        groups = _check_groups(groups, names)
        self._keeper = StageKeeper(
            stages,
            resolve_device(device),
            prefetch=prefetch,
            keep=keep,
            ram=None if ram is None else _core.parse_size(ram, "ram"),
            vram=None if vram is None else _core.parse_size(vram, "vram"),
            groups=groups,
        )
        self._runs = 0
        self._running: PipelineRun | None = None
        self._run_lock = threading.Lock()
        self._closed = False

    @property
    def stages(self) -> list[Stage]:
        """The stages, in the order each run enters them."""
        return self._keeper.stages

    @property
    def device(self) -> torch.device:
        """The device every stage computes on."""
        return self._keeper.device

    @property
    def ram(self) -> int | None:
        """The RAM the stages hold together at most (None: what the machine has free)."""
        return self._keeper.ram

    @property
    def vram(self) -> int | None:
        """The device memory the stages hold together at most (None: what the device has free)."""
        return self._keeper.vram

    @property
    def records(self) -> list[_core.StageRecord]:
        """Each stage's turn in each run so far, as :meth:`report` shows them."""
        return self._keeper.records

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def run(self) -> Iterator[PipelineRun]:
        """One run of the pipeline: enter each stage with ``run.stage(name)``, in order."""
        with self._run_lock:  # two threads starting runs at once: one gets the error
            if self._closed:
                raise ArgumentError("the pipeline is closed")
            if self._running is not None:
                raise ArgumentError("a run of this pipeline is already going on; runs go one after another")
            self._runs += 1
            run = PipelineRun(self._keeper, self._runs)
            self._running = run
        try:
            yield run
        finally:
            self._running = None
            self._keeper.end_run()

    def settle(self) -> None:
        """Waits until the stage being read ahead is set up (its hooks on its model); nothing
        to wait for when none is. A caller that adds hooks of its own to a stage's model, or
        reads them, does so after this."""
        self._keeper.settle()

    @property
    def loaded(self) -> list[str]:
        """The stages loaded now (kept from a run, or read ahead), in pipeline order; waits for
        the stage being read ahead to be set up."""
        return self._keeper.loaded_names()

    def report(self) -> str:
        """Every stage of every run so far: how it was loaded, the free memory predicted for it
        against what it found, and where its time went; first, how its loads read."""
        return self._keeper.report()

    def close(self) -> None:
        """Releases every stage still loaded, and prints the report with
        ``TRASH_PANDA_PROFILE=1``. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        from ..settings import setting

        try:
            self._keeper.close()
        finally:
            if self.records and setting("profile"):
                print(self.report(), file=sys.stderr)


def _check_groups(groups: Sequence[Group], names: list[str]) -> list[Group]:
    """``groups`` checked against the stages ``names``: each member a stage, in one group at
    most, the members of a group consecutive in the pipeline."""
    if isinstance(groups, Group) or not all(isinstance(g, Group) for g in groups):
        raise ArgumentError("groups: expected a list of trash_panda.Group")
    groups = list(groups)
    seen: dict[str, str] = {}
    for g in groups:
        if g.name in {h.name for h in groups if h is not g}:
            raise ArgumentError(f"groups: {g.name} named twice; expected a name of its own for each group")
        for m in g.members:
            if m not in names:
                raise ArgumentError(f"group {g.name}: {m!r} is not a stage; expected some of {', '.join(names)}")
            if m in seen:
                raise ArgumentError(
                    f"group {g.name}: stage {m!r} is a member of group {seen[m]} already; "
                    "expected each stage in one group at most"
                )
            seen[m] = g.name
        places = sorted(names.index(m) for m in g.members)
        if places != list(range(places[0], places[0] + len(places))):
            raise ArgumentError(
                f"group {g.name}: members {', '.join(g.members)} are not next to one another in the pipeline "
                f"({', '.join(names)}); expected consecutive stages"
            )
    return groups
