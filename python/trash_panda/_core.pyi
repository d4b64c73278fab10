"""Type stubs of the compiled core (checked against the module by mypy.stubtest in `make test`)."""

from collections.abc import Container, Sequence
from os import PathLike
from pathlib import Path
from typing import Any, Literal, final

__all__ = [
    "__version__",
    "available_ram",
    "Checkpoint",
    "BlockPlan",
    "Budgets",
    "Engine",
    "EngineConfig",
    "EngineStats",
    "Staging",
    "StagedTensor",
    "StagingPool",
    "rows_cols",
    "scale_layout",
    "FP8_MIN_ELEMENTS",
    "CUDA_CONTEXT_FLOOR",
    "Lease",
    "Plan",
    "SCALE_SUFFIXES",
    "RssSampler",
    "TensorBytes",
    "TensorInfo",
    "cached_bytes",
    "cast",
    "cli_main",
    "clock",
    "current_rss",
    "private_memory",
    "drop_cache",
    "DriveRate",
    "measure_drive",
    "dtype_header_name",
    "expand",
    "infer_compute_dtype",
    "is_float_dtype",
    "is_scale_name",
    "weight_of_scale",
    "needs_expansion",
    "check_block_prefixes",
    "asked_staging_buffers",
    "staging_buffers",
    "DEFAULT_HEADROOM_VRAM",
    "DEFAULT_LOOKAHEAD",
    "LoadReport",
    "TierLoad",
    "make_plan",
    "paired_scale",
    "parse_size",
    "profile_report",
    "quantize_fp8",
    "read_tensors",
    "read_block",
    "ReadLane",
    "HeldPlace",
    "setting",
    "settings",
    "storage_conversion",
    "tier_name",
    "trim_heap",
]

__version__: str

@final
class TensorInfo:
    """One tensor's entry in the index."""
    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> list[int]: ...
    @property
    def file(self) -> str: ...
    @property
    def file_index(self) -> int: ...
    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...
    @property
    def nbytes(self) -> int: ...

