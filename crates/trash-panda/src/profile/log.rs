//! One JSON object per stage for `TRASH_PANDA_LOG=run.jsonl`: the figures of the report in a form
//! that a comparison of two runs, or the visualization, can read back.

use serde::{Deserialize, Serialize};

use super::{DriveRate, EngineSummary, LoadSummary, MemoryPoint, PassStats, Profile, Tier};

/// Marks a line as ours in a log other tools may append to.
pub const LOG_FORMAT: &str = "trash-panda-profile";
/// Bumped when a field changes meaning or goes away; new fields do not bump it.
pub const LOG_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockInfo {
    pub name: String,
    pub tier: Tier,
}

/// The log line, as written and as read back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogLine {
    pub format: String,
    pub version: u32,
    pub blocks: Vec<BlockInfo>,
    pub passes: Vec<PassStats>,
    pub load: Option<LoadSummary>,
    pub engine: Option<EngineSummary>,
    #[serde(default)]
    pub memory: Vec<MemoryPoint>,
    /// The drive's unbuffered read rate measured beside the run, when it could be.
    #[serde(default)]
    pub drive: Option<DriveRate>,
}

impl LogLine {
    pub fn parse(line: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(line)
    }
}

impl Profile {
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
