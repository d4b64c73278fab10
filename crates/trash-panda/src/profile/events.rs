//! What the runtime hands to the profile: block runs, copies, the load, the engine's counters and
//! memory readings. Plain data with serde, so the binding can build them and the log can carry them.

use serde::{Deserialize, Serialize};

pub use crate::rules::Tier;

/// One run of one block, hook to hook, on the main thread. Times are seconds on one monotonic
/// clock chosen by the caller; only differences matter.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BlockRun {
    /// Index of the block in the profile's block list, from 0.
    pub block: usize,
    /// When the run began, in seconds on the caller's clock.
    pub start: f64,
    /// When it ended, in seconds on the same clock; not before `start`.
    pub end: f64,
    /// Part of the run spent waiting for the block's bytes to be staged by a worker.
    pub staged_wait: f64,
    /// Part of the run spent waiting for the copy to the device, after the staged wait.
    pub gpu_wait: f64,
    /// Bytes moved for this run, and the tier they came from (`Device`: nothing to move).
    pub bytes: u64,
    /// The tier the block's bytes came from (see `bytes`).
    pub tier: Tier,
    /// Bytes its expansions wrote in the compute dtype (fp8, int8 and GGML weights expanded,
    /// rows reordered), against `bytes` read: what streaming a compact form saves.
    #[serde(default)]
    pub expanded: u64,
}

impl BlockRun {
    /// The run's length in seconds, `end - start`.
    pub fn seconds(&self) -> f64 {
        self.end - self.start
    }

    /// Seconds the run waited for its bytes: the staged wait plus the device-copy wait.
    pub fn waited(&self) -> f64 {
        self.staged_wait + self.gpu_wait
    }

    /// What is left once both waits are taken out: launching work, one-time warm-up. Clamped,
    /// because the waits are measured on their own and can overshoot the run by clock jitter.
    pub fn rest(&self) -> f64 {
        (self.seconds() - self.waited()).max(0.0)
    }
}

/// One copy of a block by a worker (tier to staging buffer, or staging buffer to device). Optional:
/// the trace draws these on the copies track so the overlap with compute shows; without them the
/// track is absent and only the main thread's waits show the stalls.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CopyRun {
    /// Index of the block in the profile's block list, from 0.
    pub block: usize,
    /// When the copy began, in seconds on the caller's clock (the one block runs use).
    pub start: f64,
    /// When it ended, in seconds on the same clock.
    pub end: f64,
    /// Bytes copied.
    pub bytes: u64,
    /// The tier the bytes came from.
    pub tier: Tier,
    /// The engine worker that made the copy: the trace gives each worker a lane of its own.
    #[serde(default)]
    pub worker: Option<usize>,
    /// RAM-tier bytes read from the drive because their pages were not in memory.
    #[serde(default)]
    pub cold: bool,
}

/// One block's copy to the device, timed by the device itself (its copy engine's seconds).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DeviceCopy {
    /// The start of the block run it served, in the caller's clock (it places the copy in a pass).
    pub at: f64,
    /// Bytes copied.
    pub bytes: u64,
    /// Seconds the copy took on the device.
    pub seconds: f64,
}

/// Bytes loaded into one tier by `stream_load`, and how long that took.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct TierLoad {
    /// Bytes loaded into the tier.
    pub bytes: u64,
    /// Wall-clock seconds the tier's load took.
    pub seconds: f64,
}

/// The read of the RAM tier into private memory (`TRASH_PANDA_RAM_IN_MEMORY`, or a storage dtype,
/// which converts it on the way in).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RamRead {
    /// Bytes read from the checkpoint.
    pub bytes: u64,
    /// Wall-clock seconds the read (and conversion) took.
    pub seconds: f64,
    /// Threads that read at once.
    pub threads: u32,
    /// The storage dtype it was converted to; `None`: kept as stored.
    #[serde(default)]
    pub storage: Option<crate::DType>,
}

/// What `stream_load` did, by tier.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct LoadSummary {
    /// Wall-clock seconds of the whole load.
    pub seconds: f64,
    /// The device tier's load.
    pub device: TierLoad,
    /// The RAM tier's load.
    pub ram: TierLoad,
    /// The disk tier's "load" (its blocks are only described, not read, at load).
    pub disk: TierLoad,
    /// The read into private memory, when the RAM tier was read rather than mapped.
    pub ram_in_memory: Option<RamRead>,
    /// With `stage(overlap=True)`: the resident blocks' loader thread.
    #[serde(default)]
    pub loader: Option<LoaderRun>,
}

