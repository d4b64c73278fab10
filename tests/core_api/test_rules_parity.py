"""Python asks the core, never restates it: one test per rule that Python once held a
copy of, checking Python's public behaviour against the core's answer on the cases where the two
used to disagree, and that the Python copy is gone."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import trash_panda as tp
from support.models import Tiny, TwoLists, on_meta, save
from trash_panda import ArgumentError, PlanError, Tier, _core
from trash_panda._dtypes import _HEADER_TO_TORCH, core_name, needs_expansion, torch_dtype
from trash_panda.blocks import find_blocks
from trash_panda.checkpoint import Checkpoint


def _checkpoint(path: Path, tensors: dict[str, tuple[torch.dtype, int]]) -> Checkpoint:
    save_file({k: torch.zeros(n).to(d) for k, (d, n) in tensors.items()}, str(path))
    return Checkpoint(path)


@pytest.mark.parametrize(
    ("tensors", "want"),
    [
        # f64 weights compute in f32 (Python once kept f64 out of the vote).
        ({"a.weight": (torch.float64, 100), "b.weight": (torch.bfloat16, 10)}, torch.float32),
        # Elements, not bytes: 60 bf16 elements (120 bytes) beat 40 f32 ones (160 bytes).
        ({"a.weight": (torch.bfloat16, 60), "b.weight": (torch.float32, 40)}, torch.bfloat16),
        # No float weight at all: the core's fallback, bf16.
        ({"ids": (torch.int64, 10)}, torch.bfloat16),
    ],
)
def test_compute_dtype(tmp_path: Path, tensors: dict[str, tuple[torch.dtype, int]], want: torch.dtype) -> None:
    from trash_panda.hf import checkpoint_dtype

    ckpt = _checkpoint(tmp_path / "m.safetensors", tensors)
    core = torch_dtype(_core.infer_compute_dtype(ckpt.tensors()))
    assert core == want
    assert checkpoint_dtype(ckpt) == core


def test_run_order_duplicates_raise_in_both_paths(tmp_path: Path) -> None:
    """install_offload(order=) and stage's choose_order refuse a block named twice with the
    core's one message."""
    from trash_panda.offload.order import choose_order

    torch.manual_seed(0)
    path = save(Tiny(), tmp_path / "m.safetensors")
    blocks = [f"blocks.{i}." for i in range(6)]
    order = ["blocks.1", "blocks.1."]
    with pytest.raises(ArgumentError, match="twice") as core:
        _core.full_order(order, blocks)
    with pytest.raises(ArgumentError) as staged:
        choose_order(path, blocks, order, None)
    assert str(staged.value) == str(core.value)
    model = on_meta(Tiny)
    plan = tp.Plan.manual(resident=blocks[:2], streamed=blocks[2:])
    tp.stream_load(model, path, plan=plan, device="cpu")
    try:
        with pytest.raises(ArgumentError) as installed:
            tp.install_offload(model, order=order)
        assert str(installed.value) == str(core.value)
    finally:
        tp.release(model)


@pytest.mark.parametrize(
    ("name", "tier"),
    [("gpu", Tier.DEVICE), ("CUDA", Tier.DEVICE), ("vram", Tier.DEVICE), ("cpu", Tier.RAM), ("memory", Tier.RAM)],
)
def test_tier_aliases(name: str, tier: Tier) -> None:
    assert Tier(name) == tier
    p = tp.Plan.manual(resident=["blocks.0."], streamed=["blocks.1."], streamed_tier=name)
    assert p.blocks_in(name) == (["blocks.0.", "blocks.1."] if tier == Tier.DEVICE else ["blocks.1."])


