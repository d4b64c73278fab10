"""One staging pool for the whole pipeline: every stage's engine stages into the same
buffers, taken at its turn and given back at its end; each stage's plan counts the pool, the
pipeline counts it once; the pool goes with the pipeline; a stage that asks for it out of turn
gets an error naming the holder. The tiny pipeline of examples/pipeline_stages.py, every block
streamed, still equals the plain pipeline bit for bit."""

from __future__ import annotations

import dataclasses
import gc
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch

import trash_panda as tp
from trash_panda import _core
from trash_panda.errors import StreamError
from trash_panda.offload.state import get_state

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import pipeline_stages as ps

from support.runner import ahead, one_run


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ps.save_pipeline(tmp_path_factory.mktemp("pool") / "pipe")


@pytest.fixture(scope="module")
def want(folder: Path) -> torch.Tensor:
    return ps.plain(folder)


def streamed(folder: Path, **options: Any) -> list[tp.Stage]:
    """Every block of every stage streamed, with plans that do not move with the peaks."""
    opts = {"resident_blocks": 0, "min_free_ram": 0, "activation_vram": 0, **options}
    return [tp.Stage(n, (lambda n=n: ps.build(folder, n)), folder / n, options=dict(opts)) for n in ps.COMPONENTS]


def pool_of(pipe: tp.Pipeline) -> _core.StagingPool:
    pool = pipe._keeper.staging.pool
    assert pool is not None, "the pipeline made no shared staging pool"
    return pool


def test_every_stage_streams_through_one_pool_bit_for_bit(folder: Path, want: torch.Tensor) -> None:
    seen: dict[str, tuple[list[tuple[int, int]], str | None, int]] = {}

    def record(name: str) -> None:
        state = get_state(pipe._keeper.loaded[name].model)
        assert state is not None and state.engine is not None
        seen[name] = (state.engine.staging_buffers(), pool_of(pipe).holder, state.engine.staging_bytes())

    with tp.Pipeline(streamed(folder)) as pipe:
        inside = {n: (lambda n=n: record(n)) for n in ps.COMPONENTS}
        for _ in range(2):
            assert torch.equal(one_run(pipe, inside=inside), want)
        pool = pool_of(pipe)
        # one_run calls back inside the first two stages; the decoder's engine is checked as
        # it stays loaded.
        assert sorted(seen) == ["text_encoder", "transformer"]
        vae = get_state(pipe._keeper.loaded["vae"].model)
        assert vae is not None and vae.engine is not None and vae.engine.staging_buffers() == pool.buffers()
        for name, (buffers, holder, nbytes) in seen.items():
            # One pool: the same addresses in every stage, held by the stage that runs.
            assert buffers == pool.buffers(), name
            assert holder == f"stage {name}"
            assert nbytes == pool.bytes
        # Between turns no stage holds it, though all three stay loaded.
        assert pipe.loaded == list(ps.COMPONENTS) and pool.holder is None
        assert pool.users == 3


def test_each_plan_counts_the_pool_and_the_pipeline_counts_it_once(folder: Path, want: torch.Tensor) -> None:
    with tp.Pipeline(streamed(folder)) as pipe:
        assert torch.equal(one_run(pipe, final=False), want)
        pool = pool_of(pipe)
        # Sized for the largest block of any stage, with the most buffers any stage wants.
        needs = [s.plan.shared_staging() for s in pipe._keeper.loaded.values()]
        assert pool.count == max(n[0] for n in needs)
        assert pool.buffer_bytes == max(n[1] for n in needs)
        held = _core.Holds()
        for name, s in pipe._keeper.loaded.items():
            b = s.plan.budgets
            assert b is not None and b.shared_staging, name
            # The plan counts the whole pool, as large as it is, not its own largest block...
            assert (b.staging_buffers, b.staging_buffer_bytes, b.host_staging) == (
                pool.count,
                pool.buffer_bytes,
                pool.bytes,
            )
            # ...what the engine really stages into...
            state = get_state(s.model)
            assert state is not None and state.engine is not None
            assert state.engine.staging_bytes() == b.host_staging
            # ...and needs its room to start, but holds none of it: its release frees no pool.
            need = s.plan.needs(name)
            assert need.ram == s.holds.ram + b.host_staging + b.min_free_ram + b.reserve
            assert s.holds == s.plan.holds(name)
            held = held.plus(s.held_now())
        # Under a budget, the pipeline's free memory is the budget less what the stages hold,
        # none of it the pool; a plan for it then takes the pool out once: 8 MiB are left,
        # not 8 MiB less two more pools.
        pipe._keeper.ram = held.ram + pool.bytes + (8 << 20)
        assert pipe._keeper._free().ram == pool.bytes + (8 << 20)