@final
class TensorBytes:
    """The bytes of one tensor, handed to torch through `__dlpack__`."""
    def __dlpack__(
        self,
        *,
        stream: Any | None = None,
        max_version: Any | None = None,
        dl_device: Any | None = None,
        copy: bool | None = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __len__(self) -> int: ...

@final
class Checkpoint:
    """An opened checkpoint."""
    def __new__(cls, path: str | PathLike[str]) -> Checkpoint: ...
    @property
    def files(self) -> list[str]: ...
    def __len__(self) -> int: ...
    def __contains__(self, name: str, /) -> bool: ...
    def tensors(self) -> list[TensorInfo]: ...
    def info_of(self, name: str) -> TensorInfo: ...
    def view(self, name: str, lane: ReadLane | None = None) -> TensorBytes: ...
    def check_holds(self, name: str) -> None: ...
    def close(self) -> None: ...

def dtype_header_name(name: str) -> str:
    """The safetensors header name of a dtype written the way users write it ("bf16", "fp8", ...)."""

def expand(
    src: Any,
    src_dtype: str,
    dst: Any,
    dst_dtype: str,
    rows: int,
    cols: int,
    scale_kind: str = "none",
    scale: Any | None = None,
    block: int = 128,
    threads: int | None = None,
) -> None:
    """Expands (fp8 times a scale, or a plain cast) `src` into `dst`."""

def cast(src: Any, src_dtype: str, dst: Any, dst_dtype: str, threads: int | None = None) -> None:
    """Casts between f32, f16 and bf16 with round-to-nearest-even."""

def quantize_fp8(
    src: Any,
    src_dtype: str,
    dst: Any,
    scales: Any,
    rows: int,
    cols: int,
    per_row: bool,
    threads: int | None = None,
) -> None:
    """Quantizes `src` to fp8 e4m3fn into `dst`, writing the float32 scales into `scales`."""

def drop_cache(path: str | PathLike[str]) -> None:
    """Asks the kernel to drop the file's pages from the page cache."""

def cached_bytes(path: str | PathLike[str]) -> int:
    """How many bytes of the file are in the page cache."""

def measure_drive(paths: Sequence[str | PathLike[str]], max_bytes: int = 536870912) -> DriveRate | None:
    """Reads up to `max_bytes` from the start of `paths` with unbuffered reads, several in flight,
    and returns the rate; `None` where the file system refuses unbuffered reads.
    """

@final
class DriveRate:
    """The drive's read rate, measured with unbuffered reads (see `measure_drive`)."""
    @property
    def bytes(self) -> int: ...
    @property
    def seconds(self) -> float: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def gb_per_s(self) -> float: ...

def cli_main(argv: list[str]) -> int:
    """Runs the command line (argv[0] included) and returns its exit code."""

@final
class Plan:
    """A plan: which block lives on the device, in RAM and on disk."""
    @staticmethod
    def manual(resident: list[str], streamed: list[str], streamed_tier: str = "ram") -> Plan: ...
    @staticmethod
    def from_json(text: str) -> Plan: ...
    def to_json(self) -> str: ...
    def assign(self, tier: str, indices: list[int] | None = None, prefixes: list[str] | None = None) -> None: ...
    @property
    def blocks(self) -> list[BlockPlan]: ...
    @property
    def budgets(self) -> Budgets | None: ...
    @property
    def warnings(self) -> list[str]: ...
    @property
    def resolved(self) -> bool: ...
    @property
    def compute_dtype(self) -> str: ...
    @property
    def storage_dtype(self) -> str | None: ...
    @property
    def lookahead(self) -> int: ...
    def shared_staging(self) -> tuple[int, int]: ...
    def resolve(
        self,
        tensors: list[tuple[str, TensorInfo]],
        prefixes: list[str] | None,
        free_vram: int | None,
        has_gpu: bool,
        ram: int | None = None,
        **options: Any,
    ) -> Plan: ...

@final
class BlockPlan:
    """One block of a plan."""
    @property
    def name(self) -> str: ...
    @property
    def tier(self) -> str: ...
    @property
    def stored_bytes(self) -> int: ...
    @property
    def expanded_bytes(self) -> int: ...
    @property
    def staged_bytes(self) -> int: ...
    @property
    def expansion_bytes(self) -> int: ...
    @property
    def tensors(self) -> int: ...

@final
class Budgets:
    """The budgets of a plan, in bytes (see docs/plan-format.md)."""
    @property
    def gpu(self) -> bool: ...
    @property
    def device_limit(self) -> int: ...
    @property
    def reserve(self) -> int: ...
    @property
    def reserve_measured(self) -> bool: ...
    @property
    def cuda_floor(self) -> int: ...
    @property
    def staging_buffers(self) -> int: ...
    @property
    def staging_buffer_bytes(self) -> int: ...
    @property
    def shared_staging(self) -> bool: ...
    @property
    def host_staging(self) -> int: ...
    @property
    def device_slots(self) -> int: ...
    @property
    def device_slot_bytes(self) -> int: ...
    @property
    def expansion(self) -> int: ...
    @property
    def mapped_window(self) -> int: ...
    @property
    def outside(self) -> int: ...
    @property
    def device_budget(self) -> int: ...
    @property
    def device_used(self) -> int: ...
    @property
    def usable_ram(self) -> int: ...
    @property
    def min_free_ram(self) -> int: ...
    @property
    def ram_budget(self) -> int: ...
    @property
    def ram_used(self) -> int: ...
    @property
    def disk_bytes(self) -> int: ...
    @property
    def held_on_device(self) -> int: ...

@final
class EngineConfig:
    """The runtime figures of a plan under the current TRASH_PANDA_* settings."""
    def __new__(cls, plan: Plan) -> EngineConfig: ...
    @property
    def gpu(self) -> bool: ...
    @property
    def compute_dtype(self) -> str: ...
    @property
    def storage_dtype(self) -> str | None: ...
    @property
    def lookahead(self) -> int: ...
    @property
    def align(self) -> int: ...
    @property
    def staging_buffers(self) -> int: ...
    @property
    def staging_buffer_bytes(self) -> int: ...
    @property
    def device_slots(self) -> int: ...
    @property
    def expansion_bytes(self) -> int: ...
    @property
    def mapped_window_bytes(self) -> int: ...
    @property
    def disk_mode(self) -> str: ...
    @property
    def disk_mode_reason(self) -> str: ...
    @property
    def workers(self) -> int: ...
    @property
    def ram_in_memory_threads(self) -> int | None: ...
    @property
    def pin_ram_tier(self) -> bool: ...
    def maps_lookup_table(self, info: TensorInfo) -> bool: ...
    def expansion(self, dtypes: list[str], elements: list[int], scaled: list[bool]) -> list[int | None]: ...

def scale_layout(name: str, weight: list[int], scale: list[int], block: int = 128) -> str:
    """How scale tensor `name` of shape `scale` applies to a weight of shape `weight`: "tensor",
    "row" or "block" (the core's one classification).
    """

def rows_cols(shape: list[int]) -> tuple[int, int]:
    """How the kernels see a tensor of `shape`: (rows, cols)."""

def make_plan(
    tensors: list[tuple[str, TensorInfo]],
    prefixes: list[str] | None,
    free_vram: int | None,
    has_gpu: bool,
    ram: int | None = None,
    **options: Any,
) -> Plan:
    """Plans a model from its tensors (its names and their checkpoint entries) and block prefixes."""

def parse_size(value: int | str, what: str = "size") -> int:
    """Parses a size as users write it ("9GB", "1.5GiB", 123) into bytes."""

def storage_conversion(name: str, dtype: str, shape: list[int], storage: str) -> str:
    """What `storage_dtype` does to a tensor on load: "keep", "bf16" or "fp8" (the core's one rule)."""

def infer_compute_dtype(tensors: Sequence[TensorInfo]) -> Literal["BF16", "F16", "F32"]:
    """The dtype a model computes in when nothing says (the core's one rule): "BF16", "F16" or
    "F32", from the checkpoint's tensors by element count (see `rules::infer_compute_dtype`).
    """

def tier_name(name: str) -> Literal["device", "ram", "disk"]:
    """The canonical name of a tier ("device", "ram" or "disk") from any name the core accepts
    ("gpu", "cuda", "vram", "cpu", "memory" too); a PlanError naming the accepted ones else.
    """

def paired_scale(name: str, names: Container[str]) -> str | None:
    """The scale tensor applied to weight `name`, among `names` (any container of names: a dict
    or a set): `<layer>.weight_scale`, `<layer>.scale_weight` or `<layer>.weight_scale_inv`,
    first found; None for no scale or a name not ending in `.weight` (the core's one rule).
    """

def is_float_dtype(name: str) -> bool:
    """Whether a dtype (a header name such as "F8_E4M3", or a name such as "bf16") is a float:
    f64, f32, f16, bf16 and the two fp8 kinds (the core's one rule).
    """

def is_scale_name(name: str) -> bool:
    """Whether `name` is a scale tensor's: it ends in one of `SCALE_SUFFIXES`."""

def weight_of_scale(name: str) -> str | None:
    """The weight scale tensor `name` scales (`a.b.weight_scale` -> `a.b.weight`, for each of
    `SCALE_SUFFIXES`); None for a name that is not a scale tensor's.
    """

def needs_expansion(held: str, compute: str, scaled: bool) -> bool:
    """Whether a weight held as `held` (a dtype name such as "F8_E4M3" or "bf16") is expanded to
    `compute` before its block runs rather than used as it is: a float in another dtype, or one
    with a scale to apply (`scaled`).
    """

def check_block_prefixes(prefixes: Sequence[str]) -> list[str]:
    """Block prefixes with the trailing dot each needs, after the planner's check: a PlanError for
    an empty prefix, one given twice, or one inside another.
    """

def asked_staging_buffers(setting: int) -> int | None:
    """The staging buffers a `pinned_buffers` setting asks for: None for 0 (the look-ahead decides)."""

def staging_buffers(asked: int | None, lookahead: int) -> int:
    """The staging buffers a plan with a streamed block counts: `asked`, else `lookahead + 1`; at
    least one.
    """

def setting(name: str, argument: object = None) -> bool | int | str:
    """The value of a setting: `argument` if not None, else `TRASH_PANDA_<NAME>`, else the default."""

def settings() -> list[dict[str, str]]:
    """Every setting: name, environment variable, kind, default and what it does."""

FP8_MIN_ELEMENTS: int
CUDA_CONTEXT_FLOOR: int
SCALE_SUFFIXES: list[str]
DEFAULT_HEADROOM_VRAM: int
DEFAULT_LOOKAHEAD: int

@final
class TierLoad:
    """What one tier (or the weights outside the blocks) took at load time. Immutable: a report's
    tier is replaced as a whole.
    """
    def __new__(cls, blocks: int = 0, tensors: int = 0, bytes: int = 0, seconds: float = 0.0) -> TierLoad: ...
    @property
    def blocks(self) -> int: ...
    @property
    def tensors(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def seconds(self) -> float: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class LoadReport:
    """Bytes and seconds of a load, per tier. ``str(report)`` is a short table."""
    def __new__(cls, checkpoint: str, device: str, compute_dtype: str) -> LoadReport: ...
    @property
    def checkpoint(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def compute_dtype(self) -> str: ...
    seconds: float
    outside: TierLoad
    device_tier: TierLoad
    ram: TierLoad
    disk: TierLoad
    ram_source: str
    disk_mode: str | None
    disk_mode_reason: str
    staging_bytes: int
    mapped_bytes: int
    kept_buffers: list[str]
    unexpected: list[str]
    def summary(
        self,
        ram_in_memory_threads: int | None = None,
        storage: str | None = None,
        loader: tuple[int, int, float, float] | None = None,
    ) -> str: ...

def read_tensors(
    path: str | PathLike[str], requests: list[tuple[int, Any]], threads: int = 2, direct: bool = False
) -> tuple[int, float]:
    """Reads byte ranges of a file straight into CPU tensors: `requests` is a list of
    (file offset, destination); each destination is filled completely. Returns (bytes, seconds).
    """

def read_block(
    requests: Sequence[tuple[str | PathLike[str], int, Any]],
    threads: int = 2,
    lane: ReadLane | None = None,
    position: int | None = None,
) -> tuple[int, float]:
    """Reads byte ranges of several files into CPU tensors in one call without the GIL: `requests`
    is a list of (path, file offset, destination). Each file's ranges are read in file order by
    `threads` readers; with a `lane`, every read waits in its queue for a place at the drive as
    the block at `position` of the lane's run order (`None`: needed now), and reads past the page
    cache when the lane is `direct` (straight into destinations that line up with the file
    modulo 4096 bytes, through a bounce buffer otherwise). Returns (bytes, seconds).
    """

@final
class ReadLane:
    """One model's lane of the read queue of the drive its checkpoint lies on (see the core's
    `io::Lane` and `io::drive_queue`): the queue has `DRIVE_IN_FLIGHT` places for every model of
    the process reading that drive; the lane ranks this model's reads by its run order of
    `blocks` blocks and by its priority ("run" before "ahead"). With `direct`, `read_block`'s
    reads through the lane go past the page cache.
    """
    def __new__(
        cls, files: Sequence[str | PathLike[str]], blocks: int, priority: str = "run", direct: bool = False
    ) -> ReadLane: ...
    @property
    def direct(self) -> bool: ...
    @property
    def depth(self) -> int: ...
    @property
    def blocks(self) -> int: ...
    @blocks.setter
    def blocks(self, blocks: int) -> None: ...
    @property
    def current(self) -> int: ...
    @property
    def priority(self) -> str: ...
    @priority.setter
    def priority(self, priority: str) -> None: ...
    @property
    def queue_id(self) -> int: ...
    @property
    def lane_id(self) -> int: ...
    def advance(self, position: int) -> None: ...
    def stats(self) -> tuple[int, int, float]: ...
    def queue_stats(self) -> tuple[int, int, float]: ...
    def record(self, on: bool) -> None: ...
    def served(self) -> list[tuple[int, int | None]]: ...
    def waiting(self) -> int: ...
    def hold_place(self) -> HeldPlace: ...

@final
class HeldPlace:
    """A place at the drive held by `ReadLane.hold_place` until `release()`."""
    def release(self) -> None: ...

def trim_heap() -> bool:
    """Gives memory the C allocator holds free back to the system (after a release)."""

def current_rss() -> int:
    """The process's resident memory in bytes."""

def private_memory() -> int:
    """The process's private resident memory in bytes (Linux: RssAnon; Windows: private bytes)."""

def available_ram() -> int:
    """The RAM the machine has available (MemAvailable), in bytes."""

def profile_report(
    blocks: list[tuple[str, str]],
    runs: list[tuple[int, float, float, float, float, int, str]],
    load: str | None = None,
    engine: EngineStats | None = None,
    memory: str | None = None,
    device_copies: list[tuple[float, int, float]] | None = None,
    link: float | None = None,
    stagings: list[Staging] | None = None,
    engine_blocks: list[int] | None = None,
    drive: DriveRate | None = None,
) -> tuple[str, str, str]:
    """Builds the profile of a run and returns (report text, Chrome trace JSON, log line).
    `load` is a LoadSummary, `engine` the engine's statistics and `memory` a list of memory
    points, each as JSON. `stagings` are the engine's (`Engine.stagings()`), drawn on the trace's
    worker lanes; `engine_blocks[i]` is the index in `blocks` of the engine's block `i` (the
    engine only numbers streamed blocks), the same index when not given.
    """

def clock() -> float:
    """Seconds on the clock the engine's workers time their stagings with; block runs timed with it
    line up with the stagings in the trace.
    """

@final
class RssSampler:
    """Samples the process's resident memory on a thread until `stop()`."""
    def __new__(cls, interval_ms: int = 1, private: bool = False) -> RssSampler: ...
    def peak(self) -> int: ...
    def stop(self) -> tuple[int, int, int]: ...

@final
class Lease:
    """A staged block, leased from the engine."""
    @property
    def block(self) -> int: ...
    @property
    def waited(self) -> float: ...
    @property
    def hit(self) -> bool: ...
    def block_bytes(self) -> TensorBytes: ...
    @property
    def in_place(self) -> bool: ...
    def forget_tensor(self, tensor: int) -> None: ...
    def view(self, tensor: int) -> TensorBytes: ...
    def expand_into(self, items: list[tuple[int, Any]], dtype: str, threads: int | None = None) -> None: ...
    def discard(self) -> None: ...
    def release(self) -> None: ...

@final
class StagedTensor:
    """One tensor of a staged block, and what the backends do with it before the block runs."""
    @property
    def name(self) -> str: ...
    @property
    def offset(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> list[int]: ...
    @property
    def own_scale(self) -> tuple[int, int] | None: ...
    @property
    def scale_index(self) -> int | None: ...
    @property
    def scale_layout(self) -> str | None: ...
    @property
    def expand_at(self) -> int | None: ...
    @property
    def is_scale(self) -> bool: ...

@final
class EngineStats:
    """The prefetch engine's counters."""
    @property
    def ram_bytes(self) -> int: ...
    @property
    def disk_bytes(self) -> int: ...
    @property
    def ram_cold_bytes(self) -> int: ...
    @property
    def ram_cold_blocks(self) -> int: ...
    @property
    def ram_cold_seconds(self) -> float: ...
    @property
    def read_seconds(self) -> float: ...
    @property
    def compute_waited_seconds(self) -> float: ...
    @property
    def acquires(self) -> int: ...
    @property
    def hits(self) -> int: ...
    @property
    def misses(self) -> int: ...
    @property
    def buffer_waits(self) -> int: ...
    @property
    def buffer_wait_seconds(self) -> float: ...
    @property
    def out_of_order(self) -> int: ...
    @property
    def failures(self) -> int: ...

@final
class Staging:
    """One block a worker read into a staging buffer, timed on `clock()`."""
    @property
    def block(self) -> int: ...
    @property
    def worker(self) -> int: ...
    @property
    def start(self) -> float: ...
    @property
    def end(self) -> float: ...
    @property
    def bytes(self) -> int: ...
    @property
    def source(self) -> Literal["disk", "ram_warm", "ram_cold"]: ...

@final
class StagingPool:
    """`count` page-aligned staging buffers of `size` bytes (rounded up to whole pages), allocated
    and written once; engines made with it (`Engine(..., pool=)`) stage into them in turn.
    """
    def __new__(cls, size: int, count: int) -> StagingPool: ...
    def buffers(self) -> list[tuple[int, int]]: ...
    @property
    def buffer_bytes(self) -> int: ...
    @property
    def count(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def holder(self) -> str | None: ...
    @property
    def users(self) -> int: ...

@final
class Engine:
    """The prefetch engine of one model."""
    def __new__(
        cls,
        blocks: list[tuple[str, str, list[tuple[str, int, int, int, str, list[int]]]]],
        files: list[str],
        config: EngineConfig,
        pool: StagingPool | None = None,
        holder: str | None = None,
    ) -> Engine: ...
    def park(self) -> bool: ...
    def set_order(self, order: list[int]) -> None: ...
    def order(self) -> list[int]: ...
    def recorded_order(self) -> list[int]: ...
    def clear_recorded_order(self) -> None: ...
    def acquire(self, block: int) -> Lease: ...
    def try_lease(self, block: int) -> Lease | None: ...
    def share_reads(self, lane: ReadLane, positions: list[int]) -> None: ...
    def advance(self, block: int) -> None: ...
    def set_last_pass(self, last: bool) -> None: ...
    def next_blocks(self, block: int) -> list[int]: ...
    def stage_ram_tier_ahead(self) -> bool: ...
    def wait_idle(self, timeout: float) -> bool: ...
    def release_pages(self, block: int, keep_cache: bool = False) -> int: ...
    def ram_image(self, block: int) -> TensorBytes | None: ...
    def ram_image_buffers(self) -> list[tuple[int, int]]: ...
    def load_ram_tier(self) -> tuple[int, float]: ...
    def staging_buffers(self) -> list[tuple[int, int]]: ...
    def layout(self, block: int) -> list[StagedTensor]: ...
    def staging_bytes(self) -> int: ...
    def in_place(self, block: int) -> bool: ...
    def disk_read_mode(self) -> str | None: ...
    def stats(self) -> EngineStats: ...
    def stagings(self) -> list[Staging]: ...
    def reset_stats(self) -> None: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...

# ---- order files (crates/trash-panda/src/order) ----

__all__ += [
    "ORDER_FORMAT",
    "ORDER_SUFFIX",
    "ORDER_VERSION",
    "OrderRead",
    "full_order",
    "order_file_path",
    "read_order_file",
    "order_to_write",
    "file_to_write",
    "write_order_file",
]

ORDER_FORMAT: str
ORDER_VERSION: int
ORDER_SUFFIX: str

@final
class OrderRead:
    """What reading an order file gave: the order, or why the file was not used."""
    @property
    def path(self) -> Path: ...
    @property
    def usable(self) -> bool: ...
    @property
    def blocks(self) -> list[str] | None: ...
    @property
    def indices(self) -> list[int] | None: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def detail(self) -> str | None: ...
    @property
    def block(self) -> str | None: ...
    @property
    def outside(self) -> dict[str, int] | None: ...
    def outside_for(self, modules: list[str]) -> dict[str, int]: ...
    def warning(self) -> str | None: ...

def order_file_path(checkpoint: str | PathLike[str], destination: str | PathLike[str] | None = None) -> Path:
    """The order file of `checkpoint` (a file, an index or a folder), next to it or in `destination`."""

def read_order_file(path: str | PathLike[str], blocks: list[str]) -> OrderRead:
    """Reads the order file at `path`, matched against the model's `blocks` in plan order."""

def write_order_file(
    path: str | PathLike[str], checkpoint: str | PathLike[str], blocks: list[str], outside: dict[str, int] | None = None
) -> None:
    """Writes `blocks`, in the order they ran, as the order file at `path` for `checkpoint`,
    atomically; `outside` (module name -> blocks started before its first use) goes with them.
    """

def order_to_write(read: OrderRead, recorded: list[str], blocks: list[str]) -> list[str] | None:
    """The order to write to the file after a run (every block that ran, in the order of their
    first run, merged into the known order when only some ran), or None to leave the file.
    """

def file_to_write(
    read: OrderRead, recorded: list[str], blocks: list[str], outside: dict[str, int]
) -> tuple[list[str], dict[str, int]] | None:
    """`order_to_write` with the outside modules the run recorded (name -> distinct blocks started
    before its first use): (blocks, outside) to write, or None to leave the file.
    """

def full_order(first: list[str], blocks: list[str]) -> list[int]:
    """The full run order as positions in `blocks`: the blocks `first` names, then the others in
    plan order.
    """

# pipeline: memory handed over between a pipeline's stages
__all__ += [
    "Allowance",
    "AllowanceStats",
    "Free",
    "Holds",
    "LoadReads",
    "Replan",
    "StageRecord",
    "load_reads",
    "pipeline_report",
    "replan",
]

@final
class Holds:
    """What a loaded stage holds that its release gives back, in bytes."""
    def __new__(cls, ram: int = 0, vram: int = 0) -> Holds: ...
    @staticmethod
    def of(stage: str, plan: Plan) -> Holds: ...
    @staticmethod
    def needed(stage: str, plan: Plan) -> Holds: ...
    def fits(self, free: Free) -> bool: ...
    def beyond(self, free: Free) -> Holds: ...
    @property
    def ram(self) -> int: ...
    @property
    def vram(self) -> int: ...
    def plus(self, other: Holds) -> Holds: ...
    def less(self, part: Holds) -> Holds: ...

@final
class Free:
    """Free memory in bytes: RAM the process can use, and free VRAM where a GPU computes."""
    def __new__(cls, ram: int, vram: int | None = None) -> Free: ...
    @staticmethod
    def probe(vram: int | None = None) -> Free: ...
    @property
    def ram(self) -> int: ...
    @property
    def vram(self) -> int | None: ...
    def after_release(self, released: Holds) -> Free: ...
    def with_shared_pool(self, pool: int) -> Free: ...
    def less(self, taken: Holds) -> Free: ...
    def within(self, ram: int | None, vram: int | None, held: Holds) -> Free: ...

@final
class Replan:
    """Why a stage is planned again at its start: the memory that missed the prediction."""
    @property
    def memory(self) -> str: ...
    @property
    def predicted(self) -> int: ...
    @property
    def actual(self) -> int: ...
    @property
    def margin(self) -> int: ...

@final
class LoadReads:
    """How a pipeline's loads read its stages' weights: through the page cache or past it."""
    @property
    def direct(self) -> bool: ...
    @property
    def reason(self) -> str: ...

def load_reads(files: int, ram: int, vram: int | None = None) -> LoadReads:
    """How a pipeline whose stages' files hold `files` bytes together reads them at its loads,
    allowed `ram` bytes of RAM (and `vram` of device memory on a GPU): past the page cache unless
    the files stay cached beside what the stages hold in RAM; `TRASH_PANDA_DISK_MODE` other than
    `auto` wins.
    """

def replan(predicted: Free, actual: Free) -> Replan | None:
    """Whether a stage planned for `predicted` must be planned again for `actual` (None: keep it)."""

@final
class AllowanceStats:
    """What an allowance has done."""
    @property
    def taken(self) -> int: ...
    @property
    def given(self) -> int: ...
    @property
    def waits(self) -> int: ...
    @property
    def wait_seconds(self) -> float: ...

@final
class Allowance:
    """The memory the next stage's early reads may fill while the stage before it runs: `take`
    waits (without the GIL) until the bytes are there; `give` adds what the running stage freed;
    `open` lifts the limit when the stage starts; `close` fails every wait.
    """
    def __new__(cls, stage: str, bytes: int) -> Allowance: ...
    def take(self, bytes: int) -> None: ...
    def try_take(self, bytes: int) -> bool: ...
    def give(self, bytes: int) -> None: ...
    def open(self) -> None: ...
    def close(self) -> None: ...
    @property
    def available(self) -> int | None: ...
    @property
    def is_open(self) -> bool: ...
    @property
    def waiting(self) -> int: ...
    @property
    def stage(self) -> str: ...
    def stats(self) -> AllowanceStats: ...

@final
class StageRecord:
    """One stage of one pipeline run, for the pipeline's report."""
    def __new__(
        cls,
        run: int,
        stage: str,
        arrival: str,
        departure: str,
        *,
        predicted: Free | None = None,
        actual: Free | None = None,
        replan: Replan | None = None,
        read_before_start: int = 0,
        holds: int = 0,
        file_bytes: int = 0,
        cached_at_load: int = 0,
        waited: float = 0.0,
        seconds: float = 0.0,
        peak: int = 0,
        read_again: int = 0,
        given_back: int = 0,
    ) -> StageRecord: ...
    @property
    def run(self) -> int: ...
    @property
    def stage(self) -> str: ...
    @property
    def arrival(self) -> str: ...
    @property
    def departure(self) -> str: ...
    @property
    def read_before_start(self) -> int: ...
    @property
    def holds(self) -> int: ...
    @property
    def file_bytes(self) -> int: ...
    @property
    def cached_at_load(self) -> int: ...
    @property
    def waited(self) -> float: ...
    @property
    def seconds(self) -> float: ...
    @property
    def peak(self) -> int: ...
    @property
    def read_again(self) -> int: ...
    @property
    def given_back(self) -> int: ...
    @property
    def predicted(self) -> Free | None: ...
    @property
    def actual(self) -> Free | None: ...

def pipeline_report(records: list[StageRecord]) -> str:
    """The report of the stages of a pipeline's runs, in the order they ran."""