def test_scale_names_and_pairing(tmp_path: Path) -> None:
    """The weight a scale scales and the scale a weight pairs with are the core's; a scale of a
    loaded weight is not unexpected (input_scale included), one of a weight the model lacks is."""
    import trash_panda.checkpoint_names

    for gone in ("SCALE_SUFFIXES", "is_scale", "weight_of_scale"):
        assert not hasattr(trash_panda.checkpoint_names, gone)
    for suffix in _core.SCALE_SUFFIXES:
        assert _core.is_scale_name(f"l{suffix}")
        assert _core.weight_of_scale(f"l{suffix}") == "l.weight"
    assert not _core.is_scale_name("l.weight") and _core.weight_of_scale("l.weight") is None
    assert _core.paired_scale("l.weight", {"l.input_scale", "l.weight_scale_inv"}) == "l.weight_scale_inv"
    assert _core.paired_scale("l.weight", {"l.input_scale"}) is None

    torch.manual_seed(0)
    sd = {k: v.contiguous() for k, v in Tiny().state_dict().items()}
    sd["blocks.0.up.input_scale"] = torch.ones(1)
    sd["vision.patch.weight_scale"] = torch.ones(1)
    path = tmp_path / "m.safetensors"
    save_file(sd, str(path))
    model = on_meta(Tiny)
    report = tp.stream_load(model, path, plan=tp.Plan.manual(resident=[f"blocks.{i}." for i in range(6)], streamed=[]))
    try:
        assert report.unexpected == ["vision.patch.weight_scale"]
    finally:
        tp.release(model)


def test_float_dtypes() -> None:
    for header, attr in _HEADER_TO_TORCH.items():
        if hasattr(torch, attr):
            assert _core.is_float_dtype(header) == getattr(torch, attr).is_floating_point, header
    assert _core.is_float_dtype("F64") and not _core.is_float_dtype("BOOL")


def test_needs_expansion(tmp_path: Path) -> None:
    """A resident weight is expanded each run exactly when the core's rule says so: fp8 and f16
    weights of a bf16 model are, bf16 and integer ones are not, a scaled bf16 one is."""
    cases = [
        ("F8_E4M3", "BF16", False, True),
        ("F16", "BF16", False, True),
        ("BF16", "BF16", False, False),
        ("BF16", "BF16", True, True),
        ("I64", "BF16", True, False),
        ("F64", "F32", False, True),
    ]
    for held, compute, scaled, want in cases:
        assert _core.needs_expansion(held, compute, scaled) is want, (held, compute, scaled)
        assert needs_expansion(torch_dtype(held), torch_dtype(compute), scaled) is want

    torch.manual_seed(0)
    sd = {k: v.to(torch.bfloat16).contiguous() for k, v in Tiny().state_dict().items()}
    sd["blocks.0.up.weight"] = sd["blocks.0.up.weight"].to(torch.float16)
    sd["blocks.1.up.weight"] = sd["blocks.1.up.weight"].to(torch.float8_e4m3fn)
    path = tmp_path / "m.safetensors"
    save_file(sd, str(path))
    model = on_meta(Tiny)
    tp.stream_load(model, path, plan=tp.Plan.manual(resident=[f"blocks.{i}." for i in range(6)], streamed=[]))
    try:
        state = tp.offload.state.get_state(model)
        assert state is not None and state.compute_dtype == torch.bfloat16
        work = {s.name for b in state.blocks for s in b.tensors if s.needs_work}
        assert work == {"blocks.0.up.weight", "blocks.1.up.weight"}
        for block in state.blocks:
            for spec in block.tensors:
                want = _core.needs_expansion(spec.info.dtype, core_name(spec.target), spec.scale is not None)
                assert spec.needs_work == want, spec.name
    finally:
        tp.release(model)


