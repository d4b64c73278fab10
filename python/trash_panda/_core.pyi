"""Type stubs of the compiled core (checked against the module by mypy.stubtest in `make test`)."""

from collections.abc import Container, Mapping, Sequence
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
    "OverlayBytes",
    "default_overlay_dir",
    "overlay_limit",
    "patched_image_bytes",
    "Staging",
    "StreamBlock",
    "StreamTensor",
    "StagingSource",
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
    "is_block_dtype",
    "dtype_nbytes",
    "dtype_block_elems",
    "is_scale_name",
    "weight_of_scale",
    "needs_expansion",
    "check_block_prefixes",
    "asked_staging_buffers",
    "staging_buffers",
    "DEFAULT_HEADROOM_VRAM",
    "DEFAULT_LOOKAHEAD",
    "TENSOR_ALIGN",
    "DIRECT_ALIGN",
    "LOAD_GROUP_BYTES",
    "LOADER_RING_SLACK",
    "LOADER_RING_BYTES",
    "GGML_DEVICE_PASS_WEIGHTS",
    "GGML_DEVICE_SCRATCH_BYTES",
    "LoadReport",
    "TierLoad",
    "make_plan",
    "paired_scale",
    "parse_size",
    "profile_report",
    "quantize_fp8",
    "quantize_q8_0",
    "quantize_int8",
    "read_tensors",
    "read_block",
    "ReadLane",
    "join_lanes",
    "AdapterMap",
    "LayerAdapter",
    "map_adapter",
    "WayChoice",
    "choose_adapter_way",
    "PagePool",
    "Priority",
    "HeldPlace",
    "setting",
    "settings",
    "storage_conversion",
    "Tier",
    "trim_heap",
]

__version__: str

@final
class TensorInfo:
    """One tensor's entry in the index."""
    @property
    def name(self) -> str:
        """The tensor's name in the checkpoint, e.g. "model.layers.3.mlp.up_proj.weight"."""
    @property
    def dtype(self) -> str:
        """The dtype as written in the header ("BF16", "F8_E4M3", ...)."""
    @property
    def shape(self) -> list[int]:
        """Elements along each dimension, outermost first; empty for a scalar."""
    @property
    def file(self) -> str:
        """The path of the checkpoint file that holds it."""
    @property
    def file_index(self) -> int:
        """Index of `file` in the checkpoint's files."""
    @property
    def start(self) -> int:
        """Offset of its first byte in `file`, counted from the file's start (header included)."""
    @property
    def end(self) -> int:
        """Offset one past its last byte in `file`."""
    @property
    def rows(self) -> list[int] | None:
        """The order the model takes its rows in, when not the file's: row `r` of the weight is row
        `rows[r]` of the stored tensor (set by `reordered`).
        """
    @property
    def nbytes(self) -> int:
        """Bytes of its data in the file: `end - start`."""
    @property
    def source(self) -> str | None:
        """The checkpoint's name of the tensor this entry is a part of (set by `sliced`); None when
        the entry is a whole tensor of the checkpoint.
        """
    def sliced(self, first: int, count: int, name: str) -> TensorInfo:
        """Rows `first..first + count` of the tensor (outermost dimension), as an entry of their
        own named `name`: their bytes are one run of the file's, whatever the dtype (a GGML
        type's blocks lie along the rows). How one tensor of a file holds several of a model's
        (a fused projection split in three).
        """
    def reordered(self, rows: list[int]) -> TensorInfo:
        """The same tensor taken by the model with its rows in another order: row `r` of the weight
        is row `rows[r]` of the stored tensor, which has at least two dimensions and as many rows
        as `rows` gives.
        """

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
    @property
    def read_only(self) -> bool:
        """True when torch must only read these bytes (its capsule carries DLPack's read-only flag):
        memory the core reads too, such as the in-memory RAM tier.
        """

@final
class Checkpoint:
    """An opened checkpoint."""
    def __new__(cls, path: str | PathLike[str]) -> Checkpoint: ...
    @property
    def files(self) -> list[str]:
        """The files of the checkpoint (one, or the shards)."""
    def __len__(self) -> int: ...
    def __contains__(self, name: str, /) -> bool: ...
    def gguf_metadata(self) -> dict[str, str | int | float | bool] | None:
        """The metadata of a GGUF file as a dict of its scalar values (strings, numbers, bools;
        arrays such as the vocabulary are left out); None for a safetensors checkpoint.
        """
    def tensors(self) -> list[TensorInfo]:
        """Every tensor, by file and then by offset."""
    def info_of(self, name: str) -> TensorInfo:
        """The entry of one tensor."""
    def view(self, name: str, lane: ReadLane | None = None) -> TensorBytes:
        """The tensor's bytes as a zero-copy view of a private map of its file. With a `lane`, its
        pages are read in now, holding a place in the lane's drive queue as a read needed now
        (so the drive serves it in turn with the models' reads); without, they are read when
        first touched.
        """
    def check_holds(self, name: str) -> None:
        """Raises CheckpointError if the file holding tensor `name` no longer reaches its end
        (truncated or rewritten since it was opened): reading a view of it would crash.
        """
    def changed(self) -> str | None:
        """None while every file is the one whose header was read; else which file changed and how
        (rewritten, replaced, resized or gone): blocks read again by the old header's offsets
        would not be the tensors it names.
        """
    def close(self) -> None:
        """Drops the maps made by `view`; views already given to torch keep theirs alive."""

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
    order: list[int] | None = None,
) -> None:
    """Expands (fp8 or int8 times a scale, GGML blocks, or a plain cast) `src` into `dst`; with
    `order`, row `r` of `dst` is row `order[r]` of `src`.
    """

def cast(src: Any, src_dtype: str, dst: Any, dst_dtype: str, threads: int | None = None) -> None:
    """Casts between f32, f16 and bf16 with round-to-nearest-even."""

def quantize_fp8(
    src: Any,
    src_dtype: str,
    dst: Any,
    scales: Any,
    rows: int,
    cols: int,
    layout: str,
    block: int = 128,
    threads: int | None = None,
) -> None:
    """Quantizes `src` to fp8 e4m3fn into `dst`, writing the float32 scales into `scales`: one
    per tensor, per row or per `block` x `block` tile (`layout` "tensor", "row" or "block").
    """

def quantize_q8_0(src: Any, src_dtype: str, dst: Any, threads: int | None = None) -> None:
    """Quantizes `src` (a multiple of 32 floats) to GGML Q8_0 blocks in `dst` (34 bytes a block)."""

def quantize_int8(
    src: Any,
    src_dtype: str,
    dst: Any,
    scales: Any,
    rows: int,
    cols: int,
    threads: int | None = None,
) -> None:
    """Quantizes `src` (`rows` x `cols` floats) to int8 codes in `dst`, one float32 scale per row in
    `scales`.
    """

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
    def bytes(self) -> int:
        """Bytes read."""
    @property
    def seconds(self) -> float:
        """Wall-clock seconds the reads took."""
    @property
    def in_flight(self) -> int:
        """Requests kept in flight."""
    @property
    def gb_per_s(self) -> float:
        """GB/s (10^9 bytes)."""

def cli_main(argv: list[str]) -> int:
    """Runs the command line (argv[0] included) and returns its exit code."""

