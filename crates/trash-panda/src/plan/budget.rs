//! Sizes in each form and the device and RAM budgets.
//!
//! Forms of a tensor:
//! - file: as stored in the checkpoint. Disk-tier blocks are read in this form every pass, so
//!   they are counted in it, and the staging pool is sized from it (it is allocated before any
//!   block is read, and the largest streamed block may be on disk).
//! - storage: what a loaded (device or RAM tier) tensor takes with `storage_dtype`. `bf16`
//!   counts float tensors wider than 2 bytes at 2 bytes; `fp8` counts float 2-D weights of at
//!   least [`FP8_MIN_ELEMENTS`](crate::rules::FP8_MIN_ELEMENTS) elements at 1 byte plus one f32
//!   scale per row, and leaves smaller tensors (norms, biases) alone. Scale tensors and fp8 tensors keep their size.
//! - expanded: the block ready to run: float tensors in the compute dtype, scale tensors gone,
//!   integer tensors as they are.
//! - staged and expansion (see [`crate::rules::block_figures`]): what the runtime holds for a
//!   streamed or hooked block: its staging-buffer bytes, and the part of it that is expanded
//!   rather than used in place.

use serde::{Deserialize, Serialize};

use super::options::{ComputeDevice, Figures, PlanOptions};
use super::{BlockPlan, ModelBlocks, OutsidePlan};
use crate::rules::{
    block_figures, buffer_len, maps_disk_tier, maps_ram_tier, patched_image_bytes,
    storage_conversion, tensor_align, Conversion, Held, SharedStaging, TensorSizes, Tier,
};
use crate::DType;

/// Device memory a plan for a GPU leaves to what lives outside torch's caching allocator, so no
/// budget counts it otherwise: the CUDA context (about 300 MB with CUDA's lazy module loading, the
/// default since CUDA 12.2, and 670 MB without it, by the figures in pytorch/pytorch#86509; a
/// free VRAM taken from NVML, as the command line does, still includes it, torch's
/// `mem_get_info` no longer does), the kernels loaded lazily during the first passes (torch's own,
/// cuBLAS and cuBLASLt's) and those libraries' handles. 1 GB covers both ways of measuring free
/// VRAM with room for the kernels; `scripts/gpu-check.sh` compares it with what a pass leaves
/// outside torch on the GPU it runs on. Counted only when a GPU computes: a CPU process that
/// plans a device tier as a GPU's has no CUDA runtime.
pub const CUDA_CONTEXT_FLOOR: u64 = 1_000_000_000;

pub(crate) fn storage_bytes(t: &TensorSizes, storage: Option<DType>) -> u64 {
    match storage.map(|target| (target, storage_conversion(t, target))) {
        None | Some((_, Conversion::Keep)) => t.file_bytes,
        Some((_, Conversion::ToFp8 { rows, .. } | Conversion::ToInt8 { rows, .. })) => {
            t.numel() + rows as u64 * 4
        }
        Some((_, Conversion::ToQ8_0)) => t.numel() / 32 * 34,
        Some((target, Conversion::ToBf16)) => t.numel() * target.size() as u64,
    }
}

pub(crate) fn expanded_bytes(t: &TensorSizes, compute: DType) -> u64 {
    if t.is_scale() {
        0
    } else if t.dtype.is_float() || t.dtype.is_block() {
        t.numel() * compute.size() as u64
    } else {
        t.file_bytes
    }
}

