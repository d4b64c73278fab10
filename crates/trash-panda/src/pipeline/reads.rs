//! How a pipeline reads its stages' weights into memory: through the page cache or past it.
//!
//! The two ways cost the compute beside them differently. A buffered read costs the CPU a copy
//! out of the page cache and the cache's own bookkeeping; a direct read lands in the
//! destination with no copy. Beside a model's compute (a stage read ahead, or the later blocks
//! of a stage that has started), measured on the 2-core bench machines, a buffered read took
//! 0.56 to 1.1 s of compute per GB, a direct one into fresh pages 0.36 to 0.83 s, and a read
//! with nothing computing beside it is no faster buffered. The buffered read buys one thing:
//! the pages stay cached, and a second load of the same files reads them at memory speed. So
//! the rule asks whether anything reads the files again while they can stay cached: a
//! pipeline whose stages stay loaded together reads each once, and pays the copy for nothing;
//! one whose stages are read again each run (they do not fit together, or `keep=False`) gains,
//! when the page cache has room for them beside what the stages hold. A model loaded on its
//! own ([`plan_reads`]) is read again by the next load of it (`stage()` releases the model at
//! its end), so it keeps its files cached where they fit beside what its plan holds. The
//! disk tier, read every pass, follows [`crate::engine_config::disk_mode`].

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
/// `ram` bytes of RAM (and `vram` of device memory, on a GPU), that keeps its stages loaded
/// between runs where they fit (`keep`). Buffered only when the files fit in the page cache
/// beside everything the stages can hold in RAM (what of the files the device memory cannot
/// hold, at most the budget) and the stages are read again: with that much room and `keep`,
/// every stage stays loaded and each file is read once, so direct. A `choice` other than
/// `auto` wins.
pub fn load_reads(
    choice: DiskModeChoice,
    files: u64,
    ram: u64,
    vram: Option<u64>,
    keep: bool,
) -> LoadReads {
    let held = ram.min(files.saturating_sub(vram.unwrap_or(0)));
    let once = keep.then_some("the stages fit together, so each stays loaded and is read once");
    decide(choice, "the stages'", files, ram, held, once)
}

/// The mode for loading one model by `plan` (configured as `config`) from files of `files`
/// bytes, outside a pipeline, whose files a later load in this process reads again
/// (`read_again`: `stage()` releases the model at its end; a model loaded and kept reads them
/// once). Buffered when they are read again and fit in the page cache beside what the plan
/// holds in RAM ([`Holds::of`]), within the RAM the plan may use (its usable RAM less the free
/// RAM it leaves); else direct; a `choice` other than `auto` wins.
pub fn plan_reads(
    choice: DiskModeChoice,
    files: u64,
    plan: &Plan,
    config: &EngineConfig,
    read_again: bool,
) -> Result<LoadReads, PipelineError> {
    let budgets = plan
        .budgets
        .as_ref()
        .ok_or_else(|| PipelineError::Unresolved {
            stage: "model".to_string(),
        })?;
    let ram = budgets.usable_ram.saturating_sub(budgets.min_free_ram);
    let held = Holds::of("model", plan, config)?.ram.min(ram);
    let once = (!read_again).then_some("the model stays loaded and reads them once");
    Ok(decide(choice, "the model's", files, ram, held, once))
}