@final
class Tier:
    """Where a block's weights live between uses: on the compute device, in host RAM, or on disk."""

    DEVICE: Tier
    """Where a block's weights live between uses: on the compute device, in host RAM, or on disk."""
    RAM: Tier
    """Where a block's weights live between uses: on the compute device, in host RAM, or on disk."""
    DISK: Tier
    """Where a block's weights live between uses: on the compute device, in host RAM, or on disk."""
    GPU: Tier
    """Where a block's weights live between uses: on the compute device, in host RAM, or on disk."""
    def __new__(cls, name: str) -> Tier: ...
    @property
    def value(self) -> str:
        """The tier's own name, lower-case, as plans, logs and options write it."""
    def __int__(self) -> int: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class Plan:
    """A plan: which block lives on the device, in RAM and on disk."""
    @staticmethod
    def manual(resident: list[str], streamed: list[str], streamed_tier: Tier | str = ...) -> Plan:
        """A plan written by hand; matched against the model when it is loaded."""
    @staticmethod
    def load(path: str | PathLike[str]) -> Plan:
        """A plan from a JSON file written by `save` or `trash-panda plan --json`."""
    def save(self, path: str | PathLike[str]) -> None:
        """Writes `to_json` to `path`."""
    def tier_of(self, block: str) -> Tier | None:
        """The tier of the block named `block` (its prefix), or None if the plan has no such block."""
    def blocks_in(self, tier: Tier | str) -> list[str]:
        """The names of the blocks in `tier`, in model order."""
    def table(self) -> str:
        """The table `str()` prints without its warnings (a log writes those apart)."""
    def engine_config(self) -> EngineConfig:
        """Every figure the runtime holds, from this (resolved) plan."""
    def holds(self, stage: str = "model") -> Holds:
        """What a model loaded by this (resolved) plan holds under the current settings, and its
        release gives back: the figures a pipeline moves between stages (`stage` names it in
        errors).
        """
    def needs(self, stage: str = "model") -> Holds:
        """What a model loaded by this plan needs free at its start: what it holds, and the free
        memory the plan leaves alone (free-RAM floor, activation reserve, CUDA context).
        """
    def at_once(self, stage: str = "model") -> Holds:
        """What a model loaded by this plan takes as its load is set up, before any read a stage
        read ahead puts behind its allowance: its own staging buffers and, on a GPU, its device
        slots and expansion buffers.
        """
    def load_reads(self, files: int, read_again: bool = False) -> LoadReads:
        """How a model loaded by this (resolved) plan on its own reads its files of `files` bytes:
        through the page cache only when a later load reads them again (`read_again`: `stage()`
        releases the model at its end) and they stay cached beside what the plan holds in RAM
        (`TRASH_PANDA_DISK_MODE` other than `auto` wins).
        """
    @staticmethod
    def from_json(text: str) -> Plan:
        """Reads a plan from the JSON `to_json` writes; a PlanError for another format or version."""
    def to_json(self) -> str:
        """The plan as JSON, format name and version first: save it to load the model the same way
        later (`from_json` reads it back).
        """
    def assign(self, tier: Tier | str, indices: list[int] | None = None, prefixes: list[str] | None = None) -> Plan:
        """Moves blocks, named by position or by prefix, to `tier`; returns the plan itself. An
        index out of range, a prefix that matches no block, or a block named twice is a
        PlanError and leaves the plan as it was.
        """
    @property
    def blocks(self) -> list[BlockPlan]:
        """Every block in plan order."""
    @property
    def budgets(self) -> Budgets | None:
        """The budgets (None for a manual plan not matched against a model yet)."""
    @property
    def warnings(self) -> list[str]:
        """What the planner wants the user to know about this plan (it still made it), one message
        each.
        """
    @property
    def resolved(self) -> bool:
        """False for a manual plan not matched against a model yet (`resolve` does it): it has no
        sizes or budgets.
        """
    @property
    def compute_dtype(self) -> str:
        """The dtype the blocks compute in ("BF16", "F16" or "F32")."""
    @property
    def storage_dtype(self) -> str | None:
        """The storage dtype ("BF16", "F8_E4M3") or None (weights as stored)."""
    @property
    def lookahead(self) -> int:
        """Streamed blocks staged ahead of the one that runs."""
    def shared_staging(self) -> tuple[int, int]:
        """(buffers, bytes of each) of the shared staging pool the blocks need in whichever tiers
        they are put: a pipeline sizes its pool by the largest of its stages'.
        """
    def resolve(
        self,
        tensors: list[tuple[str, TensorInfo]],
        prefixes: list[str] | None,
        free_vram: int | None,
        has_gpu: bool,
        ram: int | None = None,
        **options: Any,
    ) -> Plan:
        """This plan applied to a model's tensors (a manual plan gets its sizes and budgets here)."""

@final
class BlockPlan:
    """One block of a plan."""
    @property
    def name(self) -> str:
        """The block's name prefix, e.g. "model.layers.12."."""
    @property
    def tier(self) -> Tier:
        """Where the block lives between uses."""
    @property
    def stored_bytes(self) -> int:
        """Bytes in its tier's form: the checkpoint's on disk, the storage dtype's in RAM and on the
        device.
        """
    @property
    def expanded_bytes(self) -> int:
        """Bytes once expanded to the compute dtype, scale tensors dropped: what it takes to run."""
    @property
    def staged_bytes(self) -> int:
        """Staging-buffer bytes the block needs in its tier (0 when resident)."""
    @property
    def expansion_bytes(self) -> int:
        """Expansion-buffer bytes the block needs in its tier."""
    @property
    def tensors(self) -> int:
        """How many tensors the block holds."""
    @property
    def merged(self) -> bool:
        """An adapter is merged into it (the plan's `merged_modules`): on the CPU it keeps the
        merge in an image where it lives.
        """
    @property
    def ggml(self) -> bool:
        """It holds GGML blocks (a GGUF file's, or `storage_dtype="q8_0"`'s): a GPU expands them with
        temporaries the plan counts (`Budgets.device_scratch`).
        """
    @property
    def image_bytes(self) -> int:
        """Bytes of its merged image in its tier (memory or an overlay file; 0 when resident)."""

@final
class Budgets:
    """The budgets of a plan, in bytes (see docs/plan-format.md)."""
    @property
    def gpu(self) -> bool:
        """True when the plan sizes the device tier as a GPU's (a free VRAM was given); False when the
        CPU computes: RAM is then the device's memory, and the device and RAM tiers share it.
        """
    @property
    def device_limit(self) -> int:
        """The device memory the plan may use: the free VRAM with a GPU; on the CPU, the RAM left
        after `min_free_ram`, the host staging and the mapped window. Capped by `max_vram` if given.
        """
    @property
    def reserve(self) -> int:
        """Memory kept for activations: `activation_vram` if given, else `headroom_vram` with a GPU
        and 0 on the CPU.
        """
    @property
    def reserve_measured(self) -> bool:
        """True when `reserve` is the measured `activation_vram` given to the planner, False when it
        is the `headroom_vram` guess.
        """
    @property
    def cuda_floor(self) -> int:
        """`CUDA_CONTEXT_FLOOR` when a GPU computes, else 0."""
    @property
    def staging_buffers(self) -> int:
        """Host staging buffers (pinned on CUDA) when a block streams, else 0."""
    @property
    def staging_buffer_bytes(self) -> int:
        """Bytes of each staging buffer (and device slot): the largest streamed block as staged."""
    @property
    def shared_staging(self) -> bool:
        """True when the staging buffers counted are a pipeline's shared pool (planned with
        `staging_pool`): the pipeline holds them, counted once for all its stages.
        """
    @property
    def host_staging(self) -> int:
        """Bytes of the host staging pool: `staging_buffers` x `staging_buffer_bytes`."""
    @property
    def device_slots(self) -> int:
        """Device slots a staged block is copied into: one per staging buffer on a GPU, 0 on the CPU."""
    @property
    def device_slot_bytes(self) -> int:
        """Device memory of the device slots: `device_slots` x `staging_buffer_bytes`."""
    @property
    def expansion(self) -> int:
        """The expansion buffer: the largest expansion to the compute dtype a hooked block needs."""
    @property
    def mapped_window(self) -> int:
        """The checkpoint pages a disk-tier block used in place maps while it runs (the CPU on
        Linux), 0 when none is.
        """
    @property
    def device_scratch(self) -> int:
        """The device temporaries of GGML expansions on a GPU (when a hooked block holds GGML
        blocks), else 0.
        """
    @property
    def loader_ring(self) -> int:
        """The pinned host memory a loader reads resident weights into on a GPU before its own
        stream copies them to the device; 0 on the CPU.
        """
    @property
    def outside(self) -> int:
        """The weights outside the blocks (embeddings, final norm, heads) in the compute dtype: on the
        device, or in RAM without a GPU.
        """
    @property
    def adapters(self) -> int:
        """The adapters (LoRA matrices and the like) the model holds beside the outside weights,
        counted with them (the `adapter_bytes` the plan was given).
        """
    @property
    def merge_work(self) -> int:
        """What making a merge takes while it is made (a merged layer's weight copied and its
        ΔW: twice the largest merged weight), counted with the outside weights.
        """
    @property
    def merged_memory(self) -> int:
        """Private memory of the merged blocks' images (staged RAM-tier blocks with an adapter
        merged in, on the CPU).
        """
    @property
    def merged_files(self) -> int:
        """Overlay files of the merged blocks' images (disk-tier blocks, and RAM-tier blocks used in
        place).
        """
    @property
    def merged_beyond(self) -> int:
        """Of `ram_used`, what the merged blocks' images take beyond the blocks' own bytes."""
    @property
    def device_budget(self) -> int:
        """What resident (device-tier) blocks may take: `device_limit` less `cuda_floor`, `reserve`,
        `device_slot_bytes`, `expansion` and `outside` (0 rather than below).
        """
    @property
    def device_used(self) -> int:
        """What the device-tier blocks take, in their stored form."""
    @property
    def usable_ram(self) -> int:
        """RAM this process could use when the plan was made (MemAvailable within a cgroup's limit
        and, on Windows, the commit headroom).
        """
    @property
    def min_free_ram(self) -> int:
        """RAM the plan leaves to the rest of the machine: the `min_free_ram` option resolved."""
    @property
    def ram_budget(self) -> int:
        """What RAM-tier blocks may take: `usable_ram` less `min_free_ram`, the host staging and the
        mapped window; on the CPU, less also the device tier, `reserve`, `expansion` and `outside`.
        """
    @property
    def ram_used(self) -> int:
        """What the RAM-tier blocks take, in their stored form."""
    @property
    def disk_bytes(self) -> int:
        """What the disk-tier blocks take in the checkpoint, read from it every pass."""
    @property
    def held_on_device(self) -> int:
        """Everything the runtime holds beside the weights on the device: device slots and the
        expansion buffer (on the CPU, the host staging pool, the mapped window and the expansion
        buffer).
        """