pub(crate) fn block_plan(
    name: &str,
    tensors: &[TensorSizes],
    options: &PlanOptions,
    gpu: bool,
) -> BlockPlan {
    let sum = |f: &dyn Fn(&TensorSizes) -> u64| tensors.iter().map(f).sum::<u64>();
    let file_bytes = sum(&|t| t.file_bytes);
    let compute = options.compute();
    let figures = block_figures(
        name,
        tensors,
        compute,
        options.storage_dtype,
        tensor_align(gpu),
        maps_disk_tier(gpu),
        maps_ram_tier(gpu, options.ram_in_memory, options.storage_dtype),
    );
    BlockPlan {
        name: name.to_string(),
        tier: Tier::Device,
        stored_bytes: file_bytes,
        file_bytes,
        storage_bytes: sum(&|t| storage_bytes(t, options.storage_dtype)),
        expanded_bytes: sum(&|t| expanded_bytes(t, compute)),
        staging: figures.staging,
        expansion: figures.expansion,
        mapped: figures.mapped,
        tensors: tensors.len(),
        // A module of the block (or the block itself) has a merge.
        merged: options
            .merged_modules
            .iter()
            .any(|m| format!("{m}.").starts_with(name)),
        image: figures.image,
        ram_in_place: figures.ram_in_place,
        ggml: tensors.iter().any(|t| {
            t.dtype.is_block()
                || options
                    .storage_dtype
                    .is_some_and(|s| storage_conversion(t, s) == Conversion::ToQ8_0)
        }),
    }
}

pub(crate) fn outside_plan(model: &ModelBlocks, options: &PlanOptions) -> OutsidePlan {
    let tensors = &model.outside;
    OutsidePlan {
        tensors: tensors.len(),
        file_bytes: tensors.iter().map(|t| t.file_bytes).sum(),
        expanded_bytes: tensors
            .iter()
            .map(|t| expanded_bytes(t, options.compute()))
            .sum(),
        names: tensors.iter().take(4).map(|t| t.name.clone()).collect(),
        merge_work: merge_work(model, options),
    }
}

/// What a merge takes while it is made (see [`OutsidePlan::merge_work`]): twice the largest
/// weight of a merged module, in the compute dtype; 0 without merges.
fn merge_work(model: &ModelBlocks, options: &PlanOptions) -> u64 {
    if options.merged_modules.is_empty() {
        return 0;
    }
    let merged = |name: &str| {
        options.merged_modules.iter().any(|m| {
            name.strip_prefix(m.as_str())
                .is_some_and(|rest| rest.starts_with('.'))
        })
    };
    let every = model
        .blocks
        .iter()
        .flat_map(|b| &b.tensors)
        .chain(&model.outside);
    every
        .filter(|t| !t.is_scale() && merged(&t.name))
        .map(|t| 2 * expanded_bytes(t, options.compute()))
        .max()
        .unwrap_or(0)
}

