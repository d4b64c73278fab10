"""The loader's copies to a device with memory of its own (``stage(overlap=True)``, a pipeline's
stage read ahead): what a loader thread reads goes to the device on a copy stream of its own,
behind nothing the running model queued, while that model computes.

- **Its own stream.** The copies go on the stream of a side device (:meth:`Device.side`): not the
  thread's current stream, the default one, where each copy would wait for every kernel the main
  thread had queued and the kernels queued after it would wait for the copy.
- **From pinned memory.** The loader reads into :class:`HostRing`, host memory registered as
  pinned once, in two halves used in turn: a group is read into one half while the copies out of
  the other run, and a half is read into again only once the copies out of it have landed. A
  copy from pageable memory (a tensor converted on the host, a group larger than a half, pinning
  declined) holds the loader's thread until it is done, never the compute.
- **Memory no queued work reads.** Where the device has room outside the allocator's caches, the
  destination is allocated on the loader's stream, whose pool holds only what loaders allocated
  (and stages freed once the streams that read it were done): its copies wait for nothing. Where
  it has not, the memory must come from the pool of the thread's current stream (the default
  one), where a stage's freed blocks and activations wait: it may be handed out while that
  stream's kernels still read it, so the copies wait for an event recorded there after the
  allocation, and so for the work queued on it by then. Every copy records its stream on its
  destination, so a stage released before its turn does not hand memory a copy still writes to
  the next allocation.
- **An event per block.** Each block (and each group of outside weights) has the event of its
  last copy; the block's first compute waits for it on its own stream (:meth:`LoaderCopies.waits`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ... import _core

if TYPE_CHECKING:
    import torch

    from .copies import Device

__all__ = ["HostRing", "LoaderCopies"]

PAGE = _core.DIRECT_ALIGN
# A direct read lands in a tensor whose first byte sits at the same place in its page as in
# the file (HostRing.take), so a half has room for that shift per tensor. The plan counts the
# ring as the core's figures make it (budgets.loader_ring).
SLACK = _core.LOADER_RING_SLACK
FALLBACK = "the loader copies from pageable memory, which holds its thread until each copy is done"
# Room left on the device beside a group allocated on the loader's stream: the allocator's
# segments round up (to 2 MiB, or 20 MiB for large ones) and the running model allocates too.
ROOM = 64 << 20


class HostRing:
    """Pinned host memory in two halves of ``half`` bytes (see the module)."""

    def __init__(self, device: Device, half: int) -> None:
        import torch

        self.device = device
        self.half = half + SLACK
        size = 2 * self.half
        # Page-aligned, as registration wants: a page more, and a view from the first boundary.
        raw = torch.empty(size + PAGE, dtype=torch.uint8)
        at = -raw.data_ptr() % PAGE
        self.raw = raw[at : at + size]
        self.registration = device.pin(self.raw, [(self.raw.data_ptr(), size)], FALLBACK)
        self.turn = 1
        self.cursor = 0
        self.copies: list[Any] = [None, None]  # per half: the last copy out of it

    @property
    def pinned(self) -> bool:
        return self.registration is not None

    def begin(self, nbytes: int) -> bool:
        """Starts a group of ``nbytes``: the other half, once the copies out of it have landed.
        False when the group cannot go through the ring (too large, or not pinned)."""
        if not self.pinned or nbytes + SLACK > self.half:
            return False
        self.turn ^= 1
        self.cursor = 0
        last, self.copies[self.turn] = self.copies[self.turn], None
        if last is not None:
            self.device.wait(last)
        return True

    def take(self, shape: tuple[int, ...], dtype: torch.dtype, nbytes: int, offset: int | None) -> torch.Tensor | None:
        """An uninitialised tensor in the half under way, its first byte at the same place in its
        page as in the file, so a direct read lands in it with no bounce (None when the half has
        no room left). It is only a copy's source, never computed on, so torch's alignment does
        not matter here."""
        shift = 0 if offset is None or offset % dtype.itemsize else offset % PAGE
        at = -(-self.cursor // PAGE) * PAGE + shift
        if at + nbytes > self.half:
            return None
        self.cursor = at + nbytes
        base = self.turn * self.half + at
        return self.raw[base : base + nbytes].view(dtype).reshape(shape)

    def copied(self, event: Any) -> None:
        """A copy out of the half under way was queued; ``event`` happens when it is done."""
        self.copies[self.turn] = event

    def holds(self, t: torch.Tensor) -> bool:
        start = self.raw.data_ptr()
        return start <= t.data_ptr() < start + self.raw.numel()

    def close(self) -> None:
        for event in self.copies:
            if event is not None:
                self.device.wait(event)
        if self.registration is not None:
            self.registration.close()
            self.registration = None


class LoaderCopies:
    """One loader's copies (see the module). Used by the loader's thread alone, but for
    :meth:`waits`, which the compute thread calls once the loader said the block is in."""

    def __init__(self, device: Device, ring_half: int) -> None:
        self.device = device.side()
        self.ring_half = ring_half
        self.ring: HostRing | None = None
        self.events: dict[tuple[str, int], Any] = {}  # ("block", index) / ("outside", position)
        self.last: Any = None

    def group(self, nbytes: int) -> HostRing | None:
        """Starts reading a group of ``nbytes``: the ring half to read it into, or None (read it
        into pageable memory of its own)."""
        if self.ring is None:
            self.ring = HostRing(self.device, self.ring_half)
        return self.ring if self.ring.begin(nbytes) else None

    def put(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Device copies of host tensors, queued on the loader's stream; returned at once."""
        import torch

        sizes = [t.numel() * t.element_size() for t in tensors]
        after = None
        if self.device.free_memory() >= sum(sizes) + ROOM:
            raw = [self.device.empty_on_copy_stream(n) for n in sizes]
        else:
            raw = [self.device.empty(n) for n in sizes]
            # After the allocations: what their stream queued before may still read that memory.
            after = self.device.compute_done()
        out = [r.view(t.dtype).reshape(t.shape) for r, t in zip(raw, tensors, strict=True)]
        for dst, src in zip(out, tensors, strict=True):
            if src.numel() == 0:
                continue
            copied = self.device.copy(dst.reshape(-1).view(torch.uint8), src.reshape(-1).view(torch.uint8), after)
            self.last = copied
            if self.ring is not None and self.ring.holds(src):
                self.ring.copied(copied)
        return out

    def done(self, key: tuple[str, int]) -> None:
        """Everything of ``key`` was queued: its first compute waits for the last copy."""
        self.events[key] = self.last

    def waits(self, key: tuple[str, int]) -> None:
        """The current stream waits for ``key``'s copies (nothing for what was not copied)."""
        event = self.events.get(key)
        if event is not None:
            self.device.compute_waits(event)

    def finish(self) -> None:
        """Waits (on the loader's thread) for the last copy, and lets the ring go."""
        if self.last is not None:
            self.device.wait(self.last)
        if self.ring is not None:
            self.ring.close()
            self.ring = None