@final
class EngineConfig:
    """The runtime figures of a plan under the current TRASH_PANDA_* settings."""
    def __new__(cls, plan: Plan) -> EngineConfig: ...
    @property
    def gpu(self) -> bool:
        """Whether the plan is a GPU's (device slots, 512-byte alignment); False when the CPU
        computes.
        """
    @property
    def compute_dtype(self) -> str:
        """ "BF16", "F16" or "F32"."""
    @property
    def storage_dtype(self) -> str | None:
        """The dtype weights are converted to on load ("BF16" or "F8_E4M3"); None: kept as stored."""
    @property
    def lookahead(self) -> int:
        """Streamed blocks staged ahead of the one that runs, at the start."""
    @property
    def align(self) -> int:
        """Offset alignment of staged tensors and of tensors in the expansion buffer."""
    @property
    def staging_buffers(self) -> int:
        """Host staging buffers (pinned on CUDA) the plan counted; 0 when no block streams."""
    @property
    def staging_buffer_bytes(self) -> int:
        """Bytes of each staging buffer: the largest streamed block as staged in its tier, rounded
        up to whole pages.
        """
    @property
    def device_slots(self) -> int:
        """Device slots a staged block is copied into: one per staging buffer on a GPU, 0 on the
        CPU, which computes from the staging buffers.
        """
    @property
    def expansion_bytes(self) -> int:
        """Bytes of the expansion buffer: the largest expansion to the compute dtype any hooked
        block needs in its tier.
        """
    @property
    def mapped_window_bytes(self) -> int:
        """The checkpoint pages a disk-tier block used in place maps while it runs."""
    @property
    def loader_ring_bytes(self) -> int:
        """The pinned ring a loader reads resident weights into on a GPU (both halves); 0 on the CPU."""
    @property
    def disk_mode(self) -> str:
        """ "direct" or "buffered"."""
    @property
    def disk_mode_reason(self) -> str:
        """Why the disk tier is read that way, in words for the load report; empty when no block is
        on disk.
        """
    @property
    def workers(self) -> int:
        """Threads that fill staging buffers (`TRASH_PANDA_WORKERS`, at least 1)."""
    @property
    def ram_in_memory_threads(self) -> int | None:
        """Threads reading the RAM tier into private memory; None when it is mapped."""
    @property
    def pin_ram_tier(self) -> bool:
        """Whether a RAM tier in private memory is pinned and copied to the GPU directly."""
    def maps_lookup_table(self, info: TensorInfo) -> bool:
        """Whether `info`, a tensor the model only reads by rows (an embedding table), is left in a
        private map of its file rather than read into memory.
        """
    def expansion(
        self, dtypes: list[str], elements: list[int], scaled: list[bool], reordered: list[bool] | None = None
    ) -> list[int | None]:
        """Where each tensor of a resident block goes in the expansion buffer (None: used as it is
        held), by the rule the plan counts with: tensors held in `dtypes` (header names), of
        `elements` elements, `scaled` when a scale applies, `reordered` (all false when not
        given) when the model takes their rows in another order than the stored one.
        """

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
    """What `storage_dtype` does to a tensor on load: "keep", "bf16", "fp8", "int8" or "q8_0" (the
    core's one rule).
    """

def infer_compute_dtype(tensors: Sequence[TensorInfo]) -> Literal["BF16", "F16", "F32"]:
    """The dtype a model computes in when nothing says (the core's one rule): "BF16", "F16" or
    "F32", from the checkpoint's tensors by element count (see `rules::infer_compute_dtype`).
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

def is_block_dtype(name: str) -> bool:
    """Whether a dtype is one of GGML's block-quantized types ("Q4_K", "q8_0", ...)."""

def dtype_block_elems(name: str) -> int:
    """Elements per storage unit of a dtype: 32 or 256 for a GGML block type, 1 for the others."""

def dtype_nbytes(name: str, elements: int) -> int:
    """Bytes that `elements` elements of a dtype take, a block type's whole blocks included; a
    DtypeError when they are not whole blocks.
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

def patched_image_bytes(block_len: int, in_memory: bool) -> int:
    """Bytes a patched block's image takes (its staged length `block_len`): rounded up to whole
    pages in memory (`in_memory`), as it is in an overlay file.
    """

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
# Where every tensor handed to torch on the CPU starts, in bytes.
TENSOR_ALIGN: int
# The alignment of memory and file offsets a direct (O_DIRECT) read needs, in bytes.
DIRECT_ALIGN: int
# What a loader reads at once of a model's resident weights before it hands them on, in bytes.
LOAD_GROUP_BYTES: int
# Room a loader's pinned ring keeps in each half beside a group (page shifts of direct reads).
LOADER_RING_SLACK: int
# A loader's pinned ring on a GPU as the plan counts it: two halves and a page to align it on.
LOADER_RING_BYTES: int
GGML_DEVICE_PASS_WEIGHTS: int
GGML_DEVICE_SCRATCH_BYTES: int

@final
class TierLoad:
    """What one tier (or the weights outside the blocks) took at load time. Immutable: a report's
    tier is replaced as a whole.
    """
    def __new__(cls, blocks: int = 0, tensors: int = 0, bytes: int = 0, seconds: float = 0.0) -> TierLoad: ...
    @property
    def blocks(self) -> int:
        """Blocks in the tier (0 for the weights outside the blocks)."""
    @property
    def tensors(self) -> int:
        """Tensors loaded."""
    @property
    def bytes(self) -> int:
        """Bytes of those tensors, as the tier holds them."""
    @property
    def seconds(self) -> float:
        """Wall-clock seconds the tier's part of the load took."""
    def __eq__(self, other: object, /) -> bool: ...

@final
class LoadReport:
    """Bytes and seconds of a load, per tier. ``str(report)`` is a short table."""
    def __new__(cls, checkpoint: str, device: str, compute_dtype: str) -> LoadReport: ...
    @property
    def checkpoint(self) -> str:
        """The checkpoint's file, or the folder of its shards."""
    @property
    def device(self) -> str:
        """The compute device as torch writes it ("cuda:0", "cpu")."""
    @property
    def compute_dtype(self) -> str:
        """torch's name of the compute dtype ("bfloat16")."""
    seconds: float
    """Wall-clock seconds of the whole load."""
    outside: TierLoad
    """What the weights outside the blocks (embeddings, final norm, heads) took."""
    device_tier: TierLoad
    """What the device tier took."""
    ram: TierLoad
    """What the RAM tier took."""
    disk: TierLoad
    """What the disk tier took."""
    ram_source: str
    """How the RAM tier is held: "mapped", "in memory" or "in memory as <storage dtype>"."""
    disk_mode: str | None
    """How the disk tier is read ("direct" or "buffered"); None when no block is on disk."""
    disk_mode_reason: str
    """Why the disk tier is read that way, in words; empty when there is nothing to say."""
    reads: str
    """How the load itself read (past the page cache or through it) and why, in words; empty
    when it was not decided for this model alone (a pipeline's stage: its report says).
    """
    staging_bytes: int
    """Bytes of the engine's staging pool; 0 when no block streams."""
    mapped_bytes: int
    """Bytes of embedding tables left in the checkpoint's map (counted within outside or device)."""
    kept_buffers: list[str]
    """The names of the model's buffers not in the checkpoint, kept as its construction made them."""
    unexpected: list[str]
    """Checkpoint tensors the model has no place for."""
    def summary(
        self,
        ram_in_memory_threads: int | None = None,
        storage: str | None = None,
        loader: tuple[int, int, float, float] | None = None,
    ) -> str:
        """The profile's figures of this load (a LoadSummary as JSON, what `profile_report` takes):
        `ram_in_memory_threads` readers read the RAM tier into memory, as `storage` (a dtype
        name) if given (None: it is mapped); `loader` is stage(overlap=True)'s loader thread as
        (blocks, bytes, seconds, waited seconds).
        """

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
class Priority:
    """How a lane's reads rank against other lanes': the core's `io::Priority` as a Python enum
    class. `RUN` reads go before any `AHEAD` read.
    """

    RUN: Priority
    """How a lane's reads rank against other lanes': the core's `io::Priority` as a Python enum
    class. `RUN` reads go before any `AHEAD` read.
    """
    AHEAD: Priority
    """How a lane's reads rank against other lanes': the core's `io::Priority` as a Python enum
    class. `RUN` reads go before any `AHEAD` read.
    """
    def __new__(cls, name: str) -> Priority: ...
    @property
    def value(self) -> str:
        """The priority's name, lower-case ("run" or "ahead")."""
    def __int__(self) -> int: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class LayerAdapter:
    """One layer's patch, checked: its layer, kind (`lora`, `lokr`, `loha`), rank, scale and the
    file's tensors that make it, by part (`down`, `up`, `alpha`, `lokr_w1`, ...).
    """
    @property
    def layer(self) -> str:
        """The layer's module name in the model."""
    @property
    def kind(self) -> str:
        """`lora`, `lokr` or `loha`."""
    @property
    def rank(self) -> int:
        """Its rank (0 for a LoKr whose factors are both whole)."""
    @property
    def scale(self) -> float:
        """What its update is multiplied by before the user's weight."""
    @property
    def alpha(self) -> float:
        """The alpha `scale` divides by the rank (the rank itself where the file gives none; 0
        with no rank): what PEFT takes with the rank.
        """
    @property
    def parts(self) -> dict[str, str]:
        """The file's tensor for each part."""

@final
class AdapterMap:
    """An adapter file mapped onto a model: the layers it patches, in the model's order, and the
    tensors it holds for other components of a pipeline (left alone).
    """
    @property
    def layers(self) -> list[LayerAdapter]:
        """The layers it patches."""
    @property
    def skipped(self) -> list[str]:
        """Tensors for other components."""

