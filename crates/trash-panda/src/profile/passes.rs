//! Per-pass statistics: one pass is one run through the blocks.

use serde::{Deserialize, Serialize};

use super::{BlockRun, Tier};

/// What one pass cost and moved.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PassStats {
    /// 0-based; the report prints it 1-based.
    pub index: usize,
    /// From the first run's start to the last run's end, in the caller's clock.
    pub start: f64,
    /// The pass's wall-clock length in seconds (see `start`).
    pub seconds: f64,
    /// Seconds the main thread waited for blocks (staged and gpu waits together).
    pub waited_seconds: f64,
    /// Of `waited_seconds`, those spent waiting for blocks to be staged.
    pub staged_seconds: f64,
    /// Of `waited_seconds`, those spent waiting for copies to the device.
    pub gpu_seconds: f64,
    /// Bytes moved from each tier during the pass, and their rate over the pass's time. The rate
    /// is what the pass sustained, not the drive's speed: it only nears the drive's speed when the
    /// pass is waiting for its reads.
    pub ram_bytes: u64,
    /// `ram_bytes` over the pass's seconds, in GB/s (10^9 bytes).
    pub ram_gbps: f64,
    /// Bytes moved from the disk tier during the pass.
    pub disk_bytes: u64,
    /// `disk_bytes` over the pass's seconds, in GB/s (10^9 bytes).
    pub disk_gbps: f64,
    /// Block runs in the pass.
    pub blocks: usize,
    /// Bytes the pass's expansions wrote in the compute dtype (see [`BlockRun::expanded`]).
    #[serde(default)]
    pub expanded_bytes: u64,
}

impl PassStats {
    pub(crate) fn from_runs(index: usize, runs: &[BlockRun]) -> Self {
        let start = runs.iter().map(|r| r.start).fold(f64::INFINITY, f64::min);
        let end = runs.iter().map(|r| r.end).fold(f64::NEG_INFINITY, f64::max);
        let seconds = if runs.is_empty() { 0.0 } else { end - start };
        let bytes_from = |tier| {
            runs.iter()
                .filter(|r| r.tier == tier)
                .map(|r| r.bytes)
                .sum::<u64>()
        };
        let (ram_bytes, disk_bytes) = (bytes_from(Tier::Ram), bytes_from(Tier::Disk));
        let staged_seconds = runs.iter().map(|r| r.staged_wait).sum::<f64>();
        let gpu_seconds = runs.iter().map(|r| r.gpu_wait).sum::<f64>();
        PassStats {
            index,
            start: if runs.is_empty() { 0.0 } else { start },
            seconds,
            waited_seconds: staged_seconds + gpu_seconds,
            staged_seconds,
            gpu_seconds,
            ram_bytes,
            ram_gbps: gbps(ram_bytes, seconds),
            disk_bytes,
            disk_gbps: gbps(disk_bytes, seconds),
            blocks: runs.len(),
            expanded_bytes: runs.iter().map(|r| r.expanded).sum(),
        }
    }

    /// Share of the pass the main thread spent waiting, in percent (0 for an empty pass).
    pub fn waited_percent(&self) -> f64 {
        if self.seconds > 0.0 {
            100.0 * self.waited_seconds / self.seconds
        } else {
            0.0
        }
    }
}

/// Gigabytes (1e9) per second; 0 when no time passed, so a log line never holds NaN or inf.
pub(crate) fn gbps(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 / 1e9 / seconds
    } else {
        0.0
    }
}
