"""Host memory registered as pinned with the CUDA runtime torch loaded: registered once, every
range or none, each runtime error cleared where it happens (the next kernel launch would report
it as its own), unregistered by ``close()`` or when the registration is collected, never before
what owns the memory."""

from __future__ import annotations

import ctypes
import functools
import os
import warnings
import weakref
from typing import Any

__all__ = ["PinnedRegistration", "register_ranges"]


# cudaErrorCudartUnloading: the runtime is shutting down with the process, and the memory with it.
_CUDART_UNLOADING = 4


def _code(err: Any) -> int:
    return int(getattr(err, "value", err))


@functools.cache
def _runtime() -> ctypes.CDLL | None:
    """The CUDA runtime library torch loaded. Its last error is per instance of the library, so
    it is found among the libraries mapped into the process (a wheel may ship it under another
    name) before any is loaded by name."""
    names: list[str] = []
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            for line in maps:
                path = line.rsplit(None, 1)[-1]
                if os.path.basename(path).startswith("libcudart") and path not in names:
                    names.append(path)
    except OSError:
        pass
    names += ["libcudart.so.13", "libcudart.so.12", "libcudart.so", "cudart64_13.dll", "cudart64_12.dll"]
    for name in names:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        if hasattr(lib, "cudaGetLastError"):
            return lib
    return None


def _clear_cuda_error(cudart: Any) -> None:
    """Resets the CUDA runtime's last error after a call that was allowed to fail, so the next
    kernel launch that torch checks does not report it as its own. torch's ``cudart()`` has no
    cudaGetLastError, so the runtime library torch loaded is asked (``cudart``'s own when it has
    one: the fakes of the tests)."""
    own = getattr(cudart, "cudaGetLastError", None)
    if own is not None:
        own()
        return
    lib = _runtime()
    if lib is not None:
        lib.cudaGetLastError()


def _describe(cudart: Any, err: Any) -> str:
    name = getattr(err, "name", str(_code(err)))
    try:
        message = cudart.cudaGetErrorString(err)
    except Exception:
        message = "no message"
    return f"{name}: {message}"


def _unregister(cudart: Any, addresses: list[int], _owner: object) -> None:
    # `_owner` is held until here so the buffers outlive their registration.
    failed = []
    for addr in addresses:
        err = cudart.cudaHostUnregister(addr)
        if _code(err) != 0:
            failed.append(err)
            _clear_cuda_error(cudart)
    addresses.clear()
    failed = [e for e in failed if _code(e) != _CUDART_UNLOADING]
    if failed:
        # A close must complete: the memory stays pinned until the process ends, which costs
        # RAM the system cannot page out, not correctness.
        warnings.warn(
            f"could not unregister {len(failed)} pinned host range(s) ({_describe(cudart, failed[0])}); "
            "they stay pinned until the process ends",
            stacklevel=2,
        )


class PinnedRegistration:
    """Host ranges registered as pinned memory. Unregistered by :meth:`close`, or when this
    object is collected (a model dropped without release()), never before what owns the memory
    (the engine, or a host tensor), which the finalizer keeps alive until then."""

    def __init__(self, cudart: Any, owner: object, addresses: list[int]) -> None:
        self.addresses = addresses
        self._finalizer = weakref.finalize(self, _unregister, cudart, addresses, owner)

    def close(self) -> None:
        self._finalizer()


def register_ranges(
    cudart: Any, owner: object, ranges: list[tuple[int, int]], fallback: str
) -> PinnedRegistration | None:
    """Registers every range or none: when one fails, the ones done are undone, every error is
    cleared where it happens, and a warning names the error and ``fallback``."""
    done: list[int] = []
    for addr, size in ranges:
        err = cudart.cudaHostRegister(addr, size, 0)
        if _code(err) == 0:
            done.append(addr)
            continue
        _clear_cuda_error(cudart)
        for a in done:
            if _code(cudart.cudaHostUnregister(a)) != 0:
                _clear_cuda_error(cudart)
        warnings.warn(
            f"could not pin {size} bytes of host memory ({_describe(cudart, err)}); {fallback}",
            stacklevel=4,
        )
        return None
    return PinnedRegistration(cudart, owner, done)