def map_adapter(
    tensors: Sequence[tuple[str, Sequence[int]]],
    alphas: Mapping[str, float],
    layers: Sequence[tuple[str, Sequence[int]]],
    *,
    component: str | None = None,
    lora_alpha: float | None = None,
    use_rslora: bool = False,
) -> AdapterMap:
    """Maps an adapter file's `tensors` (name, shape) onto a model's `layers` (module name, weight
    shape) by the core's rules; `alphas` holds the value of each alpha tensor, by name.
    `component`: the pipeline component the model is (other components' tensors are skipped);
    `lora_alpha` and `use_rslora`: PEFT's adapter_config.json. A file that does not fit raises
    CheckpointError naming the tensor (and, for a key that matches no layer, the nearest ones).
    """

@final
class WayChoice:
    """The way a streamed layer runs its adapter (`merged_kept`, `merged_each_run` or `unmerged`),
    why, and the per-run costs the core compared (multiply-adds).
    """
    @property
    def way(self) -> str:
        """`merged_kept`, `merged_each_run` or `unmerged`."""
    @property
    def why(self) -> str:
        """Why, in words for a report."""
    @property
    def merge_cost(self) -> int:
        """What merging costs on a run (once, when kept)."""
    @property
    def unmerged_cost(self) -> int:
        """What running the adapter unmerged costs on a run."""

def choose_adapter_way(
    kind: str,
    rank: int,
    in_features: int,
    out_features: int,
    tokens: int,
    *,
    calls: int = 1,
    can_keep: bool = False,
    runs_left: int | None = None,
) -> WayChoice:
    """Chooses how a streamed layer runs its adapter (the core's cost model): kept merged where
    `can_keep` and more than one run is left (`runs_left` None: not known), else the cheaper per
    run of merging on each run and running it unmerged, for `tokens` a call and `calls` a run.
    """

@final
class PagePool:
    """Private memory faulted once and handed on (the core's `io::PagePool`): regions given back
    (their tensors freed) are kept and handed out again by `take`, whatever their sizes. Kept
    pages are the process's memory until `trim()` or `close()`.
    """
    def __new__(cls) -> PagePool: ...
    @staticmethod
    def keeps_pages() -> bool:
        """Whether pages given back are kept on this platform (not on Windows, where a pool hands
        out new memory only).
        """
    def take(self, nbytes: int, shift: int = 0) -> TensorBytes:
        """`nbytes` bytes starting `shift` bytes into a new region of whole pages (`shift` places
        them in their page as a direct read needs), as `TensorBytes` for `torch.from_dlpack`;
        kept pages where the pool has them. The bytes are whatever the pages held: for a read
        that fills them.
        """
    def want(self, nbytes: int) -> int:
        """Keeps at most `nbytes` of pages from now on (what the reads still to come will take;
        each region handed out counts against it), giving back at once what is kept beyond;
        returns the bytes given back.
        """
    @property
    def idle_bytes(self) -> int:
        """Bytes of pages kept, not handed out."""
    @property
    def reused(self) -> int:
        """Bytes handed out in pages that had been given back."""
    @property
    def fresh(self) -> int:
        """Bytes handed out in new pages."""
    def trim(self) -> int:
        """Gives every kept page back to the system; returns their bytes."""
    def close(self) -> int:
        """Trims, and keeps nothing from now on; returns the bytes given back."""

@final
class ReadLane:
    """One model's lane of the read queue of the drive its checkpoint lies on (see the core's
    `io::Lane` and `io::drive_queue`): the queue has `DRIVE_IN_FLIGHT` places for every model of
    the process reading that drive; the lane ranks this model's reads by its run order of
    `blocks` blocks and by its `Priority` (`RUN` before `AHEAD`). With `direct`, `read_block`'s
    reads through the lane go past the page cache. `pages`: the pool the model's tensors are
    read into (a pipeline's), or None for new memory of their own.
    """
    def __new__(
        cls,
        files: Sequence[str | PathLike[str]],
        blocks: int,
        priority: Priority = ...,
        direct: bool = False,
        pages: PagePool | None = None,
    ) -> ReadLane: ...
    @property
    def direct(self) -> bool:
        """Whether `read_block` reads through this lane past the page cache."""
    @property
    def pages(self) -> PagePool | None:
        """The pool the model's tensors are read into, or None."""
    @property
    def depth(self) -> int:
        """Reads at the drive at once (the queue's, shared with every lane)."""
    @property
    def blocks(self) -> int:
        """Blocks in the lane's run order."""
    @blocks.setter
    def blocks(self, blocks: int) -> None: ...
    @property
    def current(self) -> int:
        """The position of the block being run."""
    @property
    def priority(self) -> Priority:
        """How the lane's reads rank against other lanes' (`Priority.RUN` before `Priority.AHEAD`)."""
    @priority.setter
    def priority(self, priority: Priority) -> None: ...
    @property
    def queue_id(self) -> int:
        """An identity of the drive's queue: equal for two lanes on the same queue."""
    @property
    def lane_id(self) -> int:
        """The lane's id in its queue (a dropped lane's id is reused)."""
    def advance(self, position: int) -> None:
        """The block at `position` of the run order runs now: waiting reads rank from it."""
    @property
    def joint_places(self) -> list[int] | None:
        """The place of each position of its order in the run order it shares with other lanes
        (see `join_lanes`); None when it shares none.
        """
    def leave_joint(self) -> None:
        """Leaves the run order it shared: its reads rank in its own order again."""
    def stats(self) -> tuple[int, int, float]:
        """This lane's (grants, grants that waited, seconds waited in all)."""
    def queue_stats(self) -> tuple[int, int, float]:
        """The same for the whole queue: every lane of the drive, including lanes since dropped."""
    def record(self, on: bool) -> None:
        """Starts (or stops) recording the order the queue serves reads in (tests)."""
    def served(self) -> list[tuple[int, int | None]]:
        """The reads the queue served since `record(True)`, every lane's: (lane id, position or
        None for a read needed now).
        """
    def waiting(self) -> int:
        """Reads waiting for a place in the queue now, all lanes together."""
    def hold_place(self) -> HeldPlace:
        """Takes a place at the drive as a read needed now and holds it until `release_place`, as a
        slow read would (tests observe the order served behind it).
        """

def join_lanes(lanes: list[tuple[ReadLane, list[int]]], length: int) -> bool:
    """Makes `lanes` of one drive's queue, each with the place of each position of its run order in
    one shared order of `length` blocks, rank their reads in that order (models that run
    together, their blocks alternating). False, changing nothing, when the lanes are not all of
    one queue or a place is past `length`.
    """

@final
class HeldPlace:
    """A place at the drive held by `ReadLane.hold_place` until `release()`."""
    def release(self) -> None:
        """Frees the place (once; later calls do nothing)."""

# ---- system probes (crates/trash-panda/src/sys) ----

def trim_heap() -> bool:
    """Gives memory the C allocator holds free back to the system (after a release)."""

def current_rss() -> int:
    """The process's resident memory in bytes."""

def private_memory() -> int:
    """The process's private resident memory in bytes (Linux: RssAnon; Windows: private bytes)."""

def available_ram() -> int:
    """The RAM the machine has available (MemAvailable), in bytes."""

@final
class RssSampler:
    """Samples the process's resident memory on a thread until `stop()`."""
    def __new__(cls, interval_ms: int = 1, private: bool = False) -> RssSampler: ...
    def peak(self) -> int:
        """The peak so far."""
    def stop(self) -> tuple[int, int, int]:
        """Stops sampling: (start, peak, end) in bytes."""