def test_block_prefixes() -> None:
    """find_blocks, the planner's model blocks and the core's check give one error for a block
    named twice and one for prefixes inside each other."""
    for prefixes, what in [(["blocks.0", "blocks.0."], "named twice"), (["blocks.1", "blocks.1.up"], "overlap")]:
        with pytest.raises(PlanError, match=what) as core:
            _core.check_block_prefixes(prefixes)
        with pytest.raises(PlanError) as found:
            find_blocks(on_meta(Tiny), prefixes)
        assert str(found.value) == str(core.value)
    # The planner's own paths (prefixes given to make_plan, a manual plan) raise the same.
    with pytest.raises(PlanError) as planned:
        _core.make_plan([], ["blocks.0", "blocks.0."], None, False, ram=1 << 30)
    with pytest.raises(PlanError) as manual:
        tp.Plan.manual(resident=["blocks.0"], streamed=["blocks.0."])
    with pytest.raises(PlanError) as core:
        _core.check_block_prefixes(["blocks.0", "blocks.0."])
    assert str(planned.value) == str(manual.value) == str(core.value)
    assert _core.check_block_prefixes(["blocks.1", "blocks.10."]) == ["blocks.1.", "blocks.10."]
    with pytest.raises(PlanError, match="overlap"):
        _core.check_block_prefixes(["blocks.", "blocks.1."])
    assert [b.prefix for b in find_blocks(on_meta(TwoLists), ["single_blocks", "double_blocks.0"])][-1] == (
        "double_blocks.0."
    )


@pytest.mark.parametrize("gpu", [False, True])
def test_held_on_device(tmp_path: Path, gpu: bool) -> None:
    torch.manual_seed(0)
    ckpt = Checkpoint(save(Tiny(), tmp_path / "m.safetensors"))
    p = _core.make_plan(
        [(t.name, t) for t in ckpt.tensors()],
        None,
        10**6 if gpu else None,
        gpu,
        ram=10**9 if gpu else 4 * 10**5,
        compute_dtype="bf16",
        min_free_ram=0,
        headroom_vram=0,
    )
    b = p.budgets
    assert b is not None and b.gpu is gpu and b.expansion > 0 and b.staging_buffers > 0
    slots = b.device_slot_bytes if gpu else b.host_staging + b.mapped_window
    assert b.held_on_device == slots + b.expansion
    assert (b.device_slot_bytes > 0) is gpu
    # A loader on a GPU reads resident weights into a pinned ring of its own: host RAM the plan
    # sets aside beside the staging pool.
    assert b.loader_ring == (_core.LOADER_RING_BYTES if gpu else 0)
    if gpu:
        assert b.ram_budget == b.usable_ram - b.min_free_ram - b.host_staging - b.loader_ring


def test_the_loaders_ring_is_what_the_plan_counts() -> None:
    from trash_panda.offload.backends.loader_copies import HostRing, LoaderCopies
    from trash_panda.offload.materialize import GROUP_BYTES

    class Unpinned:
        def pin(self, t: torch.Tensor, ranges: object, fallback: str) -> None:
            return None

        def side(self) -> Unpinned:
            return self

    copies = LoaderCopies(Unpinned(), GROUP_BYTES)  # type: ignore[arg-type]
    ring = HostRing(copies.device, copies.ring_half)
    assert ring.raw.untyped_storage().nbytes() == _core.LOADER_RING_BYTES


def test_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The headroom, the look-ahead and "pinned_buffers 0 means lookahead + 1" are the core's."""
    from trash_panda import settings
    from trash_panda.generate import _parser

    monkeypatch.delenv("TRASH_PANDA_LOOKAHEAD", raising=False)
    monkeypatch.delenv("TRASH_PANDA_PINNED_BUFFERS", raising=False)
    assert _core.DEFAULT_HEADROOM_VRAM == 1_500_000_000
    assert _core.DEFAULT_LOOKAHEAD == 2 == int(settings.DEFAULTS["lookahead"])
    assert settings.DEFAULTS["pinned_buffers"] == "0"
    assert inspect.signature(tp.plan).parameters["headroom_vram"].default is None
    assert '"1.5GB"' in _parser().format_help().replace("\n", " ").replace("  ", " ")

    torch.manual_seed(0)
    path = save(Tiny(), tmp_path / "m.safetensors")
    p = tp.plan(on_meta(Tiny), path, vram="1MB", ram="1GB", device="cpu")
    assert p.budgets.reserve == _core.DEFAULT_HEADROOM_VRAM
    assert p.lookahead == _core.DEFAULT_LOOKAHEAD
    assert _core.asked_staging_buffers(0) is None and _core.asked_staging_buffers(4) == 4
    assert p.budgets.staging_buffers == _core.staging_buffers(None, p.lookahead) == _core.DEFAULT_LOOKAHEAD + 1
    for asked in (0, 5):
        q = tp.plan(on_meta(Tiny), path, vram="1MB", ram="1GB", device="cpu", pinned_buffers=asked)
        assert q.budgets.staging_buffers == _core.staging_buffers(_core.asked_staging_buffers(asked), q.lookahead)
        assert q.budgets.staging_buffers == (3 if asked == 0 else 5)
    monkeypatch.setenv("TRASH_PANDA_PINNED_BUFFERS", "0")
    assert tp.plan(on_meta(Tiny), path, vram="1MB", ram="1GB", device="cpu").budgets.staging_buffers == 3


