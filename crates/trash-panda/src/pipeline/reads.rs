//! How a pipeline reads its stages' weights into memory: through the page cache or past it.
//!
//! A buffered read costs the CPU a copy out of the page cache and the cache's own bookkeeping
//! (about 0.8 s of system time per GB on the 2-core bench machine, against 0.3 s for a direct
//! read, much of that the first touch of the destination's pages). While the next stage's
//! weights are read behind the running stage's compute, that time comes out of the compute.
//! It buys something only when the pages stay cached until they are read again; the pipeline
//! reads a stage again when the stages did not fit together, and then the page cache has no
//! room to keep them either, unless the budget leaves it that room. The rule is the disk tier's
//! ([`crate::engine_config::disk_mode`]), with the pipeline's budget for the plan's.

use std::fmt;

use crate::engine_config::DiskModeChoice;
use crate::io::ReadMode;

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
    let gb = |b: u64| b as f64 / 1e9;
    if let Some(mode) = choice.mode() {
        return LoadReads {
            mode,
            reason: format!("{} reads, as TRASH_PANDA_DISK_MODE says", mode.as_str()),
        };
    }
    let held = ram.min(files.saturating_sub(vram.unwrap_or(0)));
    let spare = ram - held;
    if files <= spare {
        LoadReads {
            mode: ReadMode::Buffered,
            reason: format!(
                "buffered reads: the stages' {:.2} GB of files stay in the page cache beside what \
                 the stages hold in RAM ({:.2} GB spare in the {:.2} GB budget)",
                gb(files),
                gb(spare),
                gb(ram)
            ),
        }
    } else {
        LoadReads {
            mode: ReadMode::Direct,
            reason: format!(
                "direct reads: the stages' {:.2} GB of files would not stay in the page cache \
                 ({:.2} GB spare in the {:.2} GB budget beside what the stages hold in RAM), so a copy \
                 through it would only take CPU from the running stage",
                gb(files),
                gb(spare),
                gb(ram)
            ),
        }
    }
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