def profile_report(
    blocks: Sequence[tuple[str, Tier | str]],
    runs: Sequence[tuple[int, float, float, float, float, int, Tier | str, int]],
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
class Lease:
    """A staged block, leased from the engine."""
    @property
    def block(self) -> int:
        """The engine's index of the leased block."""
    @property
    def waited(self) -> float:
        """Seconds `acquire` waited for the block to be staged."""
    @property
    def hit(self) -> bool:
        """True when the block was already staged at `acquire`."""
    def block_bytes(self) -> TensorBytes:
        """The whole staged block as bytes (a zero-copy view for torch.from_dlpack)."""
    @property
    def in_place(self) -> bool:
        """True when the block is used in place from the map of its files (the views are the
        file's pages, and ``block_bytes`` is empty).
        """
    def forget_tensor(self, tensor: int) -> None:
        """Gives back the pages of one tensor of a block used in place once its views are no
        longer read (a later read maps them again); nothing for a staged block.
        """
    def view(self, tensor: int) -> TensorBytes:
        """One tensor's staged bytes, by index in the block's layout."""
    def expand_into(self, items: list[tuple[int, Any]], dtype: str, threads: int | None = None) -> None:
        """Expands staged tensors into CPU tensors in one call, without the GIL: each item is (the
        tensor's index in the block's layout, a contiguous CPU tensor of the engine's compute
        dtype and the tensor's size). The scale, its layout and the dtypes come from the core.
        """
    def discard(self) -> None:
        """Marks the staged bytes as spoiled: the block is staged again before its next run."""
    def release(self) -> None:
        """Gives the buffer back once every view of it is gone."""

@final
class StagedTensor:
    """One tensor of a staged block, and what the backends do with it before the block runs."""
    @property
    def name(self) -> str:
        """The tensor's name in the checkpoint."""
    @property
    def offset(self) -> int:
        """Offset of its first byte in the staging buffer (and in a device slot)."""
    @property
    def length(self) -> int:
        """Its length in bytes in the staging buffer."""
    @property
    def dtype(self) -> str:
        """The dtype of the staged bytes (header name)."""
    @property
    def shape(self) -> list[int]:
        """Elements along each dimension, outermost first; empty for a scalar."""
    @property
    def own_scale(self) -> tuple[int, int] | None:
        """(offset, length) of the per-row f32 scales the engine made quantizing it on load."""
    @property
    def scale_index(self) -> int | None:
        """The block's checkpoint scale tensor that scales it, by index in the layout."""
    @property
    def scale_layout(self) -> str | None:
        """ "tensor", "row" or "block" when a scale applies."""
    @property
    def expand_at(self) -> int | None:
        """Offset in the expansion buffer; None: used in place (or a scale tensor)."""
    @property
    def is_scale(self) -> bool:
        """A checkpoint scale tensor, consumed by its weight's expansion."""

@final
class OverlayBytes:
    """What an engine's patched images take."""
    @property
    def memory(self) -> int:
        """Bytes of private memory (RAM-tier blocks' images)."""
    @property
    def file(self) -> int:
        """Bytes of overlay files (disk-tier blocks' images)."""
    @property
    def blocks(self) -> int:
        """Blocks staged from a patched image."""

def overlay_limit(text: str, streamed: int) -> int:
    """The overlay folder's limit in bytes from the `overlay_limit` setting's text: a size
    ("20GB"), or "auto" (twice `streamed`, the bytes of the streamed blocks that may use it).
    """

def default_overlay_dir(file: str | PathLike[str]) -> Path:
    """Where overlay files go when no folder is set: a folder beside the checkpoint's `file`."""

@final
class EngineStats:
    """The prefetch engine's counters."""
    @property
    def ram_bytes(self) -> int:
        """Tensor bytes staged from the RAM tier."""
    @property
    def disk_bytes(self) -> int:
        """Tensor bytes staged from the disk tier."""
    @property
    def ram_cold_bytes(self) -> int:
        """Of the RAM tier's bytes, those read from the drive (pages not in memory: a first pass)."""
    @property
    def ram_cold_blocks(self) -> int:
        """Blocks of the RAM tier read from the drive."""
    @property
    def ram_cold_seconds(self) -> float:
        """Workers' seconds on those blocks, summed over workers."""
    @property
    def read_seconds(self) -> float:
        """Seconds workers spent staging, summed over workers."""
    @property
    def compute_waited_seconds(self) -> float:
        """Seconds the compute thread waited for staged blocks."""
    @property
    def acquires(self) -> int:
        """Runs of blocks counted: each `acquire`, and each `advance` after a `try_lease`."""
    @property
    def hits(self) -> int:
        """Acquires that found their block already staged."""
    @property
    def misses(self) -> int:
        """Acquires that had to wait for their block."""
    @property
    def buffer_waits(self) -> int:
        """Times a worker waited for a free pinned buffer, and for how long."""
    @property
    def buffer_wait_seconds(self) -> float:
        """Seconds workers waited for a free staging buffer, summed over workers."""
    @property
    def out_of_order(self) -> int:
        """Acquires of a block other than the one the run order says comes next."""
    @property
    def failures(self) -> int:
        """Stagings that failed (the block's next `acquire` raises the error)."""

@final
class Staging:
    """One block a worker read into a staging buffer, timed on `clock()`."""
    @property
    def block(self) -> int:
        """The engine's index of the block."""
    @property
    def worker(self) -> int:
        """The worker thread, from 0."""
    @property
    def start(self) -> float:
        """Seconds on `clock()`."""
    @property
    def end(self) -> float:
        """When the staging ended: seconds on `clock()`, like `start`."""
    @property
    def bytes(self) -> int:
        """Tensor bytes staged."""
    @property
    def source(self) -> StagingSource:
        """Where the bytes came from: `StagingSource.DISK`, `RAM_WARM` (pages in memory) or
        `RAM_COLD` (pages read from the drive).
        """

@final
class StagingSource:
    """Where a worker's staging read its bytes from: the core's `stream::StagingSource` as a Python
    enum class.
    """

    DISK: StagingSource
    """Where a worker's staging read its bytes from: the core's `stream::StagingSource` as a Python
    enum class.
    """
    RAM_WARM: StagingSource
    """Where a worker's staging read its bytes from: the core's `stream::StagingSource` as a Python
    enum class.
    """
    RAM_COLD: StagingSource
    """Where a worker's staging read its bytes from: the core's `stream::StagingSource` as a Python
    enum class.
    """
    @property
    def value(self) -> str:
        """The source's name in traces and logs: "disk", "ram_warm" or "ram_cold"."""
    def __int__(self) -> int: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class StagingPool:
    """`count` page-aligned staging buffers of `size` bytes (rounded up to whole pages), allocated
    and written once; engines made with it (`Engine(..., pool=)`) stage into them in turn.
    """
    def __new__(cls, size: int, count: int) -> StagingPool: ...
    def buffers(self) -> list[tuple[int, int]]:
        """(address, length) of every buffer, for registering them as pinned memory once: they
        never move while the pool lives.
        """
    @property
    def buffer_bytes(self) -> int:
        """Bytes of each buffer."""
    @property
    def count(self) -> int:
        """Number of buffers."""
    @property
    def bytes(self) -> int:
        """Bytes of every buffer together."""
    @property
    def holder(self) -> str | None:
        """The name of the engine that has the buffers now (None when no engine streams)."""
    @property
    def users(self) -> int:
        """Engines (and their leases) that still hold a reference to the pool's memory."""

@final
class StreamTensor:
    """One tensor of a streamed block, as the engine reads it: bytes `start..end` of the engine's
    file `file` (an index into its `files`), holding `shape` elements of `dtype`.
    """
    def __new__(
        cls,
        name: str,
        *,
        file: int,
        start: int,
        end: int,
        dtype: str,
        shape: Sequence[int],
        rows: Sequence[int] | None = None,
    ) -> StreamTensor:
        """`dtype` is the safetensors header name ("BF16", "F8_E4M3", ...) or a GGML block type
        ("Q4_K"), checked here; `rows`, when given, the order the model takes the rows in (row
        `r` of the weight is stored row `rows[r]`), checked when the engine is made.
        """
    @property
    def name(self) -> str:
        """The tensor's name in the checkpoint."""
    @property
    def file(self) -> int:
        """Index into the engine's files."""
    @property
    def start(self) -> int:
        """Offset of its first byte in the file (header included)."""
    @property
    def end(self) -> int:
        """Offset one past its last byte."""
    @property
    def dtype(self) -> str:
        """The dtype of its bytes in the file (header name)."""
    @property
    def shape(self) -> list[int]:
        """Elements along each dimension, outermost first; empty for a scalar."""

@final
class StreamBlock:
    """A streamed block as the engine stages it: its name, the tier it waits in between runs
    (`Tier.RAM` or `Tier.DISK`) and its tensors.
    """
    def __new__(cls, name: str, tier: Tier | str, tensors: Sequence[StreamTensor]) -> StreamBlock: ...
    @property
    def name(self) -> str:
        """The block's name, as the plan and the run order name it."""
    @property
    def tier(self) -> Tier:
        """The tier it waits in between runs: `Tier.RAM` or `Tier.DISK`."""
    @property
    def tensors(self) -> list[StreamTensor]:
        """Its tensors, in the order the engine stages them."""

@final
class Engine:
    """The prefetch engine of one model."""
    def __new__(
        cls,
        blocks: Sequence[StreamBlock],
        files: Sequence[str | PathLike[str]],
        config: EngineConfig,
        *,
        pool: StagingPool | None = None,
        holder: str | None = None,
    ) -> Engine: ...
    def park(self) -> bool:
        """Gives the shared pool's buffers back (waiting, without the GIL, for blocks being staged
        into them); whether it had them. False for an engine with buffers of its own.
        """
    def set_order(self, order: list[int]) -> None:
        """Sets the run order (engine block indices); blocks left out follow in definition order."""
    def order(self) -> list[int]:
        """The run order in use (engine block indices, every block once)."""
    def recorded_order(self) -> list[int]:
        """The order blocks were first acquired in."""
    def clear_recorded_order(self) -> None:
        """Forgets the recorded order (new hooks on the same model record their own)."""
    def acquire(self, block: int) -> Lease:
        """Waits (without the GIL) until `block` is staged, and leases its buffer."""
    def try_lease(self, block: int) -> Lease | None:
        """Leases `block` if it is staged now (None otherwise), without counting a run: for copying
        it to the device ahead of its run. Call `advance(block)` when it runs.
        """
    def share_reads(self, lane: ReadLane, positions: list[int]) -> None:
        """Makes the engine's drive reads wait in `lane` (the model's), shared with the model's
        other readers; `positions[b]` is engine block `b`'s position in the lane's run order.
        Called again, it replaces the positions.
        """
    def advance(self, block: int) -> None:
        """Counts a run of `block` leased with `try_lease`, and stages the blocks after it."""
    def set_last_pass(self, last: bool) -> None:
        """Marks the pass under way as the last (True): nothing past the end of the order is staged,
        and queued blocks past it are dropped. False wraps into the next pass again.
        """
    def next_blocks(self, block: int) -> list[int]:
        """The blocks staged ahead once `block` runs, nearest first (none past the end of the order
        in a last pass): what a device copying ahead copies.
        """
    def stage_ram_tier_ahead(self) -> bool:
        """Stages the RAM tier ahead like the other tiers from now on (it was held back to be copied
        straight from memory, which its failed pinning rules out); whether anything changed.
        """
    def copy_ram_tier_directly(self) -> bool:
        """Holds the RAM tier back for the caller to copy straight from memory again, after
        `stage_ram_tier_ahead` (the tier arrived later and was pinned then); whether anything
        changed.
        """
    def wait_idle(self, timeout: float) -> bool:
        """Waits (without the GIL) until the workers have nothing queued or in hand, or `timeout`
        seconds pass; whether they are idle.
        """
    def release_pages(self, block: int, keep_cache: bool = False) -> int:
        """Gives back a RAM-tier block's memory (its mapped pages, and their page cache unless
        `keep_cache`); the bytes given back.
        """
    def ram_image(self, block: int) -> TensorBytes | None:
        """The in-memory RAM tier's bytes of `block`, laid out as staged (a zero-copy view, read-only:
        the engine copies from it too), or None when the block is not held in private memory.
        Such blocks are not staged ahead when the configuration pins the RAM tier: copy them from
        here and count the run with `advance`.
        """
    def ram_image_buffers(self) -> list[tuple[int, int]]:
        """(address, length) of every in-memory RAM-tier block, for registering them as pinned."""
    def keep_overlays_in(self, dir: str | PathLike[str], limit: int) -> None:
        """Keeps disk-tier blocks' patched images as overlay files in `dir` (made if missing), at
        most `limit` bytes of them in the folder.
        """
    def patch(
        self, block: int, tensor: int, data: Any, key: str, place: str, scale: Any | None = None
    ) -> Literal["memory", "file"]:
        """Writes `data` (a CPU tensor: the new bytes of staged tensor `tensor` of `block`, in its
        staged form; `scale`, its staged scales where it has them) into the block's patched
        image, made in `place` ("memory" or "file") where it has none, and staged from then on;
        `key` names what the bytes depend on. Returns where the image is kept.
        """
    def unpatch(self, block: int, tensors: list[int]) -> None:
        """Takes back the patches of `tensors` (staged indices) of `block`: the checkpoint's bytes
        are staged again.
        """
    def adopt(self, block: int, keys: dict[int, str]) -> bool:
        """Takes the overlay file of the merges `keys` (staged index to key, as `patch` named them)
        for `block`'s image, where the overlay folder has one: staged from it from now on, merged.
        False where there is none.
        """
    def patches(self, block: int) -> dict[int, str]:
        """The key of each patched tensor of `block`, by staged index."""
    def patched_image_len(self, block: int) -> int:
        """Bytes of `block`'s patched image, made or not (its staged length; for a block used in
        place, its tensors packed at the CPU's alignment).
        """
    def overlay_bytes(self) -> OverlayBytes:
        """What the patched images of every block take."""
    def load_ram_tier(self) -> tuple[int, float]:
        """Reads the RAM tier into private memory now (only with ram_in_memory); (bytes, seconds)."""
    def staging_buffers(self) -> list[tuple[int, int]]:
        """(address, length) of each staging buffer, for registering them as pinned memory."""
    def layout(self, block: int) -> list[StagedTensor]:
        """Each tensor of `block` as staged, with what the backends do with it."""
    def staging_bytes(self) -> int:
        """Bytes of the staging buffers the engine stages into, all together (a shared pool's when
        it was made with one).
        """
    def in_place(self, block: int) -> bool:
        """True when `block` is used in place from the map of its files (its leases are views of
        the file's pages).
        """
    def unmaps_as_used(self, block: int) -> bool:
        """True when `block`'s tensors are unmapped one by one as the modules that use them end (a
        disk-tier block used in place); a RAM-tier block's pages stay cached either way.
        """
    def disk_read_mode(self) -> str | None:
        """The mode disk reads really use ("direct", or "buffered" after a refused O_DIRECT)."""
    def stats(self) -> EngineStats:
        """The engine's statistics since the last reset."""
    def stagings(self) -> list[Staging]:
        """The workers' most recent stagings (at most 4096), oldest first; a reset keeps them."""
    def reset_stats(self) -> None:
        """Starts the statistics again, for measuring from here (a new pass): `stats()` counts from
        now on; the RAM tier's load figures and `stagings()` are kept.
        """
    def close(self) -> None:
        """Stops the workers. Buffers still leased are freed when their leases go."""
    @property
    def closed(self) -> bool:
        """True once `close` was called: the workers are stopped, and every other call but `close`
        raises a StreamError.
        """

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
    def path(self) -> Path:
        """The file that was read, for the warning."""
    @property
    def usable(self) -> bool:
        """Whether the file held an order that fits the model."""
    @property
    def blocks(self) -> list[str] | None:
        """The file's blocks as the model spells them, in the file's order (None if not usable)."""
    @property
    def indices(self) -> list[int] | None:
        """The positions of those blocks among the model's blocks (None if not usable)."""
    @property
    def reason(self) -> str | None:
        """Why the file was not used, as a tag: "absent", "torn", "not-json", "wrong-format",
        "wrong-version", "malformed", "too-large", "unknown-block" or "duplicate".
        """
    @property
    def detail(self) -> str | None:
        """Why the file was not used, in words."""
    @property
    def block(self) -> str | None:
        """The block name at fault, for "unknown-block" and "duplicate"."""
    @property
    def outside(self) -> dict[str, int] | None:
        """The file's outside modules: name -> how many blocks of the run order start before its
        first use (None if not usable; empty when the file has none, as older files).
        """
    def outside_for(self, modules: list[str]) -> dict[str, int]:
        """The file's outside positions when every name in them is one of `modules` (the model's
        modules outside its blocks that hold weights), else empty: the core's rule.
        """
    def warning(self) -> str | None:
        """The one warning line for a file that exists but was ignored; None otherwise."""

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
    "Arrival",
    "Departure",
    "Free",
    "Giving",
    "GroupRecord",
    "Holder",
    "Holds",
    "Leaving",
    "LoadReads",
    "Pace",
    "PaceChoice",
    "PaceVerdict",
    "ReadCosts",
    "Replan",
    "Schedule",
    "Share",
    "Sharing",
    "Shed",
    "StageRecord",
    "depart",
    "give_back",
    "load_reads",
    "make_room",
    "pipeline_report",
    "plan_reads",
    "ram_floor",
    "read_costs",
    "replan",
    "resident_among",
    "still_fits",
]

