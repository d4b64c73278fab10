//! What a plan warns about. Each warning is typed (for the binding and tests) and carries the
//! message a person reads.

use serde::{Deserialize, Serialize};

use super::budget::Budgets;
use super::options::Figures;
use super::{Plan, Tier};
use crate::units::format_bytes;

/// What a warning is about, with its figures (bytes unless said otherwise). In JSON the variant
/// is the `kind` field, in snake case, beside the figures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WarningKind {
    /// Not even the smallest block fits in the device budget.
    NothingFitsOnDevice {
        /// What resident blocks may take on the device.
        device_budget: u64,
        /// The smallest block's bytes once loaded in the storage dtype.
        smallest_block: u64,
    },
    /// The device tier is larger than its budget (forced `resident_blocks` or an edit).
    DeviceOverBudget {
        /// Bytes the device tier takes.
        used: u64,
        /// Bytes it may take.
        budget: u64,
    },
    /// Blocks that did not fit in RAM are read from disk every pass.
    SpillsToDisk {
        /// How many blocks are in the disk tier.
        blocks: usize,
        /// Their bytes in the checkpoint.
        bytes: u64,
    },
    /// The RAM tier is larger than its budget (an edit).
    RamOverBudget {
        /// Bytes the RAM tier takes.
        used: u64,
        /// Bytes it may take.
        budget: u64,
    },
    /// A cgroup limit below the machine's RAM decides what the process may use.
    CgroupBelowRam {
        /// The cgroup's memory limit.
        limit: u64,
        /// The machine's RAM.
        total_ram: u64,
    },
    /// Streaming this block (one slot plus its expansion) needs more than the device has left
    /// after the CUDA floor, the reserve and the outside weights: running the model will fail.
    BlockLargerThanDevice {
        /// The block's name.
        block: String,
        /// What it needs on the device: its slot plus its expansion.
        needed: u64,
        /// What the device has left for it.
        available: u64,
    },
    /// An 8-bit storage dtype quantizes weights on load: the model no longer computes with the
    /// checkpoint's values.
    LossyStorage {
        /// The storage dtype (`fp8_e4m3fn`, `i8` or `q8_0`).
        storage: crate::DType,
        /// Blocks whose weights it quantizes (those held in memory: resident and RAM tier).
        blocks: usize,
        /// Bytes it saves over the checkpoint's, in those blocks.
        saved: u64,
    },
    /// The activation reserve is the default guess, not a measurement.
    HeadroomNotMeasured {
        /// The reserve used (`headroom_vram`).
        headroom: u64,
    },
    /// Windows figures: the plan leaves less GPU memory free than the activation reserve, and
    /// the driver spills what does not fit into shared system memory instead of failing.
    SharedGpuMemory {
        /// GPU memory the plan leaves free.
        free: u64,
        /// The activation reserve.
        headroom: u64,
    },
}

/// One warning of a plan: its kind and figures, and the sentence a person reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Warning {
    /// What it is about; flattened into the warning's JSON object.
    #[serde(flatten)]
    pub kind: WarningKind,
    /// The message, made from `kind` when the warning is made.
    pub message: String,
}

impl Warning {
    /// The warning of a plan that computes on a GPU (`gpu`) or on the CPU, where the device
    /// tier is resident blocks in RAM: the sentence names the memory at stake.
    fn new(kind: WarningKind, gpu: bool) -> Warning {
        let message = message(&kind, gpu);
        Warning { kind, message }
    }
}

fn message(kind: &WarningKind, gpu: bool) -> String {
    use WarningKind::*;
    let b = |x: &u64| format_bytes(*x);
    match kind {
        NothingFitsOnDevice {
            device_budget,
            smallest_block,
        } => format!(
            "nothing fits on the device: the budget for resident blocks is {} and the smallest \
             block takes {}; every block is streamed",
            b(device_budget),
            b(smallest_block)
        ),
        DeviceOverBudget { used, budget } if gpu => format!(
            "the device tier takes {} but its budget is {}: the GPU may run out of memory or \
             spill into shared memory; lower resident_blocks",
            b(used),
            b(budget)
        ),
        DeviceOverBudget { used, budget } => format!(
            "the resident blocks take {} of RAM but their budget is {}: the system may swap or \
             kill the process; lower resident_blocks",
            b(used),
            b(budget)
        ),
        SpillsToDisk { blocks, bytes } => format!(
            "{blocks} block(s) ({}) do not fit in RAM and are read from disk every pass",
            b(bytes)
        ),
        RamOverBudget { used, budget } => format!(
            "the RAM tier takes {} but its budget is {}: the system may swap or kill the process",
            b(used),
            b(budget)
        ),
        CgroupBelowRam { limit, total_ram } => format!(
            "the process's cgroup limits memory to {}, below the machine's {} of RAM; the plan \
             uses the cgroup limit",
            b(limit),
            b(total_ram)
        ),
        BlockLargerThanDevice {
            block,
            needed,
            available,
        } if gpu => format!(
            "block {block} needs {} on the device to run (stored copy plus expansion) but only {} \
             is left after the CUDA floor, the reserve and the outside weights",
            b(needed),
            b(available)
        ),
        BlockLargerThanDevice {
            block,
            needed,
            available,
        } => format!(
            "block {block} needs {} of RAM to run (resident copy plus expansion) but only {} is \
             left for blocks after the reserve and the outside weights",
            b(needed),
            b(available)
        ),
        SharedGpuMemory { free, headroom } => format!(
            "the plan leaves {} of GPU memory free, less than the {} kept for activations: on \
             Windows the driver then spills into shared system memory and every step runs \
             several times slower, with no error; lower resident_blocks, or set \"CUDA - Sysmem \
             Fallback Policy\" to \"Prefer No Sysmem Fallback\" in the NVIDIA Control Panel so it \
             fails loudly",
            b(free),
            b(headroom)
        ),
        LossyStorage {
            storage,
            blocks,
            saved,
        } => format!(
            "storage_dtype={storage} quantizes the large weights of {blocks} block(s) on load \
             ({} smaller): lossy, the outputs are close to the checkpoint's but not equal",
            b(saved)
        ),
        HeadroomNotMeasured { headroom } => format!(
            "activation memory not measured: keeping the default headroom_vram of {}; measure \
             it with measure_activation_vram() and pass activation_vram=",
            b(headroom)
        ),
    }
}