/// The loader thread of `stage(overlap=True)`: what it read, how long it took, and how long the
/// model's blocks waited for it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LoaderRun {
    /// Resident blocks the thread loaded.
    pub blocks: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Wall-clock seconds the thread ran.
    pub seconds: f64,
    /// Seconds the model's blocks waited for it, summed.
    pub waited_seconds: f64,
}

/// The prefetch engine's counters over the profiled stage. Its own struct, filled by the caller
/// from the engine's stats, so the profile does not follow every change of the engine.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct EngineSummary {
    /// Times a worker had a block to stage but no free staging buffer.
    pub buffer_waits: u64,
    /// Seconds those workers waited, summed.
    pub buffer_wait_seconds: f64,
    /// Acquires that found their block already staged.
    pub hits: u64,
    /// Acquires that had to wait for their block.
    pub misses: u64,
    /// Staged blocks whose buffer was taken for another block before they were acquired.
    pub reclaimed_unused: u64,
    /// Acquires of a block other than the one the run order said came next.
    pub out_of_order: u64,
    /// RAM-tier bytes read from the drive because their pages were not in memory (a mapped RAM
    /// tier's first pass), the blocks, and the workers' seconds on them (summed over workers).
    #[serde(default)]
    pub ram_cold_bytes: u64,
    /// Blocks those cold bytes came in (see `ram_cold_bytes`).
    #[serde(default)]
    pub ram_cold_blocks: u64,
    /// Worker seconds spent on them, summed over workers (see `ram_cold_bytes`).
    #[serde(default)]
    pub ram_cold_seconds: f64,
    /// Workers reading at once (the cold rate's wall-clock estimate divides by them).
    #[serde(default)]
    pub workers: u64,
    /// The staging depth of each pass, where it may grow (`TRASH_PANDA_MAX_LOOKAHEAD` above the
    /// look-ahead); empty at a fixed depth.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depth: Vec<DepthPass>,
}

/// The staging depth one pass ran at (blocks staged ahead of the one that runs), as the engine
/// counts passes: a pass starts where a block comes no later in the run order than the one
/// before it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct DepthPass {
    /// 0-based; the report prints it 1-based.
    pub pass: usize,
    /// The least and the most blocks staged ahead over the pass's blocks.
    pub min: usize,
    /// The most blocks staged ahead over the pass's blocks (see `min`).
    pub max: usize,
    /// Why the depth before a block changed during the pass.
    pub changes: Vec<DepthChange>,
}

/// The depth before one block changed: it grew because the block's acquire waited for its
/// staging (`waited_seconds`), or shrank after `calm_passes` passes without such a wait.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct DepthChange {
    /// The block before which the depth changed.
    pub block: String,
    /// The depth before the change, in blocks staged ahead.
    pub from: usize,
    /// The depth after it.
    pub to: usize,
    /// For a growth: seconds the block's acquire waited; 0 for a shrink.
    #[serde(default)]
    pub waited_seconds: f64,
    /// For a shrink: passes in a row without a wait; 0 for a growth.
    #[serde(default)]
    pub calm_passes: u32,
}

impl DepthChange {
    /// The change in words, for the profile report.
    pub fn reason(&self) -> String {
        if self.to > self.from {
            format!(
                "grew to {} before {} after a {:.2} s wait",
                self.to, self.block, self.waited_seconds
            )
        } else {
            format!(
                "shrank to {} before {}: no waits for {} passes",
                self.to, self.block, self.calm_passes
            )
        }
    }
}

/// A CPU tensor still alive at a memory point.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LargeTensor {
    /// What holds it (a module path, a variable), as the scan found it.
    pub name: String,
    /// The tensor's bytes.
    pub bytes: u64,
}

/// A memory reading taken by `release()`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryPoint {
    /// Where in the caller's run the reading was taken, as the caller names it.
    pub label: String,
    /// RAM the machine has free, and the process's working set (resident set).
    pub free_ram: u64,
    /// The process's resident set, in bytes (see `free_ram`).
    pub rss: u64,
    /// The process's private memory (RssAnon on Linux, private bytes on Windows).
    #[serde(default)]
    pub private: u64,
    /// CPU tensors of 1 MB or more that are still alive.
    pub large_tensors: Vec<LargeTensor>,
}