@final
class Holds:
    """What a loaded stage holds that its release gives back, in bytes."""
    def __new__(cls, ram: int = 0, vram: int = 0) -> Holds: ...
    @staticmethod
    def of(stage: str, plan: Plan) -> Holds:
        """What `stage` (its name, for errors), loaded by `plan` under the current settings, holds."""
    @staticmethod
    def at_once(stage: str, plan: Plan) -> Holds:
        """What `stage` (its name, for errors), loaded by `plan`, takes as its load is set up,
        before any read its allowance gates: its own staging buffers and, on a GPU, its device
        slots and expansion buffers.
        """
    @staticmethod
    def needed(stage: str, plan: Plan) -> Holds:
        """What `stage`, loaded by `plan`, needs free at its start: what it holds and the free
        memory its plan leaves alone.
        """
    @property
    def on_device(self) -> bool:
        """Whether a stage holding this computes its blocks in device memory (it holds some)."""
    def in_compute_memory(self, n: int) -> Holds:
        """`n` bytes of the memory a stage holding this computes its blocks in."""
    def compute_part(self, part: Holds) -> int:
        """The bytes of `part` in the memory a stage holding this computes its blocks in."""
    def fits(self, free: Free) -> bool:
        """Whether this much fits in `free`."""
    def beyond(self, free: Free) -> Holds:
        """What of this does not fit in `free`."""
    @property
    def ram(self) -> int:
        """Private RAM."""
    @property
    def vram(self) -> int:
        """Device memory (a GPU's; 0 on the CPU)."""
    def plus(self, other: Holds) -> Holds:
        """The sum of two holdings."""
    def less(self, part: Holds) -> Holds:
        """What is left once `part` is taken out (none below zero)."""

@final
class Free:
    """Free memory in bytes: RAM the process can use, and free VRAM where a GPU computes."""
    def __new__(cls, ram: int, vram: int | None = None) -> Free: ...
    @staticmethod
    def probe(vram: int | None = None) -> Free:
        """The memory free now as a plan made now counts it; `vram` is the device's free memory
        (None off a GPU).
        """
    @property
    def ram(self) -> int:
        """RAM the process can use, in bytes."""
    @property
    def vram(self) -> int | None:
        """Free device memory in bytes; None when the CPU computes."""
    def after_release(self, released: Holds) -> Free:
        """The memory free once `released` is given back."""
    def with_shared_pool(self, pool: int) -> Free:
        """The memory free for planning a stage beside a shared staging pool of `pool` bytes,
        which every stage's plan counts itself: the pool's RAM back (before `within`).
        """
    def with_kept_pages(self, kept: int) -> Free:
        """The memory free for a pipeline whose pool of pages keeps `kept` bytes for its stages'
        next reads: those pages back (before `within`).
        """
    def for_reads_beside(self, *, peak: int = 0, reserve: int = 0) -> int:
        """The bytes a stage read ahead may fill now, beside a running stage: the free memory its
        blocks compute in (VRAM with a GPU, else RAM) less the running stage's working memory
        (`peak`, its measured activations; on a GPU at least the `reserve` its plan set aside).
        The floor of free RAM is this one's already (`keeping`).
        """
    def fits_beside(self, need: Holds, *, peak: int = 0, reserve: int = 0) -> bool:
        """Whether `need` (what a stage read ahead takes at once, `Holds.at_once`) fits in this
        memory beside a running stage whose working memory is `peak` (on a GPU at least its
        `reserve`): the memory its blocks compute in as `for_reads_beside` counts it, and with a
        GPU the RAM as well.
        """
    def keeping(self, floor: int) -> Free:
        """The memory free for a pipeline's stages: this, with `floor` bytes of RAM kept for the
        rest of the machine (see `ram_floor`; before `within`: off the machine, not the budget).
        """
    def less(self, taken: Holds) -> Free:
        """The memory left free once `taken` is taken (none below zero)."""
    def within(self, ram: int | None, vram: int | None, held: Holds) -> Free:
        """The memory free within a budget of `ram` (and `vram`) bytes, less what is `held`,
        never more than this.
        """

