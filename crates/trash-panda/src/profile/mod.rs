//! Timing of a streamed stage: the runtime records every block run, the profile splits them into
//! passes and turns them into the text report of `TRASH_PANDA_PROFILE=1`, a Chrome trace-event file
//! (chrome://tracing, Perfetto) and one JSON line for `TRASH_PANDA_LOG`.
//!
//! The profile keeps events, not running totals: a stage has at most a few thousand block runs, and
//! keeping them lets the report, the trace and the log be built from the same data at the end.

mod clock;
mod error;
mod events;
mod load;
mod log;
mod passes;
mod report;
mod trace;

pub use crate::io::DriveRate;
pub use clock::clock_seconds;
pub use error::ProfileError;
pub use events::{
    BlockRun, CopyRun, DepthChange, DepthPass, DeviceCopy, EngineSummary, LargeTensor, LoadSummary,
    LoaderRun, MemoryPoint, RamRead, Tier, TierLoad,
};
pub use load::{LoadReport, LoadedTier};
pub use log::{BlockInfo, LogLine, LOG_FORMAT, LOG_VERSION};
pub use passes::PassStats;

/// The events of one stage. Plain data, so it is `Send` and can sit behind the binding's lock.
#[derive(Debug, Clone)]
pub struct Profile {
    names: Vec<String>,
    tiers: Vec<Tier>,
    /// Closed passes, then the one being recorded.
    passes: Vec<Vec<BlockRun>>,
    current: Vec<BlockRun>,
    /// Which blocks already ran in `current`: a block running again starts the next pass.
    seen: Vec<bool>,
    copies: Vec<CopyRun>,
    device_copies: Vec<DeviceCopy>,
    /// The pinned host-to-device bandwidth measured for this run, bytes per second.
    link: Option<f64>,
    /// The drive's unbuffered read rate, measured beside the run: the reference for read rates.
    drive: Option<DriveRate>,
    load: Option<LoadSummary>,
    engine: Option<EngineSummary>,
    memory: Vec<MemoryPoint>,
}

impl Profile {
    /// A profile for a model with these blocks, in model order, and the tier each is planned in.
    pub fn new(block_names: Vec<String>, tiers: Vec<Tier>) -> Result<Self, ProfileError> {
        if block_names.len() != tiers.len() {
            return Err(ProfileError::LengthMismatch {
                names: block_names.len(),
                tiers: tiers.len(),
            });
        }
        Ok(Profile {
            seen: vec![false; block_names.len()],
            names: block_names,
            tiers,
            passes: Vec::new(),
            current: Vec::new(),
            copies: Vec::new(),
            device_copies: Vec::new(),
            link: None,
            drive: None,
            load: None,
            engine: None,
            memory: Vec::new(),
        })
    }

    /// The block names the profile was created with; events index into them.
    pub fn block_names(&self) -> &[String] {
        &self.names
    }

    /// The tier of each block, in the order of [`block_names`](Self::block_names).
    pub fn block_tiers(&self) -> &[Tier] {
        &self.tiers
    }

    /// Records one block run. A block that already ran in the current pass closes it first.
    pub fn record(&mut self, run: BlockRun) -> Result<(), ProfileError> {
        self.check_span(run.block, "run", run.start, run.end)?;
        let what = || format!("block {} ({}) run", run.block, self.names[run.block]);
        check_seconds(what, "staged_wait", run.staged_wait)?;
        check_seconds(what, "gpu_wait", run.gpu_wait)?;
        if self.seen[run.block] {
            self.end_pass();
        }
        self.seen[run.block] = true;
        self.current.push(run);
        Ok(())
    }

    /// Records one copy by a worker, for the trace's copies track.
    pub fn record_copy(&mut self, copy: CopyRun) -> Result<(), ProfileError> {
        self.check_span(copy.block, "copy", copy.start, copy.end)?;
        self.copies.push(copy);
        Ok(())
    }

    /// Records a block's copy to the device as the device timed it.
    pub fn record_device_copy(&mut self, copy: DeviceCopy) -> Result<(), ProfileError> {
        check_seconds(|| "device copy".to_string(), "seconds", copy.seconds)?;
        self.device_copies.push(copy);
        Ok(())
    }

    /// The pinned host-to-device bandwidth measured beside the run (bytes per second): each
    /// pass's copy rate is reported as a share of it.
    pub fn set_link(&mut self, bytes_per_second: f64) -> Result<(), ProfileError> {
        check_seconds(|| "link".to_string(), "bytes_per_second", bytes_per_second)?;
        self.link = Some(bytes_per_second);
        Ok(())
    }

    /// Bytes copied to the device and the copy engine's seconds for them, over `from..=to`.
    pub(crate) fn device_copied(&self, from: f64, to: f64) -> (u64, f64) {
        self.device_copies
            .iter()
            .filter(|c| c.at >= from && c.at <= to)
            .fold((0, 0.0), |(b, s), c| (b + c.bytes, s + c.seconds))
    }

