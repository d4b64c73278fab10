//! Counters for the profile report, per block and in total, reset per pass.

use super::SourceTier;
use crate::io::ReadStats;
use crate::profile::DepthPass;

/// What the engine did for one block since the last reset.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BlockStats {
    /// The block's name.
    pub name: String,
    /// The tier it streams from.
    pub tier: SourceTier,
    /// Times the block was staged (read into a staging buffer).
    pub stagings: u64,
    /// Tensor bytes staged (stagings times the block's tensor bytes).
    pub bytes: u64,
    /// Seconds workers spent staging the block.
    pub read_seconds: f64,
    /// Times the block was acquired.
    pub acquires: u64,
    /// Acquires that found the block already staged.
    pub hits: u64,
    /// Acquires that had to wait (`in_flight` of them found the read already started).
    pub misses: u64,
    /// Of `misses`, those that found the block's read already started.
    pub in_flight: u64,
    /// Seconds the acquiring thread waited for the block.
    pub wait_seconds: f64,
}

impl BlockStats {
    pub(crate) fn new(name: String, tier: SourceTier) -> Self {
        BlockStats {
            name,
            tier,
            stagings: 0,
            bytes: 0,
            read_seconds: 0.0,
            acquires: 0,
            hits: 0,
            misses: 0,
            in_flight: 0,
            wait_seconds: 0.0,
        }
    }

    fn reset(&mut self) {
        *self = BlockStats::new(std::mem::take(&mut self.name), self.tier);
    }
}

/// The engine's statistics since the last [`reset_stats`](super::Engine::reset_stats).
///
/// Totals are sums over `blocks`; `compute_waited_seconds` is the "compute waited for blocks"
/// figure of the profile, and `buffer_waits` its "worker waited for a free pinned buffer" line.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EngineStats {
    /// Per block, in the engine's block order.
    pub blocks: Vec<BlockStats>,
    /// Tensor bytes staged from the RAM tier and from the disk tier.
    pub ram_bytes: u64,
    /// Tensor bytes staged from the disk tier.
    pub disk_bytes: u64,
    /// Of `ram_bytes`, those read from the drive because their pages were not in memory (a
    /// mapped RAM tier's first pass), the blocks they came in, and the workers' seconds on them.
    pub ram_cold_bytes: u64,
    /// Blocks those cold bytes came in.
    pub ram_cold_blocks: u64,
    /// Worker seconds on the cold blocks, summed over workers.
    pub ram_cold_seconds: f64,
    /// Worker threads of the engine.
    pub workers: u64,
    /// Seconds workers spent staging (summed over workers, so it can exceed wall time).
    pub read_seconds: f64,
    /// Seconds acquiring threads waited for blocks.
    pub compute_waited_seconds: f64,
    /// Blocks acquired.
    pub acquires: u64,
    /// Acquires that found their block already staged.
    pub hits: u64,
    /// Acquires that had to wait for their block.
    pub misses: u64,
    /// Times a worker had a block to stage but no free staging buffer, and how long it waited.
    pub buffer_waits: u64,
    /// Seconds those workers waited, summed.
    pub buffer_wait_seconds: f64,
    /// Staged blocks whose buffer was taken for another block before they were acquired.
    pub reclaimed_unused: u64,
    /// Acquires of a block other than the one the run order says comes next.
    pub out_of_order: u64,
    /// Stagings that failed (the error went to the acquiring caller).
    pub failures: u64,
    /// The read of the RAM tier into memory (`RamSource::InMemory`, or any storage dtype), once
    /// loaded; its seconds include the conversion. Kept by resets, like the three below.
    pub ram_load: Option<ReadStats>,
    /// Tensors the load converted to the storage dtype.
    pub converted_tensors: u64,
    /// File bytes of those tensors minus what they take converted (per-row scales included).
    pub converted_bytes_saved: u64,
    /// Seconds of the load spent in the conversion kernels.
    pub convert_seconds: f64,
    /// The staging depth of each pass since the reset, where it may grow (see
    /// [`super::EngineOptions::max_lookahead`]); empty at a fixed depth.
    pub depth: Vec<DepthPass>,
}

impl EngineStats {
    pub(crate) fn new(blocks: Vec<BlockStats>) -> Self {
        EngineStats {
            blocks,
            ram_bytes: 0,
            disk_bytes: 0,
            ram_cold_bytes: 0,
            ram_cold_blocks: 0,
            ram_cold_seconds: 0.0,
            workers: 0,
            read_seconds: 0.0,
            compute_waited_seconds: 0.0,
            acquires: 0,
            hits: 0,
            misses: 0,
            buffer_waits: 0,
            buffer_wait_seconds: 0.0,
            reclaimed_unused: 0,
            out_of_order: 0,
            failures: 0,
            ram_load: None,
            converted_tensors: 0,
            converted_bytes_saved: 0,
            convert_seconds: 0.0,
            depth: Vec::new(),
        }
    }

    pub(crate) fn reset(&mut self) {
        for b in &mut self.blocks {
            b.reset();
        }
        *self = EngineStats {
            ram_load: self.ram_load,
            converted_tensors: self.converted_tensors,
            converted_bytes_saved: self.converted_bytes_saved,
            convert_seconds: self.convert_seconds,
            ..EngineStats::new(std::mem::take(&mut self.blocks))
        };
    }

    pub(crate) fn staged(&mut self, block: usize, bytes: u64, cold_bytes: u64, seconds: f64) {
        if cold_bytes > 0 {
            self.ram_cold_bytes += cold_bytes;
            self.ram_cold_blocks += 1;
            self.ram_cold_seconds += seconds;
        }
        let b = &mut self.blocks[block];
        b.stagings += 1;
        b.bytes += bytes;
        b.read_seconds += seconds;
        match b.tier {
            SourceTier::Ram => self.ram_bytes += bytes,
            SourceTier::Disk => self.disk_bytes += bytes,
        }
        self.read_seconds += seconds;
    }

    pub(crate) fn acquired(&mut self, block: usize, hit: bool, in_flight: bool, wait: f64) {
        let b = &mut self.blocks[block];
        b.acquires += 1;
        b.wait_seconds += wait;
        self.acquires += 1;
        self.compute_waited_seconds += wait;
        if hit {
            b.hits += 1;
            self.hits += 1;
        } else {
            b.misses += 1;
            self.misses += 1;
            b.in_flight += u64::from(in_flight);
        }
    }

    /// Tensor bytes staged from both tiers.
    pub fn bytes(&self) -> u64 {
        self.ram_bytes + self.disk_bytes
    }
}
