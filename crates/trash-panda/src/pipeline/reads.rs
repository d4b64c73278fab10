//! How a pipeline reads its stages' weights into memory: through the page cache or past it.
//!
//! A buffered read costs the CPU a copy out of the page cache and the cache's own bookkeeping
//! (about 0.8 s of system time per GB on the 2-core bench machine, against 0.3 s for a direct
//! read, much of that the first touch of the destination's pages). While the next stage's
//! weights are read behind the running stage's compute, that time comes out of the compute.
//! It buys something only when the pages stay cached until they are read again; the pipeline
//! reads a stage again when the stages did not fit together, and then the page cache has no
//! room to keep them either, unless the budget leaves it that room. The rule is the disk tier's
//! ([`crate::engine_config::disk_mode`]), with the pipeline's budget for the plan's; one model
//! loaded on its own ([`plan_reads`]) follows it with its plan's RAM and what the plan holds.

use std::fmt;

use super::{Holds, PipelineError};
use crate::engine_config::{DiskModeChoice, EngineConfig};
use crate::io::ReadMode;
use crate::plan::Plan;
use crate::units::format_bytes;

/// The read mode of a pipeline's loads, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadReads {
    /// How the loads read.
    pub mode: ReadMode,
    /// Why, in a sentence for the report.
    pub reason: String,
}

impl fmt::Display for LoadReads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

/// The mode for loading stages whose files hold `files` bytes together, in a pipeline allowed
/// `ram` bytes of RAM (and `vram` of device memory, on a GPU): buffered when the files fit in
/// the page cache beside everything the stages can hold in RAM (what of the files the device
/// memory cannot hold, at most the budget), else direct; a `choice` other than `auto` wins.
pub fn load_reads(choice: DiskModeChoice, files: u64, ram: u64, vram: Option<u64>) -> LoadReads {
    let held = ram.min(files.saturating_sub(vram.unwrap_or(0)));
    decide(choice, "the stages'", files, ram, held)
}

/// The mode for loading one model by `plan` (configured as `config`) from files of `files`
/// bytes, outside a pipeline: buffered when the files fit in the page cache beside what the
/// plan holds in RAM ([`Holds::of`]), within the RAM the plan may use (its usable RAM less the
/// free RAM it leaves); a `choice` other than `auto` wins. A model that fits twice over keeps
/// its file cached for the next load; one that does not would only push its own pages out.
pub fn plan_reads(
    choice: DiskModeChoice,
    files: u64,
    plan: &Plan,
    config: &EngineConfig,
) -> Result<LoadReads, PipelineError> {
    let budgets = plan
        .budgets
        .as_ref()
        .ok_or_else(|| PipelineError::Unresolved {
            stage: "model".to_string(),
        })?;
    let ram = budgets.usable_ram.saturating_sub(budgets.min_free_ram);
    let held = Holds::of("model", plan, config)?.ram.min(ram);
    Ok(decide(choice, "the model's", files, ram, held))
}

/// The rule: `files` bytes (of `whose` files) stay in the page cache only beside `held` bytes
/// in a `ram` budget.
fn decide(choice: DiskModeChoice, whose: &str, files: u64, ram: u64, held: u64) -> LoadReads {
    if let Some(mode) = choice.mode() {
        return LoadReads {
            mode,
            reason: format!("{} reads, as TRASH_PANDA_DISK_MODE says", mode.as_str()),
        };
    }
    let spare = ram.saturating_sub(held);
    let (mode, reason) = if files <= spare {
        (
            ReadMode::Buffered,
            format!(
                "buffered reads: {whose} {} of files stay in the page cache beside what is \
                 held in RAM ({} spare in the {} budget)",
                format_bytes(files),
                format_bytes(spare),
                format_bytes(ram)
            ),
        )
    } else {
        (
            ReadMode::Direct,
            format!(
                "direct reads: {whose} {} of files would not stay in the page cache ({} \
                 spare in the {} budget beside what is held in RAM), so a copy through it \
                 would only take CPU from the compute",
                format_bytes(files),
                format_bytes(spare),
                format_bytes(ram)
            ),
        )
    };
    LoadReads { mode, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_when_the_files_cannot_stay_cached_beside_the_stages() {
        // The bench's case: 4 GB of files, a 3 GB budget the stages fill.
        let r = load_reads(DiskModeChoice::Auto, 4_000_000_000, 3_000_000_000, None);
        assert_eq!(r.mode, ReadMode::Direct);
        assert!(r.reason.contains("4.00 GB"), "{}", r.reason);
        // The stages fit, but not twice over: their pages would be evicted by their own loads.
        let r = load_reads(DiskModeChoice::Auto, 4_000_000_000, 7_999_999_999, None);
        assert_eq!(r.mode, ReadMode::Direct);
        // On a GPU the stages hold in RAM what the device cannot: here 3 of the 4 GB.
        let r = load_reads(
            DiskModeChoice::Auto,
            4_000_000_000,
            6_999_999_999,
            Some(1_000_000_000),
        );
        assert_eq!(r.mode, ReadMode::Direct);
    }

    #[test]
    fn buffered_when_the_budget_holds_the_stages_and_their_files() {
        let r = load_reads(DiskModeChoice::Auto, 4_000_000_000, 8_000_000_000, None);
        assert_eq!(r.mode, ReadMode::Buffered);
        assert!(r.reason.contains("4.00 GB spare"), "{}", r.reason);
        // A GPU that holds every stage leaves the RAM to the page cache.
        let r = load_reads(
            DiskModeChoice::Auto,
            4_000_000_000,
            4_000_000_000,
            Some(8_000_000_000),
        );
        assert_eq!(r.mode, ReadMode::Buffered);
    }

    #[test]
    fn the_setting_wins() {
        let r = load_reads(DiskModeChoice::Buffered, 4_000_000_000, 1, None);
        assert_eq!(r.mode, ReadMode::Buffered);
        assert!(r.reason.contains("TRASH_PANDA_DISK_MODE"));
        let r = load_reads(DiskModeChoice::Direct, 1, u64::MAX, None);
        assert_eq!(r.mode, ReadMode::Direct);
    }
}