/// The budgets of a plan, all in bytes.
///
/// With a GPU: `device_budget = device_limit - cuda_floor - reserve - device_slot_bytes -
/// expansion - outside`, where `device_limit = min(free_vram, max_vram)`, `cuda_floor` is
/// [`CUDA_CONTEXT_FLOOR`] and `reserve` is `activation_vram` or else `headroom_vram`.
/// `ram_budget = usable_ram - min_free_ram - host_staging`.
///
/// Without a GPU the CPU is the device and RAM is its memory: there is no VRAM headroom (the
/// activations come out of `min_free_ram` unless `activation_vram` is given), no device slots,
/// and the device tier and RAM tier share one pool: `device_limit` is the RAM budget (capped by
/// `max_vram` if given) and `ram_budget` is what the device tier leaves.
///
/// The figures of what the runtime holds beside the weights (`staging_buffers`,
/// `staging_buffer_bytes`, `device_slots`, `expansion`) are [`Held`]'s, the same the engine
/// configuration reads back: see docs/plan-format.md.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budgets {
    /// True when the device is a GPU.
    pub gpu: bool,
    /// The device memory the plan may use: `min(free_vram, max_vram)` with a GPU; on the CPU,
    /// the RAM pool (capped by `max_vram` if given).
    pub device_limit: u64,
    /// `activation_vram` if given, else `headroom_vram` (0 on the CPU).
    pub reserve: u64,
    /// True when `reserve` is `activation_vram` (given by the caller), false when it is the
    /// `headroom_vram` guess.
    pub reserve_measured: bool,
    /// [`CUDA_CONTEXT_FLOOR`] when a GPU computes, else 0 (absent in older files: 0).
    #[serde(default)]
    pub cuda_floor: u64,
    /// Host staging buffers when a block streams, else 0 (see [`Held::staging_buffers`]).
    pub staging_buffers: usize,
    /// Bytes of each staging buffer (and device slot): the largest streamed block as staged.
    pub staging_buffer_bytes: u64,
    /// `staging_buffers x staging_buffer_bytes` (pinned on CUDA).
    pub host_staging: u64,
    /// Device slots (one per staging buffer on a GPU, 0 on the CPU).
    pub device_slots: usize,
    /// `device_slots x staging_buffer_bytes`.
    pub device_slot_bytes: u64,
    /// The expansion buffer: the largest expansion a hooked block needs.
    pub expansion: u64,
    /// The GGML expansions' device temporaries on a GPU (see `Held::device_scratch_bytes`).
    #[serde(default)]
    pub device_scratch: u64,
    /// The checkpoint pages a disk-tier block used in place maps while it runs (see
    /// [`Held::mapped_window_bytes`]).
    #[serde(default)]
    pub mapped_window: u64,
    /// The staging buffers are the pipeline's shared pool (`PlanOptions::staging_pool`):
    /// `host_staging` counts the pool, which the pipeline holds, not the stage.
    #[serde(default)]
    pub shared_staging: bool,
    /// The pinned ring a loader reads resident weights into on a GPU (see
    /// [`Held::loader_ring_bytes`]), counted in host RAM beside `host_staging`.
    #[serde(default)]
    pub loader_ring: u64,
    /// The outside weights in the compute dtype (on the device; in RAM without a GPU).
    pub outside: u64,
    /// The adapters the model holds beside them ([`PlanOptions::adapter_bytes`]), counted with
    /// them (absent in older files: 0).
    #[serde(default)]
    pub adapters: u64,
    /// What making a merge takes while it is made ([`OutsidePlan::merge_work`]), counted with
    /// the outside weights (absent in older files: 0).
    #[serde(default)]
    pub merge_work: u64,
    /// What resident blocks may take on the device. Negative results clamp to 0.
    pub device_budget: u64,
    /// What the device-tier blocks take, in their stored form.
    pub device_used: u64,
    /// RAM this process could use when the figures were taken (see
    /// [`MemoryFigures::usable_ram`](crate::sys::MemoryFigures::usable_ram)).
    pub usable_ram: u64,
    /// RAM left to the rest of the machine: [`PlanOptions::min_free_ram`] resolved, in bytes.
    pub min_free_ram: u64,
    /// What RAM-tier blocks may take (on the CPU: what the device tier leaves of the pool).
    pub ram_budget: u64,
    /// What the RAM-tier blocks take, in their stored form.
    pub ram_used: u64,
    /// What the disk-tier blocks take in the checkpoint.
    pub disk_bytes: u64,
    /// Private memory of the merged blocks' images ([`BlockPlan::merged`]): staged RAM-tier
    /// blocks keep theirs there (absent in older files: 0).
    #[serde(default)]
    pub merged_memory: u64,
    /// Overlay files of the merged blocks' images: disk-tier blocks, and RAM-tier blocks used in
    /// place (whose file stays in the page cache in place of their pages).
    #[serde(default)]
    pub merged_files: u64,
    /// Of `ram_used`, what the merged blocks' images take beyond the blocks' own bytes (all of
    /// a memory image where the RAM tier is held in memory, only its alignment where the image
    /// takes the place of the block's pages).
    #[serde(default)]
    pub merged_beyond: u64,
}

impl Budgets {
    /// What the runtime holds beside the weights.
    pub fn held(&self) -> Held {
        Held {
            staging_buffers: self.staging_buffers,
            staging_buffer_bytes: self.staging_buffer_bytes,
            device_slots: self.device_slots,
            expansion_bytes: self.expansion,
            mapped_window_bytes: self.mapped_window,
            shared_staging: self.shared_staging,
            loader_ring_bytes: self.loader_ring,
            device_scratch_bytes: self.device_scratch,
        }
    }