/// The rule: `files` bytes (of `whose` files) stay in the page cache only beside `held` bytes
/// in a `ram` budget, and are worth keeping there only when read again: `once` says why they
/// are not (None: they are).
fn decide(
    choice: DiskModeChoice,
    whose: &str,
    files: u64,
    ram: u64,
    held: u64,
    once: Option<&str>,
) -> LoadReads {
    if let Some(mode) = choice.mode() {
        return LoadReads {
            mode,
            reason: format!("{} reads, as TRASH_PANDA_DISK_MODE says", mode.as_str()),
        };
    }
    let spare = ram.saturating_sub(held);
    let (mode, reason) = if let (true, Some(why)) = (files <= spare, once) {
        (
            ReadMode::Direct,
            format!(
                "direct reads: {whose} {} of files would stay in the page cache ({} spare in \
                 the {} budget), but {why}; a copy through it would only take CPU from the \
                 compute beside the reads",
                format_bytes(files),
                format_bytes(spare),
                format_bytes(ram)
            ),
        )
    } else if files <= spare {
        (
            ReadMode::Buffered,
            format!(
                "buffered reads: {whose} {} of files stay in the page cache for their next load, \
                 beside what is held in RAM ({} spare in the {} budget)",
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
        let r = load_reads(
            DiskModeChoice::Auto,
            4_000_000_000,
            3_000_000_000,
            None,
            true,
        );
        assert_eq!(r.mode, ReadMode::Direct);
        assert!(r.reason.contains("4.00 GB"), "{}", r.reason);
        // Read again each run, but not fitting twice over: their pages would be evicted by
        // their own loads.
        let r = load_reads(
            DiskModeChoice::Auto,
            4_000_000_000,
            7_999_999_999,
            None,
            false,
        );
        assert_eq!(r.mode, ReadMode::Direct);
        // On a GPU the stages hold in RAM what the device cannot: here 3 of the 4 GB.
        let r = load_reads(
            DiskModeChoice::Auto,
            4_000_000_000,
            6_999_999_999,
            Some(1_000_000_000),
            false,
        );
        assert_eq!(r.mode, ReadMode::Direct);
    }

    #[test]
    fn direct_when_every_stage_stays_loaded() {
        // Room for the files twice over, but the stages stay loaded: each file is read once.
        let r = load_reads(
            DiskModeChoice::Auto,
            4_000_000_000,
            20_000_000_000,
            None,
            true,
        );
        assert_eq!(r.mode, ReadMode::Direct);
        assert!(r.reason.contains("read once"), "{}", r.reason);
        // The same stages, let go after each turn: read again every run, and cached.
        let r = load_reads(
            DiskModeChoice::Auto,
            4_000_000_000,
            20_000_000_000,
            None,
            false,
        );
        assert_eq!(r.mode, ReadMode::Buffered);
        assert!(r.reason.contains("next load"), "{}", r.reason);
        // The device holds a quarter; RAM holds the rest and the files: still read once.
        let r = load_reads(
            DiskModeChoice::Auto,
            4_000_000_000,
            8_000_000_000,
            Some(1_000_000_000),
            true,
        );
        assert_eq!(r.mode, ReadMode::Direct);
        assert!(r.reason.contains("read once"), "{}", r.reason);
    }

    #[test]
    fn buffered_when_the_budget_holds_the_stages_and_their_files() {
        let r = load_reads(
            DiskModeChoice::Auto,
            4_000_000_000,
            8_000_000_000,
            None,
            false,
        );
        assert_eq!(r.mode, ReadMode::Buffered);
        assert!(r.reason.contains("4.00 GB spare"), "{}", r.reason);
        // A GPU that holds every stage leaves the RAM to the page cache.
        let r = load_reads(
            DiskModeChoice::Auto,
            4_000_000_000,
            4_000_000_000,
            Some(8_000_000_000),
            false,
        );
        assert_eq!(r.mode, ReadMode::Buffered);
    }

    #[test]
    fn the_setting_wins() {
        let r = load_reads(DiskModeChoice::Buffered, 4_000_000_000, 1, None, true);
        assert_eq!(r.mode, ReadMode::Buffered);
        assert!(r.reason.contains("TRASH_PANDA_DISK_MODE"));
        let r = load_reads(DiskModeChoice::Direct, 1, u64::MAX, None, false);
        assert_eq!(r.mode, ReadMode::Direct);
        let r = load_reads(DiskModeChoice::Buffered, 1, u64::MAX, None, true);
        assert_eq!(r.mode, ReadMode::Buffered);
    }
}