/// What the plan leaves free on the GPU, when that is less than the activation reserve: the free
/// VRAM (not `max_vram`, which only caps the plan) minus everything the plan puts there.
fn shared_memory_shortfall(free_vram: u64, budgets: &Budgets) -> Option<u64> {
    let taken = budgets.cuda_floor
        + budgets.device_used
        + budgets.device_slot_bytes
        + budgets.expansion
        + budgets.outside;
    let free = free_vram.saturating_sub(taken);
    (free < budgets.reserve).then_some(free)
}

pub(crate) fn collect(plan: &Plan, budgets: &Budgets, figures: &Figures) -> Vec<Warning> {
    let mut out = Vec::new();
    let blocks = &plan.blocks;
    let resident = blocks.iter().filter(|b| b.tier == Tier::Device).count();
    if let Some(smallest) = blocks.iter().map(|b| b.storage_bytes).min() {
        if resident == 0 && smallest > budgets.device_budget {
            out.push(Warning::new(
                WarningKind::NothingFitsOnDevice {
                    device_budget: budgets.device_budget,
                    smallest_block: smallest,
                },
                budgets.gpu,
            ));
        }
    }
    if budgets.device_used > budgets.device_budget {
        out.push(Warning::new(
            WarningKind::DeviceOverBudget {
                used: budgets.device_used,
                budget: budgets.device_budget,
            },
            budgets.gpu,
        ));
    }
    let on_disk = blocks.iter().filter(|b| b.tier == Tier::Disk).count();
    if on_disk > 0 {
        out.push(Warning::new(
            WarningKind::SpillsToDisk {
                blocks: on_disk,
                bytes: budgets.disk_bytes,
            },
            budgets.gpu,
        ));
    }
    if budgets.ram_used > budgets.ram_budget {
        out.push(Warning::new(
            WarningKind::RamOverBudget {
                used: budgets.ram_used,
                budget: budgets.ram_budget,
            },
            budgets.gpu,
        ));
    }
    let memory = &figures.memory;
    if let Some(cg) = memory.cgroup.as_ref().filter(|_| memory.cgroup_below_ram()) {
        out.push(Warning::new(
            WarningKind::CgroupBelowRam {
                limit: cg.limit,
                total_ram: memory.total_ram,
            },
            budgets.gpu,
        ));
    }
    let available = budgets
        .device_limit
        .saturating_sub(budgets.cuda_floor)
        .saturating_sub(budgets.reserve)
        .saturating_sub(budgets.outside);
    // On a GPU a streamed block needs one device slot besides its expansion; on the CPU the
    // expansion reads straight from the staging buffer, counted in RAM.
    let slot = u64::from(budgets.gpu);
    let worst = blocks
        .iter()
        .map(|b| {
            let copy = if b.tier == Tier::Device {
                b.storage_bytes
            } else {
                b.file_bytes * slot
            };
            (copy + b.expanded_bytes, b)
        })
        // The first of equals: reversed, max_by_key keeps the last maximum it sees.
        .rev()
        .max_by_key(|(needed, _)| *needed);
    if let Some((needed, block)) = worst.filter(|(needed, _)| *needed > available) {
        out.push(Warning::new(
            WarningKind::BlockLargerThanDevice {
                block: block.name.clone(),
                needed,
                available,
            },
            budgets.gpu,
        ));
    }
    if let Some(free) = figures
        .free_vram
        .and_then(|free_vram| shared_memory_shortfall(free_vram, budgets))
        // NVIDIA's Windows driver moves what does not fit into shared system memory instead
        // of failing; elsewhere a full GPU fails to allocate, which DeviceOverBudget covers.
        .filter(|_| figures.memory.is_windows())
    {
        out.push(Warning::new(
            WarningKind::SharedGpuMemory {
                free,
                headroom: budgets.reserve,
            },
            budgets.gpu,
        ));
    }
    if let Some(storage) = plan
        .options
        .storage_dtype
        .filter(|d| d.is_fp8() || matches!(d, crate::DType::I8 | crate::DType::Q8_0))
    {
        let held = || {
            blocks
                .iter()
                .filter(|b| b.tier != Tier::Disk && b.storage_bytes < b.file_bytes)
        };
        let quantized = held().count();
        if quantized > 0 {
            out.push(Warning::new(
                WarningKind::LossyStorage {
                    storage,
                    blocks: quantized,
                    saved: held().map(|b| b.file_bytes - b.storage_bytes).sum(),
                },
                budgets.gpu,
            ));
        }
    }
    if budgets.gpu && !budgets.reserve_measured {
        out.push(Warning::new(
            WarningKind::HeadroomNotMeasured {
                headroom: budgets.reserve,
            },
            budgets.gpu,
        ));
    }
    out
}
