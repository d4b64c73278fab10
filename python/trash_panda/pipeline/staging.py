"""The pipeline's one staging pool: every stage's engine stages into the same
buffers, taken at its turn and given back when it ends, so a stage read ahead or kept loaded
between runs holds none. Sized once, before the first stage streams, for the largest block of
any stage in any tier; on CUDA registered as pinned once; freed when the pipeline closes.

Each stage's plan counts the pool as its staging buffers (``budgets.shared_staging``) and its
release gives none of it back (``Holds``); the pipeline's free memory has the pool back once
(``Free.with_shared_pool``), so the pool is counted once for all the stages."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from .. import _core
from ..offload.meter import meter_for

if TYPE_CHECKING:
    import torch

    from ..offload.backends.pinning import PinnedRegistration
    from ..plan import Plan


class SharedStaging:
    """The pool and its pinned registration; nothing until :meth:`size_for`."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool: _core.StagingPool | None = None
        self._pinned: PinnedRegistration | None = None
        self.sized = False

    @property
    def bytes(self) -> int:
        """Bytes of the pool (0 before it is made, or after it is freed)."""
        return self.pool.bytes if self.pool is not None else 0

    def size_for(self, plans: Iterable[Callable[[], Plan]]) -> None:
        """Makes the pool for the stages' ``plans`` (each made when called): as many buffers as
        the stage that wants most, each as large as the largest block of any stage in any tier
        (``Plan.shared_staging``). Once, and only where some stage streams: a pipeline whose
        stages keep every block resident holds no pool for its whole life. A stage that cannot
        be built or planned now is left out (its turn reports why), and keeps buffers of its
        own if its blocks do not fit."""
        if self.sized:
            return
        self.sized = True
        made = []
        for make in plans:
            try:
                made.append(make())
            except Exception:  # the stage's own turn raises it again
                continue
        if not any(p.budgets is not None and p.budgets.staging_buffers > 0 for p in made):
            return
        needs = [n for n in (p.shared_staging() for p in made) if n[0] > 0 and n[1] > 0]
        if not needs:
            return
        count = max(n[0] for n in needs)
        size = max(n[1] for n in needs)
        # Made beside a running stage (on the read-ahead's thread): its pages are not that
        # stage's activations on a CPU meter.
        made_pool: list[_core.StagingPool] = []

        def allocate() -> int:
            made_pool.append(_core.StagingPool(size, count))
            return made_pool[0].bytes

        import torch

        meter_for(torch.device("cpu")).moved_in(allocate)  # host memory, on CUDA too
        self.pool = made_pool[0]
        if self.device.type == "cuda":
            from ..offload.backends.cuda import register_pinned

            self._pinned = register_pinned(torch.cuda.cudart(), self.pool)

    def planned(self, make: Callable[..., Plan], ram: int) -> Plan:
        """A stage's plan by ``make`` (keyword arguments: plan() options over the stage's) for
        ``ram`` bytes free, with the pool counted where the stage's blocks fit it. A stage whose
        blocks do not fit keeps buffers of its own, planned without the pool's RAM: the
        pipeline's free memory has the pool back only for the plans that count it."""
        if self.pool is None:
            return make()
        p = make(staging_pool=self.pool)
        if p.budgets is not None and not p.budgets.shared_staging:
            p = make(ram=max(0, ram - self.pool.bytes))
        return p

    def close(self) -> None:
        """Unregisters and frees the pool (the engines still holding it let it go as they close)."""
        if self._pinned is not None:
            self._pinned.close()
            self._pinned = None
        self.pool = None