    /// Everything the runtime holds beside the weights in the memory the blocks compute in:
    /// with a GPU, the device slots, the expansion buffer and the GGML expansions' scratch; on
    /// the CPU, the host staging pool, the mapped window and the expansion buffer.
    pub fn held_on_device(&self) -> u64 {
        let slots = if self.gpu {
            self.device_slot_bytes + self.device_scratch
        } else {
            self.host_staging + self.mapped_window
        };
        slots + self.expansion
    }
}

/// The budgets for a given assignment of tiers (`blocks[i].tier`).
pub(crate) fn compute(
    blocks: &[BlockPlan],
    outside: &OutsidePlan,
    figures: &Figures,
    options: &PlanOptions,
) -> Budgets {
    let used = |tier| {
        blocks
            .iter()
            .filter(|b| b.tier == tier)
            .map(|b| b.stored_bytes)
            .sum::<u64>()
    };
    let shape = Shape::new(figures, options, outside);
    let held = held_for_blocks(blocks, options, shape.gpu);
    let device_used = used(Tier::Device);
    let merged = merged_images(blocks, options);
    Budgets {
        gpu: shape.gpu,
        device_limit: shape.device_limit(&held),
        reserve: shape.reserve,
        reserve_measured: options.activation_vram.is_some(),
        cuda_floor: shape.floor,
        staging_buffers: held.staging_buffers,
        staging_buffer_bytes: held.staging_buffer_bytes,
        host_staging: held.host_staging(),
        device_slots: held.device_slots,
        device_slot_bytes: held.device_slot_bytes(),
        expansion: held.expansion_bytes,
        device_scratch: held.device_scratch_bytes,
        mapped_window: held.mapped_window_bytes,
        shared_staging: held.shared_staging,
        loader_ring: held.loader_ring_bytes,
        outside: outside.expanded_bytes,
        adapters: options.adapter_bytes,
        merge_work: outside.merge_work,
        device_budget: shape.device_budget(&held),
        device_used,
        usable_ram: figures.memory.usable_ram(),
        min_free_ram: shape.min_free_ram,
        ram_budget: shape.ram_budget(&held, device_used),
        ram_used: used(Tier::Ram) + merged.beyond,
        disk_bytes: used(Tier::Disk),
        merged_memory: merged.memory,
        merged_files: merged.files,
        merged_beyond: merged.beyond,
    }
}

/// What the merged blocks' images take, by tier (see [`Budgets::merged_memory`]).
#[derive(Debug, Default)]
struct MergedImages {
    memory: u64,
    files: u64,
    beyond: u64,
}

/// The merged blocks' images where their blocks live, as the engine keeps them (in host memory
/// or a file with a GPU too: the device copies a block's staging, merged).
fn merged_images(blocks: &[BlockPlan], options: &PlanOptions) -> MergedImages {
    let mut m = MergedImages::default();
    let ram_held = options.ram_in_memory || options.storage_dtype.is_some();
    for b in blocks.iter().filter(|b| b.merged) {
        match b.tier {
            Tier::Ram if b.ram_in_place => {
                let image = patched_image_bytes(b.image.ram, false);
                m.files += image;
                m.beyond += image.saturating_sub(b.stored_bytes);
            }
            Tier::Ram => {
                let image = patched_image_bytes(b.image.ram, true);
                m.memory += image;
                m.beyond += if ram_held {
                    image
                } else {
                    image.saturating_sub(b.stored_bytes)
                };
            }
            Tier::Disk => m.files += patched_image_bytes(b.image.disk, false),
            Tier::Device => {}
        }
    }
    m
}

