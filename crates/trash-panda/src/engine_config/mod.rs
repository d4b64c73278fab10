//! The one place that turns a plan into every figure the runtime holds: the staging pool (how
//! many buffers, how large), the device slots, the expansion buffer, the alignment of staged
//! tensors, the dtypes and the disk read mode.
//!
//! The planner computes its budgets with [`Held::new`] and [`block_figures`], and the runtime
//! sizes what it allocates from [`EngineConfig::from_plan`], which reads the same figures back:
//! a plan and the process it describes agree by construction, not by a second calculation.

mod block;
mod settings;

use serde::{Deserialize, Serialize};

pub use block::{
    block_figures, expansion_layout, needs_expansion, paired_scale, scale_layout, staged_work,
    BlockFigures, ByTier, ExpansionInput, ScaleSource, TensorWork,
};
pub use settings::{DiskModeChoice, EngineSettings};

use crate::config::ConfigError;
use crate::io::{ReadMode, ReadOptions};
use crate::plan::{BlockPlan, Budgets, Plan, PlanOptions, Tier};
use crate::stream::{
    buffer_len, tensor_in_place_eligible, EngineOptions, RamSource, DEVICE_TENSOR_ALIGN, MAP_GRAIN,
    TENSOR_ALIGN,
};
use crate::DType;

/// The offset alignment of staged and expanded tensors: the CPU allocator's, or the CUDA
/// caching allocator's when a GPU computes.
pub const fn tensor_align(gpu: bool) -> usize {
    if gpu {
        DEVICE_TENSOR_ALIGN
    } else {
        TENSOR_ALIGN
    }
}

/// Whether disk-tier blocks are used in place from maps of the checkpoint (where
/// [`crate::stream::in_place_eligible`] allows): on the CPU, on Linux, whose `MADV_DONTNEED`
/// hands a block's pages back as soon as it has run. A GPU copies every block anyway, and
/// elsewhere a map's pages would stay in the process until the system trims them.
pub const fn maps_disk_tier(gpu: bool) -> bool {
    !gpu && cfg!(target_os = "linux")
}

/// Whether a tensor that the model only reads by rows (an embedding table) stays in a private
/// map of the checkpoint instead of being read into memory: a pass then brings in the pages of
/// the rows it looks up and no others, and the rest of the table costs no RAM. Where the disk
/// tier is used in place ([`maps_disk_tier`]), for a tensor that could be
/// ([`crate::stream::tensor_in_place_eligible`]: the same results as from its own memory, should
/// the model also multiply by it). The plan still counts the whole table as resident.
pub fn maps_lookup_table(gpu: bool, dtype: DType, start: u64) -> bool {
    maps_disk_tier(gpu) && tensor_in_place_eligible(dtype, start, tensor_align(gpu))
}

/// What the runtime holds beside the weights, as a plan counts it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    /// Host staging buffers (pinned on CUDA) when a block streams, else 0: the plan's
    /// `staging_buffers` option (`TRASH_PANDA_PINNED_BUFFERS`), by default `lookahead + 1`.
    pub staging_buffers: usize,
    /// Bytes of each: the largest streamed block's staged bytes in its tier (tensors at aligned
    /// offsets, the disk tier's read area included), rounded up to whole pages.
    pub staging_buffer_bytes: u64,
    /// Device slots a staged block is copied into: one per staging buffer on a GPU, none on the
    /// CPU (the CPU computes from the staging buffers themselves).
    pub device_slots: usize,
    /// The expansion buffer: the largest expansion any hooked block needs in its tier.
    pub expansion_bytes: u64,
    /// The checkpoint pages the process maps for disk-tier blocks used in place: the largest
    /// such block's, runs rounded out to [`MAP_GRAIN`], and one [`MAP_GRAIN`] per look-ahead
    /// block being read in (0 when none is used in place).
    #[serde(default)]
    pub mapped_window_bytes: u64,
}

