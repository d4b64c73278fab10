"""The report stream_load returns: what went where, how many bytes, how long."""

from __future__ import annotations

from dataclasses import dataclass, field


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


@dataclass
class TierLoad:
    blocks: int = 0
    tensors: int = 0
    bytes: int = 0
    seconds: float = 0.0


@dataclass
class LoadReport:
    """Bytes and seconds of a load, per tier. ``str(report)`` is a short table."""

    checkpoint: str
    device: str
    compute_dtype: str
    seconds: float = 0.0
    outside: TierLoad = field(default_factory=TierLoad)
    device_tier: TierLoad = field(default_factory=TierLoad)
    ram: TierLoad = field(default_factory=TierLoad)
    disk: TierLoad = field(default_factory=TierLoad)
    ram_source: str = "mapped"
    disk_mode: str | None = None
    disk_mode_reason: str = ""
    staging_bytes: int = 0
    mapped_bytes: int = 0  # embedding tables left in the checkpoint's map (within outside/device)
    kept_buffers: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"stream_load {self.checkpoint} -> {self.device} ({self.compute_dtype}) in {self.seconds:.2f} s"]
        rows = (
            ("outside", self.outside, "read to the device"),
            ("device", self.device_tier, "read to the device, stored dtype"),
            ("ram", self.ram, f"{self.ram_source}, staged before each run"),
            ("disk", self.disk, f"read before each run ({self.disk_mode or '-'})"),
        )
        for name, t, how in rows:
            speed = f", {t.bytes / t.seconds / 1e9:.2f} GB/s" if t.seconds > 0 else ""
            count = f"{t.blocks} blocks" if name != "outside" else f"{t.tensors} tensors"
            lines.append(f"  {name:<8}{count:>12}  {_gb(t.bytes):>10}  {t.seconds:6.2f} s{speed}  {how}")
        if self.mapped_bytes:
            lines.append(f"  embedding tables {_gb(self.mapped_bytes)} mapped, rows read as looked up")
        if self.staging_bytes:
            lines.append(f"  staging pool {_gb(self.staging_bytes)}")
        if self.disk_mode_reason:
            lines.append(f"  disk tier: {self.disk_mode_reason}")
        if self.kept_buffers:
            lines.append(
                f"  buffers not in the checkpoint, kept from construction: {', '.join(self.kept_buffers[:6])}"
                + (" ..." if len(self.kept_buffers) > 6 else "")
            )
        if self.unexpected:
            lines.append(
                f"  {len(self.unexpected)} checkpoint tensors the model has no place for: "
                + ", ".join(self.unexpected[:6])
                + (" ..." if len(self.unexpected) > 6 else "")
            )
        return "\n".join(lines)