# str() of the former Python LoadReport dataclass on the same figures.
OLD_TABLES = [
    "stream_load m.safetensors -> cpu (bfloat16) in 0.00 s\n"
    "  outside    0 tensors     0.00 GB    0.00 s  read to the device\n"
    "  device      0 blocks     0.00 GB    0.00 s  read to the device, stored dtype\n"
    "  ram         0 blocks     0.00 GB    0.00 s  mapped, staged before each run\n"
    "  disk        0 blocks     0.00 GB    0.00 s  read before each run (-)",
    "stream_load /x/y -> cuda:0 (float16) in 12.35 s\n"
    "  outside    3 tensors     2.00 GB    1.00 s, 2.00 GB/s  read to the device\n"
    "  device      4 blocks     0.12 GB    0.33 s, 0.37 GB/s  read to the device, stored dtype\n"
    "  ram         7 blocks    10.00 GB    0.00 s  in memory as BF16, staged before each run\n"
    "  disk        2 blocks     5.50 GB    2.25 s, 2.44 GB/s  read before each run (direct)\n"
    "  embedding tables 0.00 GB mapped, rows read as looked up\n"
    "  staging pool 0.01 GB\n"
    "  disk tier: the disk tier does not fit in the page cache\n"
    "  buffers not in the checkpoint, kept from construction: b0, b1, b2, b3, b4, b5 ...\n"
    "  1 checkpoint tensors the model has no place for: vision.patch.weight",
    "stream_load c -> cpu (float32) in 0.00 s\n"
    "  outside    0 tensors     0.00 GB    0.00 s  read to the device\n"
    "  device      0 blocks     0.00 GB    0.00 s  read to the device, stored dtype\n"
    "  ram         0 blocks     0.00 GB    0.00 s  mapped, staged before each run\n"
    "  disk        0 blocks     0.00 GB    0.00 s  read before each run (-)\n"
    "  buffers not in the checkpoint, kept from construction: a, b\n"
    "  6 checkpoint tensors the model has no place for: t0, t1, t2, t3, t4, t5",
]


def _reports() -> list[_core.LoadReport]:
    a = _core.LoadReport("m.safetensors", "cpu", "bfloat16")
    b = _core.LoadReport("/x/y", "cuda:0", "float16")
    b.seconds = 12.3456
    b.outside = _core.TierLoad(tensors=3, bytes=2_000_000_000, seconds=1.0)
    b.device_tier = _core.TierLoad(blocks=4, bytes=123_456_789, seconds=0.333)
    b.ram = _core.TierLoad(blocks=7, bytes=9_999_999_999)
    b.disk = _core.TierLoad(blocks=2, bytes=5_500_000_000, seconds=2.25)
    b.ram_source = "in memory as BF16"
    b.disk_mode = "direct"
    b.disk_mode_reason = "the disk tier does not fit in the page cache"
    b.staging_bytes = 10_000_000
    b.mapped_bytes = 1_234_567
    b.kept_buffers = [f"b{i}" for i in range(7)]
    b.unexpected = ["vision.patch.weight"]
    c = _core.LoadReport("c", "cpu", "float32")
    c.disk_mode = ""
    c.kept_buffers = ["a", "b"]
    c.unexpected = [f"t{i}" for i in range(6)]
    return [a, b, c]


