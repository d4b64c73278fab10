"""torch's CUDA sanitizer (``TORCH_CUDA_SANITIZER=1``) made to see what the device code does.

As torch ships it, the sanitizer keys each access by the tensor's own data pointer and watches
the thread that enabled it. The device code writes a slot through one view and computes on views
at offsets inside it, and its loader copies on a thread of its own: a race between them would go
unseen. Here (conftest.py applies it when the variable is set) each access is keyed by the start
of the allocation it is in (its storage's data pointer, which is what the allocator hands out and
frees), and the loader's thread runs under the sanitizer too."""

from __future__ import annotations

import functools
import os
from typing import Any

import pytest


def wanted() -> bool:
    return os.environ.get("TORCH_CUDA_SANITIZER", "") not in ("", "0")


def install(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from torch.cuda import _sanitizer

    from trash_panda.offload.overlap import ResidentLoader

    if not _sanitizer.cuda_sanitizer.enabled:
        return

    def by_allocation(
        self: Any, value: Any, is_write: bool, metadata_only: bool, name: str | None = None, is_output: bool = False
    ) -> None:
        if isinstance(value, torch.Tensor) and value.is_cuda:
            base = value.untyped_storage().data_ptr()
            data_ptr = base if base else id(value)
            if is_write:
                self.dataptrs_written.add(data_ptr)
            elif not metadata_only:
                self.dataptrs_read.add(data_ptr)
            self.tensor_aliases.setdefault(data_ptr, [])
            if name is not None:
                self.tensor_aliases[data_ptr].append(name)
            if is_output:
                self.outputs.add(data_ptr)

    monkeypatch.setattr(_sanitizer.ArgumentHandler, "_handle_argument", by_allocation)
    run = ResidentLoader._run

    @functools.wraps(run)
    def watched(self: ResidentLoader) -> None:
        with _sanitizer.cuda_sanitizer.dispatch:
            run(self)

    monkeypatch.setattr(ResidentLoader, "_run", watched)
