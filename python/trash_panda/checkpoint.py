"""Reading checkpoints (a safetensors file, shards, a folder of shards, or a GGUF file) into torch
tensors."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from . import _core
from ._dtypes import stored_shape, torch_dtype

if TYPE_CHECKING:
    import torch

    from ._core import TensorInfo

__all__ = ["Checkpoint"]


class Checkpoint:
    """An opened checkpoint: the index of its tensors, and zero-copy reads of them.

    Only the headers are read when it opens; a tensor's bytes are mapped when it is first read.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._core = _core.Checkpoint(os.fspath(path))
        self._lane: _core.ReadLane | None = None  # made on the first read()

    @property
    def files(self) -> list[str]:
        """The checkpoint's files: one, or every shard."""
        return [os.fspath(f) for f in self._core.files]

    def __len__(self) -> int:
        return len(self._core)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._core

    def __repr__(self) -> str:
        return repr(self._core)

    def tensors(self) -> list[TensorInfo]:
        """Every tensor's entry (name, dtype, shape, file, byte range), by file and offset."""
        return self._core.tensors()

    def gguf_metadata(self) -> dict[str, str | int | float | bool] | None:
        """A GGUF file's metadata (its scalar values; arrays such as the vocabulary are left
        out), or None for a safetensors checkpoint."""
        return self._core.gguf_metadata()

    def names(self) -> list[str]:
        """Every tensor's name, by file and offset."""
        return [t.name for t in self._core.tensors()]

    def info(self, name: str) -> TensorInfo:
        """The entry of one tensor; :class:`CheckpointError` if there is none."""
        return self._core.info_of(name)

    def read(self, name: str) -> torch.Tensor:
        """The tensor as a CPU torch tensor that shares memory with a private map of the file.

        No bytes are copied. Its pages are read in before it returns, waiting their turn in the
        drive's read queue (as a read needed now, on a lane of the checkpoint's own) with the
        reads of every model loaded from that drive. The map is copy-on-write, so writing into
        the tensor never changes the file.
        """
        if self._lane is None:
            self._lane = _core.ReadLane(self.files, 0, _core.Priority.RUN)
        return self._view(name, self._lane)

    def map(self, name: str) -> torch.Tensor:
        """:meth:`read` without reading: pages come from the drive (or the page cache) when first
        touched, outside the drive's read queue (a lookup table whose rows are read as used)."""
        return self._view(name, None)

    def _view(self, name: str, lane: _core.ReadLane | None) -> torch.Tensor:
        from torch.utils.dlpack import from_dlpack

        info = self._core.info_of(name)
        raw = from_dlpack(self._core.view(name, lane))
        return raw.view(torch_dtype(info.dtype)).reshape(stored_shape(info.dtype, info.shape, info.nbytes))

    def check_holds(self, name: str) -> None:
        """Raises :class:`CheckpointError` when the file holding tensor ``name`` no longer reaches
        its end (truncated or rewritten since it was opened): reading a view of it would crash."""
        self._core.check_holds(name)

    def changed(self) -> str | None:
        """``None`` while every file is the one whose header was read when this opened; else which
        file changed and how (rewritten, replaced by another file, resized, gone). A model that
        reads its blocks again later by this header's offsets asks this first."""
        return self._core.changed()

    def close(self) -> None:
        """Drops the file maps; tensors already read keep theirs alive until they are freed."""
        self._core.close()