def test_load_report_is_the_cores(tmp_path: Path) -> None:
    """One load report type, the core's: the table the Python dataclass printed, the profile's
    summary the hand-written dict made, and what stream_load returns."""
    import importlib.util

    assert tp.LoadReport is _core.LoadReport and tp.offload.LoadReport is _core.LoadReport
    assert importlib.util.find_spec("trash_panda.offload.report") is None
    assert [str(r) for r in _reports()] == OLD_TABLES

    r = _reports()[1]
    with pytest.raises(AttributeError):
        r.ram.blocks = 1  # type: ignore[misc]
    mapped = json.loads(r.summary(None, None, None))
    assert mapped["device"] == {"bytes": 2_123_456_789, "seconds": pytest.approx(1.333)}
    assert mapped["ram"]["bytes"] == 9_999_999_999 and mapped["ram_in_memory"] is None
    read = json.loads(r.summary(4, "BF16", (3, 100, 0.5, 0.25)))
    assert read["ram"]["bytes"] == 0
    assert read["ram_in_memory"]["bytes"] == 9_999_999_999 and read["ram_in_memory"]["threads"] == 4
    assert read["loader"] == {"blocks": 3, "bytes": 100, "seconds": 0.5, "waited_seconds": 0.25}

    torch.manual_seed(0)
    path = save(Tiny(), tmp_path / "m.safetensors")
    model = on_meta(Tiny)
    plan = tp.Plan.manual(resident=["blocks.0.", "blocks.1."], streamed=[f"blocks.{i}." for i in range(2, 6)])
    report = tp.stream_load(model, path, plan=plan, device="cpu")
    try:
        assert isinstance(report, _core.LoadReport)
        assert (report.device_tier.blocks, report.ram.blocks, report.outside.tensors) == (2, 4, 4)
        assert report.ram.bytes > 0 and report.staging_bytes > 0
        assert str(report).startswith(f"stream_load {path} -> cpu (float32)")
    finally:
        tp.release(model)


def test_departure_is_the_cores() -> None:
    """A stage's end leaves as the core's ``depart`` decides (the runner once restated it), and
    no arrival or departure kind crosses the binding as a string."""
    from trash_panda.pipeline import keeper, turn

    kept = {"failed": False, "final_pass": False, "release_after": False, "keep": True, "passed": 0}
    # What a final pass freed counts against what was asked; the rest is given back now.
    leaving = _core.depart(**{**kept, "final_pass": True, "passed": 100}, to_give=300, sheddable=1000)
    assert (leaving.departure, leaving.give) == (_core.Departure.KEPT, 200)
    # Asked for all it could shed: released, by its final pass when one ran.
    leaving = _core.depart(**{**kept, "final_pass": True}, to_give=1000, sheddable=1000)
    assert (leaving.departure, leaving.give) == (_core.Departure.FINAL_PASS, 0)
    assert _core.depart(**{**kept, "keep": False}, to_give=0, sheddable=0).departure == _core.Departure.RELEASED
    assert _core.depart(**{**kept, "failed": True}, to_give=5, sheddable=9).departure == _core.Departure.FAILED
    with pytest.raises(TypeError):
        _core.StageRecord(1, "s", "kept", "kept")  # type: ignore[arg-type]
    record = _core.StageRecord(1, "s", _core.Arrival.READ_AHEAD, _core.Departure.KEPT, holds=10)
    assert (record.arrival, record.departure) == (_core.Arrival.READ_AHEAD, _core.Departure.KEPT)
    assert _core.pipeline_report([record]).startswith("pipeline:\n  run 1 s: read ahead, 0.00 s")
    source = inspect.getsource(keeper) + inspect.getsource(turn)
    for name in ("kept", "released", "final_pass", "failed", "read_ahead", "read_at_start", "replanned"):
        assert f'"{name}"' not in source, name