def test_the_pool_goes_with_the_pipeline(folder: Path, want: torch.Tensor) -> None:
    pipe = tp.Pipeline(streamed(folder))
    with pipe:
        assert torch.equal(one_run(pipe), want)
        pool = pool_of(pipe)
        assert pool.users > 0
    assert pipe._keeper.staging.pool is None
    # No engine holds its memory any more, and the last reference is ours.
    assert pool.users == 0 and pool.holder is None
    gone = weakref.ref(pool)
    del pool
    gc.collect()
    assert gone() is None


def test_a_stage_asking_out_of_turn_is_told_who_holds_the_pool(folder: Path, want: torch.Tensor) -> None:
    errors: list[str] = []

    def poke() -> None:
        nxt = ahead(pipe, "transformer")
        state = get_state(nxt.model)
        assert state is not None and state.engine is not None
        with pytest.raises(StreamError, match="held by stage text_encoder") as e:
            state.engine.acquire(0)
        errors.append(str(e.value))

    with tp.Pipeline(streamed(folder), keep=False) as pipe:
        assert torch.equal(one_run(pipe, inside={"text_encoder": poke}), want)
    assert len(errors) == 1 and "stage transformer cannot stage block 0" in errors[0]


def test_a_stage_alone_keeps_buffers_of_its_own(folder: Path) -> None:
    model = ps.build(folder, "transformer")
    ckpt = tp.Checkpoint(folder / "transformer")
    tp.stream_load(model, ckpt, tp.plan(model, ckpt, resident_blocks=0))
    try:
        state = get_state(model)
        assert state is not None and state.engine is not None and state.staging_pool is None
        assert state.plan.budgets is not None and not state.plan.budgets.shared_staging
        assert not state.engine.park()  # nothing to give back: the buffers are its own
    finally:
        tp.release(model)


def test_a_pool_too_small_for_a_stage_is_not_counted_by_its_plan(folder: Path) -> None:
    model = ps.build(folder, "transformer")
    ckpt = tp.Checkpoint(folder / "transformer")
    p = tp.plan(model, ckpt, resident_blocks=0)
    small = _core.StagingPool(4096, 2)
    assert p.shared_staging()[1] > 4096
    # A plan made with it does not count it: its blocks do not fit.
    q = tp.plan(model, ckpt, resident_blocks=0, staging_pool=small)
    assert q.budgets is not None and p.budgets is not None and not q.budgets.shared_staging
    figures = [(b.staging_buffers, b.staging_buffer_bytes, b.host_staging) for b in (p.budgets, q.budgets)]
    assert figures[0] == figures[1] and figures[0][2] > 0


