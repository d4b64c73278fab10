//! The one place that turns a plan into every figure the runtime holds: the staging pool (how
//! many buffers, how large), the device slots, the expansion buffer, the alignment of staged
//! tensors, the dtypes and the disk read mode.
//!
//! The planner computes its budgets with [`Held::new`](crate::rules::Held::new) and
//! [`block_figures`](crate::rules::block_figures), by the rules of [`crate::rules`], and the
//! runtime sizes what it allocates from [`EngineConfig::from_plan`], which reads the same figures
//! back: a plan and the process it describes agree by construction, not by a second calculation.
//! This module sits above `plan` and `stream` and only turns a plan into the engine's
//! configuration.

mod block;
mod choices;
mod expand;

use serde::Serialize;

pub use block::{
    leased_scale, scale_layout, staged_work, ScaleReadError, ScaleSource, ScaleValues, TensorWork,
};
pub use choices::{DiskModeChoice, EngineSettings};
pub use expand::{ExpandError, ExpandStep, ExpandTarget, Expansion};

use crate::io::{ReadMode, ReadOptions};
use crate::plan::{Budgets, Plan, Tier};
use crate::rules::{maps_disk_tier, maps_ram_tier, tensor_align, Held};
use crate::settings::SettingsError;
use crate::stream::{EngineOptions, RamSource};
use crate::DType;

/// Errors of the engine configuration.
#[derive(Debug, thiserror::Error)]
pub enum EngineConfigError {
    /// The plan has no budgets: a manual plan not yet resolved for a model.
    ///
    /// What to do: a manual plan is matched against its model before it runs: pass it to
    /// `stream_load()` or `stage()` with the model, or make the plan with `plan(model,
    /// checkpoint)`.
    #[error("the plan has not been matched against a model, so it has no sizes: resolve it first")]
    Unresolved,
    /// A `TRASH_PANDA_*` setting the configuration reads has a bad value.
    #[error(transparent)]
    Setting(#[from] SettingsError),
    /// `TRASH_PANDA_RAM_IN_MEMORY` asks for a RAM tier read into memory, whose blocks are staged
    /// each run, but the plan was made for one mapped from the checkpoint, whose blocks run in
    /// place: it counted no staging buffers for them.
    ///
    /// What to do: make the plan with the setting in place (`plan()` and `stage()` read it), or
    /// unset it.
    #[error(
        "TRASH_PANDA_RAM_IN_MEMORY=1 asks to read the RAM tier into memory, but the plan was made \
         for a RAM tier mapped from the checkpoint ({blocks} RAM-tier block(s) run in place and \
         the plan counted no staging for them): make the plan again with the setting in place, \
         or unset it"
    )]
    RamTierPlannedMapped {
        /// The plan's RAM-tier blocks.
        blocks: usize,
    },
}

/// Every figure the runtime of one model holds, derived from its plan and the settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EngineConfig {
    /// Whether a GPU computes (device slots, 512-byte alignment).
    pub gpu: bool,
    /// The dtype blocks compute in, as the plan chose it.
    pub compute_dtype: DType,
    /// The dtype weights are converted to on load; `None`: kept as stored.
    pub storage_dtype: Option<DType>,
    /// Streamed blocks staged ahead of the one that runs, at the start.
    pub lookahead: usize,
    /// The deepest the staging grows where the compute waits for blocks; the plan counted the
    /// staging buffers for it (see [`crate::rules::max_depth`]).
    pub max_lookahead: usize,
    /// Offset alignment of staged tensors and of tensors in the expansion buffer.
    pub align: usize,
    /// What the runtime holds beside the weights (staging buffers, device slots, expansion
    /// buffer, mapped window), as the plan's budgets counted it; flattened in JSON.
    #[serde(flatten)]
    pub held: Held,
    /// How the disk tier is read, and why.
    pub disk_mode: ReadMode,
    /// Why the disk tier is read that way, in words for the load report.
    pub disk_mode_reason: String,
    /// Threads that fill staging buffers (`TRASH_PANDA_WORKERS`, at least 1).
    pub workers: usize,
    /// How the RAM tier is held: mapped, or read into private memory (always so with a storage
    /// dtype, which cannot be mapped).
    pub ram_source: RamSource,
    /// On a GPU, a RAM tier in private memory is pinned and copied to the device directly.
    pub pin_ram_tier: bool,
}