@final
class Replan:
    """Why a stage is planned again at its start: the memory that missed the prediction."""
    @property
    def memory(self) -> str:
        """ "RAM" or "VRAM"."""
    @property
    def predicted(self) -> int:
        """Bytes of that memory the stage was planned to find free."""
    @property
    def actual(self) -> int:
        """Bytes of that memory free at the stage's start."""
    @property
    def margin(self) -> int:
        """The largest gap in bytes, either way, between `predicted` and `actual` that would have
        kept the plan.
        """

@final
class LoadReads:
    """How a pipeline's loads read its stages' weights: through the page cache or past it."""
    @property
    def direct(self) -> bool:
        """Whether the loads read past the page cache (O_DIRECT where the file system allows it)."""
    @property
    def reason(self) -> str:
        """Why, in a sentence for the report."""

def load_reads(files: int, ram: int, vram: int | None = None, keep: bool = True) -> LoadReads:
    """How a pipeline whose stages' files hold `files` bytes together reads them at its loads,
    allowed `ram` bytes of RAM (and `vram` of device memory on a GPU), keeping its stages loaded
    between runs where they fit (`keep`): past the page cache when each file is read once (the
    stages stay loaded together), or when the files would not stay cached beside what the stages
    hold in RAM; `TRASH_PANDA_DISK_MODE` other than `auto` wins.
    """

def plan_reads(plan: Plan, files: int, read_again: bool = False) -> LoadReads:
    """How one model loaded by `plan` on its own (not a pipeline's stage) reads its files of `files`
    bytes: through the page cache only when a later load reads them again (`read_again`:
    `stage()` releases the model at its end) and they stay cached beside what the plan holds in
    RAM, within the RAM the plan may use; `TRASH_PANDA_DISK_MODE` other than `auto` wins.
    """

@final
class Holder:
    """A loaded stage that could give memory to the stage being loaded: its name, its place in the
    pipeline, what its release frees (`whole`), the bytes of resident blocks it could give back
    one by one, and whether it has run.
    """
    def __new__(cls, name: str, index: int, whole: Holds, sheddable: int, has_run: bool) -> Holder: ...
    @property
    def name(self) -> str:
        """The stage's name."""
    @property
    def index(self) -> int:
        """Its place in the pipeline (0: the first stage)."""

@final
class Giving:
    """One stage's part of the room made: all of it (`whole`), or `blocks` bytes of its resident
    blocks, those it runs last, in the memory its blocks compute in.
    """
    @property
    def stage(self) -> str:
        """The giving stage's name."""
    @property
    def whole(self) -> bool:
        """Whether it gives all it holds (it is released)."""
    @property
    def blocks(self) -> int:
        """Bytes of its blocks it gives back (0 when it gives all of it)."""

def make_room(here: int, stages: int, short: Holds, holders: list[Holder], *, keep: bool) -> list[Giving]:
    """Who gives what so that `short` (what the stage at `here` needs beyond the free memory) is
    free, among `holders`, in a pipeline of `stages` stages: the stage whose next turn is
    furthest off first; one that has run gives only the blocks missing when it has more
    (unless `keep` is off), any other goes whole.
    """

def replan(predicted: Free, actual: Free) -> Replan | None:
    """Whether a stage planned for `predicted` must be planned again for `actual` (None: keep it)."""

def still_fits(stage: str, loaded: Plan, fresh: Plan, actual: Free) -> bool:
    """Whether `stage`, read ahead by plan `loaded`, whose start found `actual` free past the
    prediction's margin, is kept as it was loaded: `fresh` (a plan made for `actual`) puts every
    block in the same tier, and what `loaded` needs at its start under the current settings
    fits `actual`.
    """

def ram_floor(min_free_ram: Sequence[int | str | None]) -> int:
    """The RAM a pipeline leaves to the rest of this machine: the largest of its stages'
    `min_free_ram` (each `"auto"`, bytes or a size; None is `"auto"`), `"auto"` resolved for
    this machine's RAM. The pipeline keeps it from the machine's free memory
    (`Free.keeping`), and its stages plan with none.
    """

@final
class AllowanceStats:
    """What an allowance has done."""
    @property
    def taken(self) -> int:
        """Bytes the reads took, waiting or not."""
    @property
    def given(self) -> int:
        """Bytes the running stage gave back with `give`."""
    @property
    def waits(self) -> int:
        """Takes that had to wait for memory."""
    @property
    def wait_seconds(self) -> float:
        """Seconds those takes waited, summed."""

@final
class Allowance:
    """The memory the next stage's early reads may fill while the stage before it runs: `take`
    waits (without the GIL) until the bytes are there; `give` adds what the running stage freed;
    `open` lifts the limit when the stage starts; `close` fails every wait.
    """
    def __new__(cls, stage: str, bytes: int) -> Allowance: ...
    def take(self, bytes: int) -> None:
        """Takes `bytes` for a read, waiting (without the GIL) until they are there or the
        allowance is opened; a StreamError once it is closed. A read larger than anything
        the running stage can give back waits for the next stage's start.
        """
    def try_take(self, bytes: int) -> bool:
        """Takes `bytes` if they are there now, without waiting; whether it took them (False once
        closed).
        """
    def give(self, bytes: int) -> None:
        """Adds `bytes` the running stage freed, waking the takes that now fit."""
    def open(self) -> None:
        """Lifts the limit: call it when the stage the reads are for starts, as its plan holds from
        then on; waiting and later takes go through.
        """
    def close(self) -> None:
        """Fails every waiting and later take: call it when the stage the reads are for is
        dropped.
        """
    @property
    def available(self) -> int | None:
        """Bytes a read may take now without waiting (None once opened: no limit)."""
    @property
    def is_open(self) -> bool:
        """Whether `open` was called: reads then take without limit."""
    @property
    def waiting(self) -> int:
        """Takes waiting for memory now."""
    @property
    def stage(self) -> str:
        """The name of the stage the reads are for."""
    def hold(self) -> None:
        """Makes every read wait, whatever memory is there, until `resume` or `open`: the read
        ahead is paused.
        """
    def resume(self) -> None:
        """Lets reads take what is there again after `hold`."""
    @property
    def is_held(self) -> bool:
        """Whether reads are held (and the allowance not opened since)."""
    def stats(self) -> AllowanceStats:
        """What the allowance has done so far (a copy, which later takes do not change)."""

@final
class PaceChoice:
    """What the read-ahead does now."""

    MEASURING: PaceChoice
    """What the read-ahead does now."""
    READ: PaceChoice
    """What the read-ahead does now."""
    PAUSE: PaceChoice
    """What the read-ahead does now."""
    def __int__(self) -> int: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class PaceVerdict:
    """The choice, the figures behind it, and why."""
    @property
    def choice(self) -> PaceChoice:
        """What the read-ahead does."""
    @property
    def lost_per_gb(self) -> float | None:
        """Seconds of the running stage's compute lost per GB read beside it, once measured."""
    @property
    def alone_per_gb(self) -> float | None:
        """Seconds a GB takes to read with nothing beside it, where known."""
    @property
    def reason(self) -> str:
        """Why, in a sentence for the report."""

@final
class Pace:
    """The running stage's block times, with reads in flight and without, and what the read-ahead
    has read: `verdict()` says whether reading ahead pays.
    """
    def __new__(cls, blocks: int) -> Pace: ...
    def set_alone_rate(self, bytes_per_second: float) -> None:
        """The rate, in bytes per second, of a read with nothing beside it; ignored unless positive."""
    def note_load(self, bytes: int, seconds: float) -> None:
        """A load at a stage's start read `bytes` in `seconds`: the fastest such load large enough
        to say something of the drive is what a read takes alone.
        """
    def ran(self, block: int, seconds: float, busy: bool) -> None:
        """Block `block` of the running stage computed for `seconds`, with reads in flight (`busy`)
        or not.
        """
    def set_read(self, bytes: int) -> None:
        """The read-ahead has read `bytes` so far."""
    @property
    def wants_quiet(self) -> bool:
        """Whether fewer quiet runs than one pass are known."""
    @property
    def choice(self) -> PaceChoice:
        """What the read-ahead should do now, without the figures and words of `verdict()`."""
    def verdict(self) -> PaceVerdict:
        """What the read-ahead should do now, the figures behind it and why."""

@final
class Shed:
    """Blocks (by prefix, in the order chosen) and the bytes they hold, as their plan counts them."""
    @property
    def blocks(self) -> list[str]:
        """The blocks' prefixes, in the order chosen."""
    @property
    def bytes(self) -> int:
        """Their bytes together."""