def test_two_models_on_a_simulated_device_take_turns_on_one_pool(tmp_path: Path, sim: Any) -> None:
    """The device path: copies out of the pool run ahead of the compute (some wrap into the next
    pass and hold leases at a turn's end); the backend's park waits for them and returns their
    leases, so the engine can give the pool back. Outputs equal the references bit for bit."""
    from support.models import Tiny, on_meta, save
    from trash_panda.offload.backends.cuda import DeviceBackend
    from trash_panda.offload.handle import _install
    from trash_panda.offload.load import load_deferred
    from trash_panda.offload.state import ModelState

    models = []
    for i, dim in enumerate((64, 96)):
        torch.manual_seed(i)
        ref = Tiny(dim=dim, layers=6).to(torch.bfloat16).eval()
        path = save(ref, tmp_path / f"m{i}.safetensors", torch.bfloat16)
        models.append((ref, path, on_meta(Tiny, dim=dim, layers=6)))
    # A GPU plan (device slots), computed on the CPU through the simulation.
    plans = [tp.plan(m, p, vram="1TB", ram="1TB", resident_blocks=0, lookahead=2) for _, p, m in models]
    count = max(p.shared_staging()[0] for p in plans)
    pool = _core.StagingPool(max(p.shared_staging()[1] for p in plans), count)
    handles = []
    for i, (_, path, model) in enumerate(models):
        # Every block streamed: the load leaves no resident block for a loader to read.
        p = tp.plan(model, path, vram="1TB", ram="1TB", resident_blocks=0, lookahead=2, staging_pool=pool)
        assert p.budgets is not None and p.budgets.shared_staging and p.budgets.device_slots == count
        load_deferred(model, path, p, device="cpu", staging_pool=pool, holder=f"m{i}")
        state = get_state(model)
        assert state is not None and state.engine is not None and state.staging_pool is pool
        assert state.engine.staging_buffers() == pool.buffers()

        def backend(s: ModelState) -> DeviceBackend:
            return DeviceBackend(s, sim)

        handles.append(_install(model, state, state.blocks, None, backend))
    x = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(3))
    try:
        with torch.no_grad():
            wants = [ref(x) for ref, _, _ in models]
            for turn in range(4):
                i = turn % 2
                model, handle = models[i][2], handles[i]
                for _ in range(2):
                    assert torch.equal(model(x), wants[i]), (turn, i)
                assert pool.holder == f"stage m{i}"
                other = models[1 - i][2]
                with pytest.raises(StreamError, match=f"held by stage m{i}"):
                    other(x)
                state = get_state(model)
                assert state is not None and state.engine is not None
                handle.backend.park()
                assert state.engine.park()
                assert pool.holder is None
    finally:
        for (_, _, model), handle in zip(models, handles, strict=True):
            tp.release(model, handle)
    assert pool.users == 0


def test_a_stage_the_pool_cannot_hold_is_planned_without_the_pools_ram(folder: Path) -> None:
    """The pipeline's free memory has the pool back for the plans that count it; a stage whose
    blocks do not fit the pool keeps its own buffers and must not count the pool's RAM as free."""
    from trash_panda.pipeline.staging import SharedStaging

    model = ps.build(folder, "transformer")
    ckpt = tp.Checkpoint(folder / "transformer")
    ram = 1 << 30

    def make(**kw: Any) -> tp.Plan:
        return tp.plan(model, ckpt, resident_blocks=0, **{"ram": ram, **kw})

    need = make().shared_staging()
    for size, shared in ((4096, False), (need[1], True)):
        staging = SharedStaging(torch.device("cpu"))
        staging.size_for([])
        staging.pool = _core.StagingPool(size, need[0])
        p = staging.planned(make, ram)
        assert p.budgets is not None and p.budgets.shared_staging is shared
        assert p.budgets.usable_ram == (ram if shared else ram - staging.pool.bytes)


def test_no_pool_where_every_stage_fits_the_budget_alone(folder: Path, want: torch.Tensor, tmp_path: Path) -> None:
    """A budget that holds each stage alone but not all three: the stages make room for each
    other instead of streaming, so no pool is held for the pipeline's life. The pool is sized
    on the read-ahead's thread, each stage planned with the budget to itself."""
    from support.runner import fixed_holds, stages

    holds = {name: h.ram for name, h in fixed_holds(folder).items()}
    budget = max(holds.values()) + min(holds.values()) // 2
    assert budget < sum(holds.values())
    # Keys of its own: no activations remembered by other tests.
    fresh = [dataclasses.replace(s, key=tmp_path / s.name) for s in stages(folder, min_free_ram=0, activation_vram=0)]
    with tp.Pipeline(fresh, ram=budget) as pipe:
        for _ in range(2):
            assert torch.equal(one_run(pipe), want)
        assert pipe._keeper.staging.sized and pipe._keeper.staging.pool is None, pipe.report()
