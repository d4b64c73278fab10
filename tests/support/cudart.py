"""A stand-in for the CUDA runtime torch loaded: what registering pinned memory calls."""

from __future__ import annotations


class FakeCudart:
    """torch's cudart as the runtime behaves: a failed call leaves its error as the last error
    until cudaGetLastError reads it (and the next kernel launch would report it)."""

    def __init__(self, fail_register: set[int] | None = None, fail_unregister: bool = False) -> None:
        self.fail_register = fail_register or set()  # which calls fail, counted from 1
        self.fail_unregister = fail_unregister
        self.calls = 0
        self.registered: set[int] = set()
        self.last_error = 0

    def cudaHostRegister(self, addr: int, size: int, flags: int) -> int:
        self.calls += 1
        if self.calls in self.fail_register or addr in self.registered:
            self.last_error = 2 if addr not in self.registered else 712  # out of memory / already registered
            return self.last_error
        self.registered.add(addr)
        return 0

    def cudaHostUnregister(self, addr: int) -> int:
        if self.fail_unregister or addr not in self.registered:
            self.last_error = 713  # cudaErrorHostMemoryNotRegistered
            return self.last_error
        self.registered.discard(addr)
        return 0

    def cudaGetLastError(self) -> int:
        err, self.last_error = self.last_error, 0
        return err

    def cudaGetErrorString(self, err: int) -> str:
        return {2: "out of memory", 713: "not registered"}.get(err, "error")
