"""Type stubs of the compiled core (checked against the module by mypy.stubtest in `make test`)."""

from os import PathLike
from typing import Any, final

__all__ = [
    "__version__",
    "Checkpoint",
    "Plan",
    "TensorBytes",
    "TensorInfo",
    "cached_bytes",
    "cast",
    "cli_main",
    "drop_cache",
    "dtype_header_name",
    "expand",
    "make_plan",
    "parse_size",
    "quantize_fp8",
    "setting",
    "settings",
]

__version__: str

@final
class TensorInfo:
    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> list[int]: ...
    @property
    def file(self) -> str: ...
    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...
    @property
    def nbytes(self) -> int: ...

@final
class TensorBytes:
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
    def __new__(cls, path: str | PathLike[str]) -> Checkpoint: ...
    @property
    def files(self) -> list[str]: ...
    def __len__(self) -> int: ...
    def __contains__(self, name: str, /) -> bool: ...
    def tensors(self) -> list[TensorInfo]: ...
    def info_of(self, name: str) -> TensorInfo: ...
    def view(self, name: str) -> TensorBytes: ...
    def close(self) -> None: ...

def dtype_header_name(name: str) -> str: ...
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
) -> None: ...
def cast(src: Any, src_dtype: str, dst: Any, dst_dtype: str, threads: int | None = None) -> None: ...
def quantize_fp8(
    src: Any,
    src_dtype: str,
    dst: Any,
    scales: Any,
    rows: int,
    cols: int,
    per_row: bool,
    threads: int | None = None,
) -> None: ...
def drop_cache(path: str | PathLike[str]) -> None: ...
def cached_bytes(path: str | PathLike[str]) -> int: ...
def cli_main(argv: list[str]) -> int: ...

@final
class Plan:
    @staticmethod
    def manual(resident: list[str], streamed: list[str], streamed_tier: str = "ram") -> Plan: ...
    @staticmethod
    def from_json(text: str) -> Plan: ...
    def to_json(self) -> str: ...
    def assign(self, tier: str, indices: list[int] | None = None, prefixes: list[str] | None = None) -> None: ...
    def resolve(
        self,
        tensors: list[tuple[str, str, list[int]]],
        prefixes: list[str] | None,
        free_vram: int | None,
        has_gpu: bool,
        ram: int | None = None,
        **options: Any,
    ) -> Plan: ...

def make_plan(
    tensors: list[tuple[str, str, list[int]]],
    prefixes: list[str] | None,
    free_vram: int | None,
    has_gpu: bool,
    ram: int | None = None,
    **options: Any,
) -> Plan: ...
def parse_size(value: int | str, what: str = "size") -> int: ...
def setting(name: str, argument: object = None) -> bool | int | str: ...
def settings() -> list[dict[str, str]]: ...