@final
class ReadCosts:
    """What each read of a stage's loader holds once done, as its plan counts it: each block asked
    about (its stored bytes when resident, else 0), the weights outside the blocks, and a RAM tier
    read into memory.
    """
    @property
    def blocks(self) -> list[int]:
        """Each block asked about, in the order asked: its stored bytes when resident, else 0."""
    @property
    def outside(self) -> int:
        """The weights outside the blocks, when the loader reads some of them: their budget."""
    @property
    def ram_tier(self) -> int:
        """A RAM tier the loader reads into memory on the CPU: each RAM-tier block's staged bytes."""

def give_back(plan: Plan, run_order: list[str], gone: list[str], ask: int, counted: int = 0) -> Shed:
    """Which blocks a stage loaded by `plan` gives back so that `ask` bytes are free, `counted` of
    them free already: its resident blocks not given back yet (`gone`), those that run last first
    (`run_order`: every block's prefix in the order they run), until their bytes and `counted`
    cover `ask`.
    """

def resident_among(plan: Plan, blocks: list[str]) -> Shed:
    """The resident blocks among `blocks` (prefixes, in their order) and the bytes they hold, as
    `plan` counts them.
    """

def read_costs(
    plan: Plan, config: EngineConfig, blocks: list[str], *, outside: bool, ram_tier: bool, gpu: bool
) -> ReadCosts:
    """What the loader's reads of `blocks` (prefixes) hold once done, with the weights outside the
    blocks when it reads some (`outside`) and the RAM tier when it reads that too (`ram_tier`),
    for a stage loaded by `plan` and configured as `config`, computing on a GPU when `gpu`.
    """

@final
class Arrival:
    """How a stage's weights were there when its turn came (the core's `Arrival`)."""

    KEPT: Arrival
    """How a stage's weights were there when its turn came (the core's `Arrival`)."""
    READ_AHEAD: Arrival
    """How a stage's weights were there when its turn came (the core's `Arrival`)."""
    READ_AT_START: Arrival
    """How a stage's weights were there when its turn came (the core's `Arrival`)."""
    REPLANNED: Arrival
    """How a stage's weights were there when its turn came (the core's `Arrival`)."""
    def __int__(self) -> int: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class Departure:
    """What became of a stage at its end (the core's `Departure`)."""

    KEPT: Departure
    """What became of a stage at its end (the core's `Departure`)."""
    RELEASED: Departure
    """What became of a stage at its end (the core's `Departure`)."""
    FINAL_PASS: Departure
    """What became of a stage at its end (the core's `Departure`)."""
    FAILED: Departure
    """What became of a stage at its end (the core's `Departure`)."""
    def __int__(self) -> int: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class Leaving:
    """What becomes of a stage at its end (`departure`), and the bytes of its blocks a kept one
    gives back now (`give`, 0 otherwise), those it runs last.
    """
    @property
    def departure(self) -> Departure:
        """How it leaves."""
    @property
    def give(self) -> int:
        """Kept: bytes of its blocks to give back now (0: none); 0 when it is not kept."""
    def __eq__(self, other: object, /) -> bool: ...

def depart(
    *, failed: bool, final_pass: bool, release_after: bool, keep: bool, to_give: int, passed: int, sheddable: int
) -> Leaving:
    """How a stage leaves at its turn's end: `failed` (one of its blocks raised) first; released
    (by its `final_pass` when one ran) when `release_after`, when `keep` is off, or when what it
    must still give (`to_give` less what its final pass freed, `passed`) reaches all it could
    shed (`sheddable`); kept otherwise, giving back the rest of what was asked.
    """

@final
class StageRecord:
    """One stage of one pipeline run, for the pipeline's report."""
    def __new__(
        cls,
        run: int,
        stage: str,
        arrival: Arrival,
        departure: Departure,
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
        file_changed: str | None = None,
        beside: PaceVerdict | None = None,
        plan_warnings: list[str] = ...,
        share: Share | None = None,
    ) -> StageRecord: ...
    @property
    def run(self) -> int:
        """The run's number, as the caller counts its runs."""
    @property
    def stage(self) -> str:
        """The stage's name."""
    @property
    def arrival(self) -> Arrival:
        """How its weights were there when its turn came."""
    @property
    def departure(self) -> Departure:
        """What became of it at its end."""
    @property
    def read_before_start(self) -> int:
        """Bytes it already held when its turn came, read while the stage before it computed."""
    @property
    def holds(self) -> int:
        """Bytes its plan holds in all."""
    @property
    def file_bytes(self) -> int:
        """Bytes of its checkpoint; 0 when kept."""
    @property
    def cached_at_load(self) -> int:
        """Bytes of its checkpoint already in the page cache when its load began; 0 when kept."""
    @property
    def waited(self) -> float:
        """Seconds its calls waited for weights not read yet."""
    @property
    def seconds(self) -> float:
        """Seconds from its start to its end."""
    @property
    def peak(self) -> int:
        """Its peak activation memory in bytes, remembered for its next plan (0: not measured)."""
    @property
    def read_again(self) -> int:
        """Bytes of its blocks given to other stages since its last run and read again at its start
        (for a stage kept loaded).
        """
    @property
    def given_back(self) -> int:
        """Bytes of its blocks given to the next stage, by its final pass or at its end (for a stage
        kept loaded; the rest stays for the next run).
        """
    @property
    def plan_warnings(self) -> list[str]:
        """The warnings of the plan it was loaded by; empty when it was kept loaded."""
    @property
    def beside(self) -> PaceVerdict | None:
        """What the next stage's read-ahead cost its compute, and what the runner did about it;
        None when nothing was read beside it.
        """
    @property
    def file_changed(self) -> str | None:
        """Why it was loaded afresh though kept from an earlier run: its checkpoint changed on disk
        since (which file, and how). None otherwise.
        """
    @property
    def predicted(self) -> Free | None:
        """The free memory its plan was made for; None when it was kept loaded."""
    @property
    def actual(self) -> Free | None:
        """The memory free at its start, what it already held counted as free; None when it was kept
        loaded.
        """

    @property
    def share(self) -> Share | None:
        """Its group and why it got its share of the group's memory; None outside a group."""

def pipeline_report(records: list[StageRecord], groups: list[GroupRecord] = ...) -> str:
    """The report of the stages of a pipeline's runs, in the order they ran; each group's run
    before its first member's record.
    """

@final
class Sharing:
    """How the members of a group share the memory over a run (the core's `Sharing`)."""

    TURNS: Sharing
    """How the members of a group share the memory over a run (the core's `Sharing`)."""
    TOGETHER: Sharing
    """How the members of a group share the memory over a run (the core's `Sharing`)."""
    def __int__(self) -> int: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class Schedule:
    """The calls of a group's members over one run, as stretches of one member each."""
    def __new__(cls, group: str, members: list[str], runs: list[tuple[str, int]]) -> Schedule: ...
    @staticmethod
    def learned(group: str, members: list[str], calls: list[str]) -> Schedule:
        """The schedule of the calls seen in one run: each member's name, call by call."""
    @property
    def runs(self) -> list[tuple[str, int]]:
        """Its stretches, (member, calls) in order."""
    @property
    def sharing(self) -> Sharing:
        """Turns when each member runs in one stretch, else together."""
    def calls(self, member: str) -> int:
        """How many times ``member`` is called over the run."""
    def order(self) -> list[str]:
        """The members called, in the order of their first call."""
    def planning_order(self, members: list[str]) -> list[str]:
        """The order members loaded together are planned in: the one called most first."""
    def is_last_call(self, member: str, n: int) -> bool:
        """Whether the ``n``-th call (from 1) of ``member`` is its last of the run."""
    def __eq__(self, value: object, /) -> bool: ...

@final
class Share:
    """A member's place in its group and why it got its share of the memory, for its record."""
    @staticmethod
    def turn(group: str) -> Share:
        """Members take turns: planned at its turn for the budget less what the others held then."""
    @staticmethod
    def first(group: str, calls: int | None = None) -> Share:
        """Loaded together and planned first (``calls`` in the run, the most; None: no schedule
        yet, planned in pipeline order).
        """
    @staticmethod
    def after(group: str, before: list[str], calls: int | None = None) -> Share:
        """Loaded together, planned for what the members ``before`` it left (``calls``: its calls
        in the run; None: no schedule yet).
        """
    @staticmethod
    def kept(group: str) -> Share:
        """Kept loaded from an earlier run, as it was planned then."""
    @property
    def group(self) -> str:
        """The group's name."""

@final
class GroupRecord:
    """One run of a group, for the pipeline's report."""
    def __new__(
        cls,
        run: int,
        group: str,
        sharing: Sharing,
        *,
        schedule: Schedule | None = None,
        learned_in: int | None = None,
        ran: Schedule | None = None,
        run_order: list[tuple[str, int]] = ...,
        reads_in_order: bool = False,
    ) -> GroupRecord: ...
    @property
    def run(self) -> int:
        """The run's number."""
    @property
    def group(self) -> str:
        """The group's name."""
    @property
    def sharing(self) -> Sharing:
        """How the members shared the memory."""
    @property
    def schedule(self) -> Schedule | None:
        """The schedule the run's memory followed (None: none yet)."""
    @property
    def learned_in(self) -> int | None:
        """The run it was learned in; None when it was given or there was none."""
    @property
    def ran(self) -> Schedule | None:
        """The calls the run made (None: no member was called)."""
    @property
    def run_order(self) -> list[tuple[str, int]]:
        """The members' blocks, (member, block index), in the order they first ran across members."""
    @property
    def reads_in_order(self) -> bool:
        """Whether the run's reads followed a run order across members learned before."""
