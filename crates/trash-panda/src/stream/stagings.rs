//! The record of what each worker staged and when, for the profile's trace: the counters in
//! [`EngineStats`](super::EngineStats) say how much was read, this says when, so the reads can be
//! drawn next to the compute they overlap.

use std::collections::VecDeque;

use super::{Engine, SourceTier};

/// Stagings kept: the most recent ones. A server keeps its engine for days and a profile only
/// draws a stage's passes, so older entries are dropped rather than grown without end (4096 are
/// about 200 KB, and cover a few hundred passes of a model with ten streamed blocks).
pub const MAX_STAGINGS: usize = 4096;

/// Where a staging's bytes came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StagingSource {
    /// The disk tier, read from the checkpoint file.
    Disk,
    /// The RAM tier with its pages in memory: a memory copy.
    RamWarm,
    /// The RAM tier with pages read from the drive (a mapped RAM tier's first pass).
    RamCold,
}

impl StagingSource {
    pub(crate) fn of(tier: SourceTier, cold_bytes: u64) -> Self {
        match tier {
            SourceTier::Disk => StagingSource::Disk,
            SourceTier::Ram if cold_bytes > 0 => StagingSource::RamCold,
            SourceTier::Ram => StagingSource::RamWarm,
        }
    }

    /// The source's name in traces and logs: "disk", "ram_warm" or "ram_cold".
    pub fn name(self) -> &'static str {
        match self {
            StagingSource::Disk => "disk",
            StagingSource::RamWarm => "ram_warm",
            StagingSource::RamCold => "ram_cold",
        }
    }
}

/// One block a worker read into a staging buffer. `start` and `end` are
/// [`clock_seconds`](crate::profile::clock_seconds), the clock the Python hooks time runs with.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Staging {
    /// The block's index among the engine's streamed blocks.
    pub block: usize,
    /// Index of the worker thread (0-based, as in its name `tp-stage-N`).
    pub worker: usize,
    /// When the staging began, in seconds on that clock.
    pub start: f64,
    /// When the staging ended, in seconds on the same clock as `start`.
    pub end: f64,
    /// Tensor bytes staged.
    pub bytes: u64,
    /// Where the bytes came from.
    pub source: StagingSource,
}

/// The most recent [`MAX_STAGINGS`] stagings, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Stagings {
    ring: VecDeque<Staging>,
}

impl Stagings {
    pub fn push(&mut self, staging: Staging) {
        if self.ring.len() == MAX_STAGINGS {
            self.ring.pop_front();
        }
        self.ring.push_back(staging);
    }
}

impl Engine {
    /// The most recent stagings by the workers (at most [`MAX_STAGINGS`]), oldest first. Only
    /// successful ones; [`reset_stats`](Self::reset_stats) does not clear them, since they are a
    /// timeline a profile picks its span from, not counters of a pass.
    pub fn stagings(&self) -> Vec<Staging> {
        self.shared.lock().stagings.ring.iter().copied().collect()
    }
}