impl Held {
    /// The figures for a largest streamed block of `largest_staged` bytes (`None`: nothing
    /// streams), a largest expansion of `expansion` bytes and `buffers` staging buffers
    /// ([`PlanOptions::buffers`]; at least one is kept when a block streams).
    pub fn new(largest_staged: Option<u64>, expansion: u64, buffers: usize, gpu: bool) -> Held {
        let buffers = largest_staged.map_or(0, |_| buffers.max(1));
        Held {
            staging_buffers: buffers,
            staging_buffer_bytes: largest_staged.map_or(0, |b| buffer_len(b as usize) as u64),
            device_slots: if gpu { buffers } else { 0 },
            expansion_bytes: expansion,
            mapped_window_bytes: 0,
        }
    }

    /// The same figures with the mapped window of a plan whose largest block used in place maps
    /// `largest_mapped` bytes: that block, and one huge page for each of the `lookahead` blocks
    /// the workers bring into the page cache meanwhile (a chunk at a time, each unmapped at once).
    pub fn with_mapped_window(self, largest_mapped: u64, lookahead: usize) -> Held {
        let ahead = if largest_mapped > 0 {
            lookahead as u64 * MAP_GRAIN
        } else {
            0
        };
        Held {
            mapped_window_bytes: largest_mapped + ahead,
            ..self
        }
    }

    /// The figures for `blocks` in their tiers.
    pub fn for_blocks(blocks: &[BlockPlan], options: &PlanOptions, gpu: bool) -> Held {
        let largest = blocks
            .iter()
            .filter(|b| b.tier != Tier::Device)
            .map(|b| b.staging.get(b.tier))
            .max();
        let expansion = blocks
            .iter()
            .map(|b| b.expansion.get(b.tier))
            .max()
            .unwrap_or(0);
        let mapped = blocks
            .iter()
            .filter(|b| b.tier == Tier::Disk)
            .map(|b| b.mapped)
            .max()
            .unwrap_or(0);
        Held::new(largest, expansion, options.buffers(), gpu)
            .with_mapped_window(mapped, options.lookahead)
    }

    /// Bytes of the host staging pool.
    pub fn host_staging(&self) -> u64 {
        self.staging_buffers as u64 * self.staging_buffer_bytes
    }

    /// Host RAM the streaming takes beside the weights: the staging pool and the mapped window.
    pub fn host_ram(&self) -> u64 {
        self.host_staging() + self.mapped_window_bytes
    }

    /// Bytes of the device slots.
    pub fn device_slot_bytes(&self) -> u64 {
        self.device_slots as u64 * self.staging_buffer_bytes
    }
}

/// Errors of the engine configuration.
#[derive(Debug, thiserror::Error)]
pub enum EngineConfigError {
    #[error("the plan has not been matched against a model, so it has no sizes: resolve it first")]
    Unresolved,
    #[error(transparent)]
    Setting(#[from] ConfigError),
}

/// Every figure the runtime of one model holds, derived from its plan and the settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EngineConfig {
    /// Whether a GPU computes (device slots, 512-byte alignment).
    pub gpu: bool,
    pub compute_dtype: DType,
    pub storage_dtype: Option<DType>,
    pub lookahead: usize,
    /// Offset alignment of staged tensors and of tensors in the expansion buffer.
    pub align: usize,
    #[serde(flatten)]
    pub held: Held,
    /// How the disk tier is read, and why.
    pub disk_mode: ReadMode,
    pub disk_mode_reason: String,
    pub workers: usize,
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
        Ok(EngineConfig {
            gpu: budgets.gpu,
            compute_dtype: plan.compute_dtype(),
            storage_dtype: options.storage_dtype,
            lookahead: options.lookahead,
            align: tensor_align(budgets.gpu),
            held: budgets.held(),
            disk_mode,
            disk_mode_reason,
            workers: settings.workers.max(1),
            ram_source: match (settings.ram_in_memory, options.storage_dtype) {
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
            workers: self.workers,
            disk_mode: self.disk_mode,
            ram_source: self.ram_source,
            align: self.align,
            buffer_len: Some(self.held.staging_buffer_bytes as usize),
            direct_ram: self.gpu && self.pin_ram_tier,
            buffers: Some(self.held.staging_buffers),
            in_place: maps_disk_tier(self.gpu),
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