/// The fixed parts of the budgets; what the runtime holds varies with the assignment.
pub(crate) struct Shape {
    pub gpu: bool,
    pub free_vram: u64,
    pub max_vram: Option<u64>,
    pub reserve: u64,
    /// [`CUDA_CONTEXT_FLOOR`] when a GPU computes, else 0.
    pub floor: u64,
    pub outside: u64,
    pub usable_ram: u64,
    pub min_free_ram: u64,
}

impl Shape {
    pub fn new(figures: &Figures, options: &PlanOptions, outside: &OutsidePlan) -> Shape {
        let gpu = figures.free_vram.is_some();
        let reserve = match (options.activation_vram, gpu) {
            (Some(a), _) => a,
            (None, true) => options.headroom_vram,
            (None, false) => 0,
        };
        Shape {
            gpu,
            free_vram: figures.free_vram.unwrap_or(0),
            max_vram: options.max_vram,
            reserve,
            floor: match figures.device() {
                ComputeDevice::Gpu => CUDA_CONTEXT_FLOOR,
                ComputeDevice::Cpu => 0,
            },
            // The adapters, and a merge while it is made, sit beside the outside weights and
            // take the same memory.
            outside: outside.expanded_bytes + options.adapter_bytes + outside.merge_work,
            usable_ram: figures.memory.usable_ram(),
            min_free_ram: options.min_free_ram.resolve(figures.memory.total_ram),
        }
    }

    /// RAM left after the reserve, the host staging pool and the mapped window.
    fn ram_pool(&self, held: &Held) -> u64 {
        self.usable_ram
            .saturating_sub(self.min_free_ram)
            .saturating_sub(held.host_ram())
    }

    pub fn device_limit(&self, held: &Held) -> u64 {
        let limit = if self.gpu {
            self.free_vram
        } else {
            self.ram_pool(held)
        };
        self.max_vram.map_or(limit, |m| limit.min(m))
    }

    pub fn device_budget(&self, held: &Held) -> u64 {
        self.device_limit(held)
            .saturating_sub(self.floor)
            .saturating_sub(self.reserve)
            .saturating_sub(held.device_slot_bytes())
            .saturating_sub(held.expansion_bytes)
            .saturating_sub(held.device_scratch_bytes)
            .saturating_sub(self.outside)
    }

    pub fn ram_budget(&self, held: &Held, device_used: u64) -> u64 {
        let pool = self.ram_pool(held);
        if self.gpu {
            pool
        } else {
            // One pool: the device tier, the outside weights, the expansion and the
            // activations all live in the same RAM.
            pool.saturating_sub(device_used)
                .saturating_sub(self.reserve)
                .saturating_sub(held.expansion_bytes)
                .saturating_sub(self.outside)
        }
    }
}

/// What the runtime holds for `blocks` in their tiers: the staging pool sized for the largest
/// streamed block, the largest expansion, and the mapped window of the disk tier used in place.
pub(crate) fn held_for_blocks(blocks: &[BlockPlan], options: &PlanOptions, gpu: bool) -> Held {
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
    let ggml = blocks.iter().any(|b| b.ggml);
    let held = Held::new(largest, expansion, options.buffers(), gpu)
        .with_mapped_window(mapped, options.max_depth())
        .with_ggml_scratch(ggml, gpu);
    match options.staging_pool {
        Some(pool) if pool.buffer_bytes >= shared_staging(blocks, options).buffer_bytes => {
            held.in_shared_pool(pool, gpu)
        }
        _ => held,
    }
}

/// The shared staging pool that `blocks` stream from in whichever tiers they are put (the
/// figures a pipeline sizes its pool by): buffers for the deepest staging, each holding the
/// largest block as staged in the RAM or the disk tier, in whole pages.
pub(crate) fn shared_staging(blocks: &[BlockPlan], options: &PlanOptions) -> SharedStaging {
    let largest = blocks
        .iter()
        .map(|b| b.staging.ram.max(b.staging.disk))
        .max()
        .unwrap_or(0);
    SharedStaging {
        buffers: options.buffers(),
        buffer_bytes: buffer_len(largest as usize) as u64,
    }
}