def test_still_fits_is_the_cores(tmp_path: Path) -> None:
    """A stage read ahead whose start missed the prediction is kept when a fresh plan moves no
    block and the loaded plan's needs fit: the core's ``still_fits`` answers as the runner's
    own comparison of tier lists did, and that copy is gone."""
    from trash_panda.pipeline import keeper

    torch.manual_seed(0)
    path = save(Tiny(), tmp_path / "m.safetensors")
    roomy = tp.plan(on_meta(Tiny), path, ram="1GB", min_free_ram=0)
    tight = tp.plan(on_meta(Tiny), path, ram=roomy.needs("s").ram // 2, min_free_ram=0)
    assert [b.tier for b in tight.blocks] != [b.tier for b in roomy.blocks]

    def old(loaded: tp.Plan, fresh: tp.Plan, actual: _core.Free) -> bool:
        same = [b.tier.value for b in fresh.blocks] == [b.tier.value for b in loaded.blocks]
        return same and loaded.needs("s").fits(actual)

    need = roomy.needs("s").ram
    for fresh in (roomy, tight):
        for ram in (need - 1, need, 10**9):
            actual = _core.Free(ram)
            assert _core.still_fits("s", roomy, fresh, actual) is old(roomy, fresh, actual)
    assert not hasattr(keeper, "_tiers")


def test_giving_back_is_the_cores(tmp_path: Path) -> None:
    """Which blocks a kept stage gives back (those run last first, resident only, until the bytes
    asked are covered), what its final pass freed counts for, and what its loader's reads cost
    are the core's answers; the Python loop and size table they replaced are gone."""
    from trash_panda.offload import hooked
    from trash_panda.offload.state import get_state
    from trash_panda.pipeline import loaded

    torch.manual_seed(0)
    path = save(Tiny(), tmp_path / "m.safetensors")
    blocks = [f"blocks.{i}." for i in range(6)]
    p = tp.plan(on_meta(Tiny), path, ram="1GB", min_free_ram=0)
    sizes = {b.name: b.stored_bytes for b in p.blocks if b.tier == Tier.DEVICE}
    assert len(sizes) == 6
    order = [blocks[i] for i in (1, 0, 2, 3, 4, 5)]

    def old(gone: set[str], ask: int, counted: int) -> tuple[list[str], int]:
        chosen, total = [], counted
        for b in reversed(order):
            if total >= ask:
                break
            if b in gone or b not in sizes:
                continue
            chosen.append(b)
            total += sizes[b]
        return chosen, total - counted

    one = sizes[blocks[0]]
    for gone, ask, counted in [(set(), 1, 0), (set(), 2 * one + 1, 0), ({"blocks.5."}, 2 * one, one), (set(), 0, 0)]:
        shed = _core.give_back(p, order, sorted(gone), ask, counted=counted)
        assert (shed.blocks, shed.bytes) == old(gone, ask, counted)
    freed = ["blocks.3.", "elsewhere.", "blocks.0."]
    shed = _core.resident_among(p, freed)
    assert (shed.blocks, shed.bytes) == (["blocks.3.", "blocks.0."], sizes["blocks.3."] + sizes["blocks.0."])
    # A stage's blocks compute in VRAM when it holds some: one rule, the core's.
    assert _core.Holds(1, 2).in_compute_memory(5) == _core.Holds(0, 5)
    assert _core.Holds(1, 0).in_compute_memory(5) == _core.Holds(5, 0)
    assert _core.Holds(1, 2).compute_part(_core.Holds(3, 4)) == 4 and _core.Holds(1, 0).on_device is False
    # The loader's costs: resident blocks their stored bytes, the outside weights their budget.
    model = on_meta(Tiny)
    tp.stream_load(model, path, plan=p, device="cpu")
    try:
        state = get_state(model)
        assert state is not None
        costs = hooked._costs(p, state, {0: []}, ram_tier=True)
        want = {("block", b.index): sizes[b.prefix] for b in state.blocks}
        assert p.budgets is not None
        want[("outside", 0)] = p.budgets.outside
        assert costs == want
    finally:
        tp.release(model)
    source = inspect.getsource(loaded) + inspect.getsource(hooked)
    assert "reversed(" not in source and "def resident_bytes" not in source and "Holds(0," not in source