    pub(crate) fn link(&self) -> Option<f64> {
        self.link
    }

    /// The drive's own read rate measured beside the run ([`crate::io::measure_drive`]): the
    /// report puts the load's and the first pass's read rates next to it.
    pub fn set_drive(&mut self, drive: DriveRate) -> Result<(), ProfileError> {
        check_seconds(|| "drive".to_string(), "seconds", drive.seconds)?;
        self.drive = Some(drive);
        Ok(())
    }

    pub(crate) fn drive(&self) -> Option<&DriveRate> {
        self.drive
            .as_ref()
            .filter(|d| d.bytes > 0 && d.seconds > 0.0)
    }

    /// Closes the current pass (a stage that runs a subset of the blocks, or the end of a step).
    /// Does nothing when no block ran since the last pass ended.
    pub fn end_pass(&mut self) {
        if !self.current.is_empty() {
            self.passes.push(std::mem::take(&mut self.current));
            self.seen.fill(false);
        }
    }

    /// Records what the load did, replacing an earlier record.
    ///
    /// # Errors
    ///
    /// [`ProfileError::BadSeconds`] when the load's, a tier's or the RAM read's seconds are
    /// negative or not finite; the profile is then left as it was.
    pub fn set_load(&mut self, load: LoadSummary) -> Result<(), ProfileError> {
        let what = || "stream_load".to_string();
        check_seconds(what, "seconds", load.seconds)?;
        for (field, tier) in [
            ("device.seconds", load.device),
            ("ram.seconds", load.ram),
            ("disk.seconds", load.disk),
        ] {
            check_seconds(what, field, tier.seconds)?;
        }
        if let Some(read) = load.ram_in_memory {
            check_seconds(what, "ram_in_memory.seconds", read.seconds)?;
        }
        self.load = Some(load);
        Ok(())
    }

    /// Records the engine's counters, replacing an earlier record.
    ///
    /// # Errors
    ///
    /// [`ProfileError::BadSeconds`] when `buffer_wait_seconds` is negative or not finite; the
    /// profile is then left as it was.
    pub fn set_engine(&mut self, engine: EngineSummary) -> Result<(), ProfileError> {
        check_seconds(
            || "engine".to_string(),
            "buffer_wait_seconds",
            engine.buffer_wait_seconds,
        )?;
        self.engine = Some(engine);
        Ok(())
    }

    /// The readings `release()` takes; replaces earlier ones.
    pub fn set_memory_points(&mut self, points: Vec<MemoryPoint>) {
        self.memory = points;
    }

    /// Block runs pass by pass, the open pass last (when it has any).
    pub fn runs(&self) -> impl Iterator<Item = &[BlockRun]> {
        self.passes
            .iter()
            .map(Vec::as_slice)
            .chain((!self.current.is_empty()).then_some(self.current.as_slice()))
    }

    /// Every copy recorded, in the order they were recorded, over all passes.
    pub fn copies(&self) -> &[CopyRun] {
        &self.copies
    }

    /// The load's record, if [`set_load`](Self::set_load) was called.
    pub fn load(&self) -> Option<&LoadSummary> {
        self.load.as_ref()
    }

    /// The engine's counters, if [`set_engine`](Self::set_engine) was called.
    pub fn engine(&self) -> Option<&EngineSummary> {
        self.engine.as_ref()
    }

    /// The memory readings last set, in the order they were taken.
    pub fn memory_points(&self) -> &[MemoryPoint] {
        &self.memory
    }

    /// Statistics of every pass, the open one included.
    pub fn passes(&self) -> Vec<PassStats> {
        self.runs()
            .enumerate()
            .map(|(index, runs)| PassStats::from_runs(index, runs))
            .collect()
    }

    fn check_span(
        &self,
        block: usize,
        what: &'static str,
        start: f64,
        end: f64,
    ) -> Result<(), ProfileError> {
        let Some(name) = self.names.get(block) else {
            return Err(ProfileError::UnknownBlock {
                block,
                blocks: self.names.len(),
            });
        };
        let label = || format!("block {block} ({name}) {what}");
        // Times on a monotonic clock may be negative (an arbitrary origin), but never NaN or inf.
        for (field, value) in [("start", start), ("end", end)] {
            if !value.is_finite() {
                return Err(ProfileError::BadSeconds {
                    what: label(),
                    field,
                    value,
                });
            }
        }
        if end < start {
            return Err(ProfileError::EndBeforeStart {
                block,
                name: name.clone(),
                what,
                start,
                end,
            });
        }
        Ok(())
    }
}

fn check_seconds(
    what: impl Fn() -> String,
    field: &'static str,
    value: f64,
) -> Result<(), ProfileError> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(ProfileError::BadSeconds {
            what: what(),
            field,
            value,
        })
    }
}

#[cfg(test)]
mod tests;
