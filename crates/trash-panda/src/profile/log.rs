//! One JSON object per stage for `TRASH_PANDA_LOG=run.jsonl`: the figures of the report in a form
//! that a comparison of two runs, or the visualization, can read back.

use serde::{Deserialize, Serialize};

use super::{DriveRate, EngineSummary, LoadSummary, MemoryPoint, PassStats, Profile, Tier};

/// Marks a line as ours in a log other tools may append to.
pub const LOG_FORMAT: &str = "trash-panda-profile";
/// Bumped when a field changes meaning or goes away; new fields do not bump it.
pub const LOG_VERSION: u32 = 1;

/// One block of the profiled stage, in the log: its name and the tier it was planned in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockInfo {
    /// The block's name.
    pub name: String,
    /// Its tier.
    pub tier: Tier,
}

/// The log line, as written and as read back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogLine {
    /// [`LOG_FORMAT`] in lines this crate writes.
    pub format: String,
    /// [`LOG_VERSION`] of the writer.
    pub version: u32,
    /// The stage's blocks, in profile order (the indices events use).
    pub blocks: Vec<BlockInfo>,
    /// One entry per pass through the blocks, in order.
    pub passes: Vec<PassStats>,
    /// What the load did, when it was recorded.
    pub load: Option<LoadSummary>,
    /// The prefetch engine's counters, when a block streamed.
    pub engine: Option<EngineSummary>,
    /// Memory readings, in the order they were taken.
    #[serde(default)]
    pub memory: Vec<MemoryPoint>,
    /// The drive's unbuffered read rate measured beside the run, when it could be.
    #[serde(default)]
    pub drive: Option<DriveRate>,
}

impl LogLine {
    /// Reads one line back. It checks the JSON's shape only: a caller that wants only this
    /// crate's lines compares `format` (and `version`) itself.
    pub fn parse(line: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(line)
    }
}

impl Profile {
    /// The profile's figures as a log line (see [`Profile::to_log_line`] for the text).
    pub fn to_log(&self) -> LogLine {
        LogLine {
            format: LOG_FORMAT.to_string(),
            version: LOG_VERSION,
            blocks: self
                .names
                .iter()
                .zip(&self.tiers)
                .map(|(name, &tier)| BlockInfo {
                    name: name.clone(),
                    tier,
                })
                .collect(),
            passes: self.passes(),
            load: self.load,
            engine: self.engine.clone(),
            memory: self.memory.clone(),
            drive: self.drive().copied(),
        }
    }

    /// The log line without its newline. Every number in it is finite (the profile refuses
    /// NaN and infinity), so it always serializes.
    pub fn to_log_line(&self) -> String {
        serde_json::to_string(&self.to_log()).unwrap_or_default()
    }
}