impl EngineConfig {
    /// The configuration of the runtime of `plan`.
    pub fn from_plan(
        plan: &Plan,
        settings: &EngineSettings,
    ) -> Result<EngineConfig, EngineConfigError> {
        let budgets = plan.budgets.as_ref().ok_or(EngineConfigError::Unresolved)?;
        let options = &plan.options;
        let (disk_mode, disk_mode_reason) = disk_mode(settings.disk_mode, budgets);
        let ram_in_memory = options.ram_in_memory || settings.ram_in_memory;
        let planned_in_place =
            maps_ram_tier(budgets.gpu, options.ram_in_memory, options.storage_dtype);
        let ram_blocks = plan.blocks.iter().filter(|b| b.tier == Tier::Ram).count();
        if ram_in_memory && planned_in_place && ram_blocks > 0 {
            return Err(EngineConfigError::RamTierPlannedMapped { blocks: ram_blocks });
        }
        Ok(EngineConfig {
            gpu: budgets.gpu,
            compute_dtype: plan.compute_dtype(),
            storage_dtype: options.storage_dtype,
            lookahead: options.lookahead,
            max_lookahead: options.max_depth(),
            align: tensor_align(budgets.gpu),
            held: budgets.held(),
            disk_mode,
            disk_mode_reason,
            workers: settings.workers.max(1),
            ram_source: match (ram_in_memory, options.storage_dtype) {
                (true, _) => RamSource::InMemory {
                    threads: settings.ram_threads.max(1),
                },
                // A converted RAM tier cannot be mapped: the engine reads it into memory with
                // its default readers, and saying so here lets the runtime report them.
                (false, Some(_)) => RamSource::InMemory {
                    threads: ReadOptions::default().threads,
                },
                (false, None) => RamSource::Mapped,
            },
            pin_ram_tier: settings.pin_ram_tier,
        })
    }

    /// The prefetch engine's options: its pool is exactly the plan's host staging.
    pub fn engine_options(&self) -> EngineOptions {
        EngineOptions {
            storage: self.storage_dtype,
            lookahead: self.lookahead,
            max_lookahead: Some(self.max_lookahead),
            workers: self.workers,
            disk_mode: self.disk_mode,
            ram_source: self.ram_source,
            align: self.align,
            buffer_len: Some(self.held.staging_buffer_bytes as usize),
            direct_ram: self.gpu && self.pin_ram_tier,
            buffers: Some(self.held.staging_buffers),
            in_place: maps_disk_tier(self.gpu),
            // The same for a mapped RAM tier, by the rule the plan counted it with: a warm pass
            // on the CPU then copies nothing.
            ram_in_place: maps_ram_tier(
                self.gpu,
                matches!(self.ram_source, RamSource::InMemory { .. }),
                self.storage_dtype,
            ),
            ..EngineOptions::default()
        }
    }
}

/// O_DIRECT unless the disk tier fits in the page cache beside everything the plan puts in RAM
/// (then buffered reads keep it cached across passes); a setting other than `auto` wins.
pub fn disk_mode(choice: DiskModeChoice, budgets: &Budgets) -> (ReadMode, String) {
    let disk = budgets.disk_bytes;
    let gb = |b: u64| b as f64 / 1e9;
    match choice {
        DiskModeChoice::Direct | DiskModeChoice::Buffered if disk > 0 => {
            let mode = choice.mode().unwrap_or(ReadMode::Direct);
            (
                mode,
                format!("{} reads, as TRASH_PANDA_DISK_MODE says", mode.as_str()),
            )
        }
        _ if disk == 0 => (choice.mode().unwrap_or(ReadMode::Direct), String::new()),
        _ => {
            let spare = budgets.ram_budget.saturating_sub(budgets.ram_used);
            if disk <= spare {
                (
                    ReadMode::Buffered,
                    format!(
                        "buffered reads: its {:.2} GB fit in the page cache beside the RAM tier \
                         ({:.2} GB spare)",
                        gb(disk),
                        gb(spare)
                    ),
                )
            } else {
                (
                    ReadMode::Direct,
                    format!(
                        "O_DIRECT reads: its {:.2} GB would not stay in the page cache ({:.2} GB \
                         spare beside the RAM tier), and buffered reads would evict it",
                        gb(disk),
                        gb(spare)
                    ),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests;
